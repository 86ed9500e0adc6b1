"""kombu's Redis and Sentinel transports, with two changes: a message whose ack fails no longer
holds a prefetch slot for ever (Sentinel), and a channel closed after its connection was collected
does not crash the worker (both).

Why (issue 31, the stall after a master freeze): kombu's Redis ``QoS.ack`` removes the message's
unacked record from Redis and only then releases the consumer's prefetch slot (the virtual
``QoS.ack``). When the removal fails (a frozen master: ``TimeoutError`` after the socket
timeout), the slot is never released, and Celery only logs ``Couldn't ack ...``
(``Message.ack_log_error`` swallows connection errors, so the consumer is not restarted and its
channel, with the leaked slots, lives on). Once every slot of the prefetch count has leaked,
``can_consume()`` stays false: the BRPOP is paused and never sent again, the worker sits in
``epoll_wait`` and consumes nothing while its queue grows. A killed master is different: the
BRPOP read fails, the consumer restarts on a new channel and the leak goes with the old one.

Here the slot is released whatever the removal did, and the error still propagates (Celery
logs it as before). The message stays in the unacked hash of the master it was recorded on,
where the visibility-timeout restore finds it, as for any consumer that died before acking.

The crash (seen in a clean-clone CI run, the what-if demo's ``kill_broker``): on a lost broker
Celery 5.7's consumer calls ``connection.collect()`` and then ``connection.close()``. ``collect``
drops the transport's ``client`` (kombu's ``_do_close_transport``); when the channel was not closed
by it (its BRPOP read raised first), ``close`` closes it then, and its restore of unacked messages
builds a Redis pool from ``transport.client``: ``AttributeError: 'NoneType' object has no attribute
'hostname'``, which Celery calls an unrecoverable error, and the worker exits. With no client there is
nothing to restore with: the messages stay in the unacked hash, restored by the visibility timeout.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

logger = logging.getLogger("powerfleet.broker")


class SlotReleasingQoS(kombu_redis.QoS):
    """kombu's Redis QoS whose ack and reject release the prefetch slot even when Redis fails."""

    def ack(self, delivery_tag: str) -> None:
        try:
            self._remove_from_indices(delivery_tag).execute()
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)
            else:
                self._remove_from_indices(delivery_tag).execute()
        finally:
            virtual.QoS.ack(self, delivery_tag)


class ClosesAfterCollect:
    """A Redis channel whose close after ``Connection.collect()`` is quiet (see the module's doc)."""

    connection: Any

    def close(self) -> None:
        try:
            super().close()  # type: ignore[misc]
        except AttributeError:
            if self.connection is None or getattr(self.connection, "client", None) is not None:
                raise  # not the collected-connection case: a real bug, let it show
            logger.warning("broker: a channel closed after its connection was collected; its unacked "
                           "messages are restored by the visibility timeout")


class FleetRedisChannel(ClosesAfterCollect, kombu_redis.Channel):
    pass


class FleetRedisTransport(kombu_redis.Transport):
    """What ``redis://`` broker URLs use (kombu's alias, ``use_fleet_redis_transport``)."""

    Channel = FleetRedisChannel


class FleetSentinelChannel(ClosesAfterCollect, kombu_redis.SentinelChannel):
    QoS = SlotReleasingQoS


class FleetSentinelTransport(kombu_redis.SentinelTransport):
    """What ``sentinel://`` broker URLs use (``broker_transport``, broker/celery_options.py)."""

    Channel = FleetSentinelChannel


REDIS_TRANSPORT = f"{__name__}:FleetRedisTransport"


def use_fleet_redis_transport() -> None:
    """``redis://`` URLs resolve to FleetRedisTransport in this process. By kombu's alias, not by
    ``broker_transport``: a class path there becomes the scheme of ``Connection.as_uri()``, and
    Flower, which picks its broker view by that scheme, answered "'redis' broker is not supported"."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["redis"] = REDIS_TRANSPORT


SENTINEL_TRANSPORT = f"{__name__}:FleetSentinelTransport"
