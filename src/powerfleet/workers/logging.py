"""Log lines an operator can read: a broker outage is one warning per retry, not a traceback."""

from __future__ import annotations

import logging

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


def install_broker_retry_filter() -> None:
    logging.getLogger("celery.worker.consumer.consumer").addFilter(BrokerRetryFilter())
