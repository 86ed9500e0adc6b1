"""A consumer whose ack fails on a frozen master consumes again from the promoted replica
(issue 31: the control worker that logged ``Couldn't ack ... TimeoutError`` and then consumed
nothing for over 6 minutes). broker/transport.py has the cause and the fix.

Real parts: the session's master, replicas and three Sentinels (SIGSTOP on the master), and the
connection a worker gets (``app.connection_for_read()``: the fleet's broker transport and its
options), consumed as a worker does, with a prefetch count of 1 so one failed ack is a whole
prefetch count.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kombu import Consumer, Exchange, Producer, Queue

from powerfleet.broker.celery_options import FAILOVER_HEALTH_CHECK_S, FAILOVER_SOCKET_TIMEOUT_S
from powerfleet.config import load_config
from powerfleet.testing.sentinels import SentinelCluster
from powerfleet.testing.waiting import wait_for
from powerfleet.workers.app import create_app

DB = 9  # this file's database on the shared cluster
BRPOP_TIMEOUT_S = 1  # kombu's Redis channel default, which the fleet keeps


def _publish(app: Any, queue: Queue, body: str) -> None:
    """Publish through a fresh connection (it resolves the current master through the Sentinels)."""
    with app.connection_for_write() as conn:
        Producer(conn.channel()).publish(body, routing_key=queue.routing_key, exchange=queue.exchange,
                                         declare=[queue], retry=True, retry_policy={"max_retries": 3})


def _drain_until(conn: Any, got: list[Any], n: int, deadline_s: float) -> float:
    """Drain events until ``got`` has ``n`` messages; seconds it took (fails past ``deadline_s``)."""
    start = time.monotonic()
    while len(got) < n:
        left = deadline_s - (time.monotonic() - start)
        assert left > 0, f"no message {n} within {deadline_s:.1f}s; received {[m.payload for m in got]}"
        try:
            conn.drain_events(timeout=min(left, 0.5))
        except TimeoutError:
            pass
        except conn.connection_errors:
            time.sleep(0.1)  # a command to the frozen or vanished master; the next drain reconnects
    return time.monotonic() - start


@pytest.mark.timeout(180)
def test_a_consumer_whose_ack_timed_out_on_a_frozen_master_consumes_from_the_new_one(
        sentinels: SentinelCluster) -> None:
    app = create_app(load_config(environ=sentinels.env(DB)))
    queue = Queue("freeze-ack", Exchange("freeze-ack", type="direct"), routing_key="freeze-ack")
    _publish(app, queue, "before")
    got: list[Any] = []
    old = sentinels.master_port()
    conn = app.connection_for_read()
    try:
        consumer = Consumer(conn.channel(), queues=[queue], callbacks=[lambda _b, m: got.append(m)],
                            prefetch_count=1)
        consumer.consume()
        _drain_until(conn, got, 1, 30)
        sentinels.freeze(old)
        try:
            # What Celery's consumer does with an early-acked task: ack, log a connection error.
            with pytest.raises(conn.connection_errors):
                got[0].ack()
            new = sentinels.wait_new_master(old, timeout_s=40)
            promoted = time.monotonic()
            wait_for(lambda: _publish(app, queue, "after") or True, "a publish to the new master", 30, every_s=0.2)
            # The BRPOP the consumer sends next goes to the frozen master's open socket. kombu drops
            # it once its reply is brpop_timeout + health_check overdue, checked every health_check:
            # a new BRPOP reaches the new master within brpop_timeout + 2 * health_check of being
            # sent, plus a socket timeout for the commands between; doubled for a loaded machine.
            bound = 2 * (BRPOP_TIMEOUT_S + 2 * FAILOVER_HEALTH_CHECK_S + FAILOVER_SOCKET_TIMEOUT_S)
            took = _drain_until(conn, got, 2, bound)
            assert got[1].payload == "after", [m.payload for m in got]
            print(f"promoted {new}; consumed again {time.monotonic() - promoted:.1f}s after it ({took:.1f}s drain)")
        finally:
            sentinels.thaw(old)
    finally:
        conn.release()
