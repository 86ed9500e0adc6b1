"""A worker's ack that meets a stopped broker is one WARNING line, not kombu's CRITICAL traceback.

Seen in a loaded full-suite run: test_broker_restart.py's outage test found a Traceback in the
worker's log, kombu's ``Message.ack_log_error`` ("Couldn't ack ..., exc_info=True"), for a tick
received just as the broker stopped. Here a real message is taken from a real redis-server, the
server is SIGKILLed, and the message is acked the way Celery's request acks it.
"""

from __future__ import annotations

import logging

import pytest
from kombu import Connection, Exchange, Queue

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.broker.transport import REDIS_TRANSPORT
from powerfleet.workers.logging import install_broker_retry_filter


def test_an_ack_on_a_dead_broker_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    install_broker_retry_filter()
    logger = logging.getLogger("celery.worker.request")  # the logger Celery's Request acks with
    with EmbeddedRedis() as server:
        conn = Connection(server.url, transport=REDIS_TRANSPORT)
        queue = Queue("control", Exchange("control"), routing_key="control")
        with conn.Producer() as producer:
            producer.publish({"n": 1}, exchange=queue.exchange, routing_key="control", declare=[queue],
                             serializer="json")
        message = queue(conn.default_channel).get(no_ack=False)
        assert message is not None
        server.kill()
        with caplog.at_level(logging.WARNING, logger="celery.worker.request"):
            message.ack_log_error(logger, conn.connection_errors)
        conn.release()
    records = [r for r in caplog.records if r.name == "celery.worker.request"]
    assert len(records) == 1, [r.getMessage() for r in records]
    (rec,) = records
    assert rec.levelno == logging.WARNING and rec.exc_info is None, (rec.levelname, rec.exc_info)
    assert rec.getMessage().startswith("broker: could not ack message ") and "visibility timeout" in rec.getMessage()
    assert "\n" not in rec.getMessage()
