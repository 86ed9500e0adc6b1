"""kombu's Sentinel transport, with one change: a message whose ack fails no longer holds a
prefetch slot for ever.

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
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual


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


class FleetSentinelChannel(kombu_redis.SentinelChannel):
    QoS = SlotReleasingQoS


class FleetSentinelTransport(kombu_redis.SentinelTransport):
    """What ``sentinel://`` broker URLs use (``broker_transport``, broker/celery_options.py)."""

    Channel = FleetSentinelChannel


SENTINEL_TRANSPORT = f"{__name__}:FleetSentinelTransport"
