"""The peer for bench/dispatch.py: a bare Celery app with a no-op task, JSON, Redis broker and backend."""

import os

from celery import Celery

app = Celery("bare", broker=os.environ["BENCH_BROKER_URL"], backend=os.environ["BENCH_BROKER_URL"])
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                task_default_queue="bare", worker_hijack_root_logger=False)


@app.task(name="bare.noop")
def noop() -> None:
    return None
