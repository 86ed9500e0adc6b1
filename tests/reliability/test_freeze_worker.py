"""A real control worker keeps consuming through a master freeze and the Sentinel failover
(issue 31: ``Couldn't ack ... TimeoutError`` on the frozen master, then nothing consumed for
over 6 minutes). test_freeze_ack.py pins the mechanism deterministically at the consumer; this
is the same stall live: a worker (prefork, one process, prefetch 1 as a control+sweep worker
has) draining a backlog of tasks with results when the master is SIGSTOPped. Its process is
busy writing a result to the frozen master while the next message waits in the consumer, so
that message's ack times out; on kombu's own Redis QoS that ack leaked the only prefetch slot.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from powerfleet.broker.celery_options import FAILOVER_HEALTH_CHECK_S, FAILOVER_SOCKET_TIMEOUT_S
from powerfleet.broker.clients import redis_client
from powerfleet.config import load_config
from powerfleet.queues import CONTROL_QUEUE
from powerfleet.testing.sentinels import SentinelCluster
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher

DB = 10  # this file's database on the shared cluster
BACKLOG = 4000
BRPOP_TIMEOUT_S = 1  # kombu's Redis channel default, which the fleet keeps
# From the promotion: the ack in flight and the process's result write each wait out a socket
# timeout on the frozen master; the next BRPOP, sent to the frozen master's open socket, is
# dropped once brpop_timeout + health_check overdue (checked every health_check). Doubled: the
# machine is shared and loaded.
BOUND_S = 2 * (2 * FAILOVER_SOCKET_TIMEOUT_S + BRPOP_TIMEOUT_S + 2 * FAILOVER_HEALTH_CHECK_S)


@pytest.mark.timeout(300)
def test_a_worker_draining_a_backlog_consumes_from_the_new_master_after_a_freeze(
        sentinels: SentinelCluster, tmp_path: Path) -> None:
    env = sentinels.env(DB)
    config = load_config(environ=env)
    app = create_app(config)
    r = redis_client(app.conf.broker_url, config.broker, socket_timeout=2, socket_connect_timeout=2)
    with Launcher(log_dir=tmp_path / "logs") as launcher:
        worker = launcher.spawn("w", "worker", "--queues", f"{CONTROL_QUEUE},sweep", "--name", "freeze@sentinel",
                                "--concurrency", "1", env=env)
        wait_worker(app, "freeze@sentinel", timeout_s=90)
        with app.producer_or_acquire() as producer:
            for _ in range(BACKLOG):
                app.send_task("powerfleet.fleet.noop", kwargs={}, producer=producer)
        wait_for(lambda: r.llen(CONTROL_QUEUE) < BACKLOG - 20, "the worker to start on the backlog", 60, every_s=0.02)
        old, left, log = sentinels.master_port(), -1, ""
        sentinels.freeze(old)
        try:
            # What the new master starts with: its copy of the queue while the master is frozen (no one
            # consumes from a replica). Read after the promotion instead, a loaded test process found the
            # backlog already drained (0 left: 4,000 no-ops take the worker about 4 s), in a loaded run.
            queued = {p: redis.Redis(host="127.0.0.1", port=p, password=sentinels.password, db=DB,
                                     socket_timeout=2).llen(CONTROL_QUEUE)
                      for p in sentinels.redis_ports if p != old}
            new = sentinels.wait_new_master(old, timeout_s=40)
            promoted = time.monotonic()
            left = queued[new]
            assert left > 20, f"the backlog was gone before the freeze ({left} left): nothing to show"
            drained = wait_for(lambda: r.llen(CONTROL_QUEUE) < left - 5, "the worker to consume from the new master",
                               BOUND_S, every_s=0.1)
        except AssertionError as exc:
            log = worker.log.read_text(errors="replace")
            raise AssertionError(f"{exc}; {left} tasks queued at the promotion; the worker's ack failed on the "
                                 f"frozen master: {'Couldn' + chr(39) + 't ack' in log}; log tail:\n{log[-3000:]}")
        finally:
            sentinels.thaw(old)
        assert drained, left
        log = worker.log.read_text(errors="replace")
        print(f"consumed again {time.monotonic() - promoted:.1f}s after the promotion (bound {BOUND_S:.0f}s), "
              f"{left} queued then; ack failed on the frozen master: {'Couldn' + chr(39) + 't ack' in log}")
        marker = app.send_task("powerfleet.fleet.echo", kwargs={"payload": "after"})
        result = marker.get(timeout=120)
        assert result["payload"] == "after", result
        assert launcher.dead_children() == [], [c.name for c in launcher.dead_children()]
