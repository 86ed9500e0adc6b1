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
from typing import Any

import redis
from redis.sentinel import Sentinel

from powerfleet.config.broker_urls import SentinelUrl, is_sentinel, parse_sentinel_url
from powerfleet.config.fleet import BrokerConfig, SentinelConfig

# Sentinels answer from memory: a slow one is as good as a dead one, ask the next.
SENTINEL_TIMEOUT_S = 2.0


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
    return sentinel.master_for(master_name(broker), db=parsed.db, **creds, **options)
