"""Broker URLs: a plain Redis (redis://, rediss://, unix://) or a list of Sentinels.

The Sentinel form is kombu's and Celery's: ``sentinel://[user:password@]host:port[/db]``,
several joined by ``;``. Username, password and db come from the first entry (kombu and
Celery's result backend read them there too); they are the Redis master's, not the
Sentinels' (those are ``broker.sentinel.password``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

PLAIN_SCHEMES = ("redis://", "rediss://", "unix://")
SENTINEL_SCHEME = "sentinel://"
SENTINEL_PORT = 26379


class BrokerUrlError(ValueError):
    """A broker URL that cannot be used; the message is one line, without the password."""


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel(url: str | None) -> bool:
    return url is not None and url.startswith(SENTINEL_SCHEME)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Parse ``sentinel://h:p[;sentinel://h:p...]``; raises BrokerUrlError naming the bad entry."""
    chunks = url.split(";")
    sentinels: list[tuple[str, int]] = []
    first: SentinelUrl | None = None
    for i, chunk in enumerate(chunks):
        where = f"entry {i + 1} of the sentinel list"
        if not chunk.startswith(SENTINEL_SCHEME):
            raise BrokerUrlError(f"{where}: every entry must start with sentinel://")
        try:
            parts = urlsplit(chunk)
            port = parts.port or SENTINEL_PORT
        except ValueError:
            raise BrokerUrlError(f"{where}: the port must be a number from 1 to 65535") from None
        host = parts.hostname
        if not host or any(c.isspace() for c in host) or not 1 <= port <= 65535:
            raise BrokerUrlError(f"{where}: needs a host and a port, as sentinel://host:26379")
        if parts.query or parts.fragment:
            raise BrokerUrlError(f"{where}: query strings are not used; TLS is broker.sentinel.tls")
        path = parts.path.strip("/")
        if path and not (path.isascii() and path.isdigit() and int(path) < 16):
            raise BrokerUrlError(f"{where}: the path must be a database number 0-15, as sentinel://host:26379/0")
        if first is None:
            first = SentinelUrl((), int(path or 0),
                                unquote(parts.username) if parts.username else None,
                                unquote(parts.password) if parts.password is not None else None)
        sentinels.append((host, port))
    assert first is not None  # split always yields one chunk
    return SentinelUrl(tuple(sentinels), first.db, first.username, first.password)


def check_broker_url(url: str) -> str:
    """The URL if it is one the fleet can use; else BrokerUrlError (one line, no password)."""
    if url.startswith(PLAIN_SCHEMES):
        return url
    if is_sentinel(url):
        parse_sentinel_url(url)
        return url
    raise BrokerUrlError("must be a redis://, rediss:// or unix:// URL, or sentinel://host:port URLs joined by ;")


def redact(url: str) -> str:
    """A broker URL (or a ;-list of them) fit for a log line: no password is ever printed."""
    return ";".join(_redact_one(chunk) for chunk in url.split(";"))


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        return "(unparseable URL)" if "@" in url else url
    if password is None:
        return url
    host = parts.hostname or ""
    if port:
        host = f"{host}:{port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
