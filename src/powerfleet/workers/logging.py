"""Log lines an operator can read: a broker outage is one warning per retry, not a traceback."""

from __future__ import annotations

import logging

from powerfleet.broker.outage import first_line

# kombu's reconnect messages, logged by Celery's consumer as multi-line ERRORs.
_RETRY_PREFIXES = ("consumer: Cannot connect to",)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return text[:300]


class BrokerRetryFilter(logging.Filter):
    """Rewrites broker-retry records as one WARNING line; they are expected during an outage."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_RETRY_PREFIXES):
            record.msg = " ".join(record.getMessage().split())
            record.args = ()
            record.exc_info = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# kombu's Message.ack_log_error / reject_log_error: CRITICAL with a traceback, for an ack that met a
# broker connection error (the only errors they catch). A broker stopping between a message's
# receipt and its ack is an outage, not a crash: seen in a loaded run of test_broker_restart.py.
_ACK_PREFIXES = ("Couldn't ack", "Couldn't reject")


class FailedAckFilter(logging.Filter):
    """Rewrites a failed ack or reject (a connection error) as one WARNING line saying what follows."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_ACK_PREFIXES):
            exc = record.exc_info[1] if record.exc_info else None
            why = first_line(exc) if exc is not None else "a connection error"
            verb = "ack" if record.msg.startswith("Couldn't ack") else "reject"
            record.msg = (f"broker: could not {verb} message {record.args[0] if record.args else '?'} ({why}); "
                          "it stays unacknowledged in Redis and is restored after the visibility timeout")
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install_broker_retry_filter() -> None:
    for name, kind in (("celery.worker.consumer.consumer", BrokerRetryFilter), ("celery.worker.request", FailedAckFilter)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):  # once per process
            logger.addFilter(kind())
