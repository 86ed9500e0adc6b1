"""One factory for every direct Redis client of the fleet (presence, tick log, budget state,
retune fan-in and window store, queue depths, status).

With a plain URL it is ``redis.Redis.from_url``. With ``sentinel://`` URLs it is a client whose
pool asks the Sentinels for the current master on every new connection and drops its
connections when the master it talks to has been demoted (redis-py's SentinelConnectionPool),
so after a failover the next command reaches the promoted replica without anyone rebuilding
the client.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.connection import SSLConnection
from redis.sentinel import Sentinel, SentinelManagedConnection

from powerfleet.config.broker_urls import SentinelUrl, is_sentinel, parse_sentinel_url
from powerfleet.config.fleet import BrokerConfig, SentinelConfig

T = TypeVar("T")
# Sentinels answer from memory: a slow one is as good as a dead one, ask the next.
SENTINEL_TIMEOUT_S = 2.0
# How long a Sentinel-managed client retries a command that finds no master (refused, the
# master unreachable, NOREPLICAS): a failover takes a few seconds (promotion at
# down-after-milliseconds plus about 2 s: ~7 s with the chart's 5000). redis-py's default (three
# retries, jittered backoff from 1 s) gave up after a second or two, failing the commands of
# whatever ran through the failover (a retune shard's fan-in write, in the first Sentinel runs).
FAILOVER_RETRY_S = 15.0


class FailoverRetry(Retry):
    """Retry a connection error until ``total_s`` have passed since the call began (pauses 0.2,
    0.4, 0.8 s, then 1 s). A deadline, not a count: redis-py nests a connection's connect retry
    inside the command's, and counts multiplied would wait minutes through a long outage."""

    def __init__(self, total_s: float = FAILOVER_RETRY_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(ExponentialBackoff(cap=1.0, base=0.1), retries=-1)
        self.total_s, self._clock, self._sleep = total_s, clock, sleep

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        deadline = self._clock() + self.total_s
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                fail(error, failures) if with_failure_count else fail(error)
                left = deadline - self._clock()
                if left <= 0:
                    raise error
                self._sleep(min(self._backoff.compute(failures), left))


class FollowingConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that asks the Sentinels for the master whenever it dials.

    redis-py 8 redials a connection dropped inside a command's retry from send_packed_command,
    through the plain connect, to the address it had: after a failover every retry went back to
    the demoted master ("The previous master is now a slave") until the retries ran out, and a
    worker's announcement blocked its consumer for the whole retry time.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()  # SentinelManagedConnection.connect: resolves the master first
        super().send_packed_command(command, check_health)


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    pass


class BrokerConfigError(Exception):
    """The broker cannot be used as configured; the message is one line without secrets."""


class UnknownMaster(BrokerConfigError):
    """The Sentinels answer but none monitors broker.sentinel.master_name: a config error."""


def tls_options(sc: SentinelConfig) -> dict[str, Any]:
    """redis-py connection keywords for TLS to Sentinels and Redis nodes (empty without TLS)."""
    if not sc.tls:
        return {}
    opts: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    if sc.tls_ca_file:
        opts["ssl_ca_certs"] = sc.tls_ca_file
    return opts


def sentinel_kwargs(sc: SentinelConfig, timeout_s: float = SENTINEL_TIMEOUT_S) -> dict[str, Any]:
    """Keywords for the connections to the Sentinels themselves (not to the master)."""
    kw: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, **tls_options(sc)}
    if sc.password:
        kw["password"] = sc.password
    return kw


def master_name(broker: BrokerConfig) -> str:
    name = broker.sentinel.master_name
    if name is None:  # FleetConfig refuses this; a hand-built BrokerConfig might not
        raise BrokerConfigError("a sentinel:// URL needs broker.sentinel.master_name")
    return name


def sentinel_for(url: str, broker: BrokerConfig, timeout_s: float = SENTINEL_TIMEOUT_S) -> tuple[Sentinel, SentinelUrl]:
    parsed = parse_sentinel_url(url)
    master_kw: dict[str, Any] = dict(tls_options(broker.sentinel))
    return Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs(broker.sentinel, timeout_s),
                    **master_kw), parsed


def redis_client(url: str, broker: BrokerConfig, **options: Any) -> redis.Redis:
    """A client on the fleet's Redis at ``url`` (the broker's), following the Sentinel master.

    ``options`` are redis-py connection keywords (socket_timeout, health_check_interval...).
    """
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    sentinel, parsed = sentinel_for(url, broker)
    creds = {k: v for k, v in (("username", parsed.username), ("password", parsed.password)) if v is not None}
    options.setdefault("retry", FailoverRetry())  # a failover is seconds of "no master": wait them out
    options.setdefault("connection_class", FollowingSSLConnection if broker.sentinel.tls else FollowingConnection)
    return sentinel.master_for(master_name(broker), db=parsed.db, **creds, **options)
