"""The peer for bench/dispatch.py: a bare Celery app with a no-op task, JSON, Redis broker and backend."""

import os

from celery import Celery

app = Celery("bare", broker=os.environ["BENCH_BROKER_URL"], backend=os.environ["BENCH_BROKER_URL"])
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                task_default_queue="bare", worker_hijack_root_logger=False)
if os.environ.get("BENCH_BARE_TIME_LIMITS"):
    # The same soft/hard limits the fleet gives control tasks by default: isolates what
    # Celery's time-limit machinery costs from what the fleet's own code costs.
    app.conf.update(task_soft_time_limit=60, task_time_limit=90)


@app.task(name="bare.noop")
def noop() -> None:
    return None
