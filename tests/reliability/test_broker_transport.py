"""The fleet's Redis transport: a channel closed after its connection was collected.

Seen in a clean-clone CI run: the what-if demo's kill_broker hit the control worker while a BRPOP was
in flight; Celery 5.7's consumer ran ``connection.collect()`` (which drops the transport's ``client``)
and then ``connection.close()``, whose channel close restored unacked messages through a pool built from
that client: AttributeError, "Unrecoverable error", the worker exited and the demo stopped. Here the
channel is put in exactly that state (an unacked message, pools gone, ``transport.client`` None) on a
real redis-server and closed.
"""

from __future__ import annotations

import redis
from kombu import Connection, Consumer, Exchange, Queue

from powerfleet.broker.transport import REDIS_TRANSPORT, FleetRedisTransport
from powerfleet.config.loading import load_config
from powerfleet.workers.app import create_app
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


def test_redis_broker_urls_use_the_fleets_transport(broker_url: str) -> None:  # noqa: F811
    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": broker_url}))
    with app.connection() as conn:
        assert isinstance(conn.transport, FleetRedisTransport)
        # the scheme stays redis: Flower picks its broker view by it ("'redis' broker is not supported")
        assert conn.as_uri().startswith("redis://"), conn.as_uri()


def test_a_channel_closed_after_its_connection_was_collected_keeps_its_unacked_message(
        broker_url: str) -> None:  # noqa: F811
    conn = Connection(broker_url, transport=REDIS_TRANSPORT)
    queue = Queue("control", Exchange("control"), routing_key="control")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="control", declare=[queue],
                         serializer="json")
    got: list = []
    channel = conn.default_channel
    Consumer(channel, [queue], callbacks=[lambda body, message: got.append(body)], accept=["json"]).consume()
    conn.drain_events(timeout=10)
    assert got == [{"n": 1}]
    # What collect() leaves when it did not close the channel: pools gone, the transport's client None.
    channel._disconnect_pools()
    conn.transport.client = None
    channel.close()  # kombu's own channel raises AttributeError here ('NoneType' ... 'hostname')
    assert channel.closed
    # Nothing was lost: the message waits in the unacked hash for the visibility-timeout restore.
    assert redis.Redis.from_url(broker_url).hlen("unacked") == 1
