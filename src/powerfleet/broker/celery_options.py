"""The Celery, kombu and RedBeat settings a Sentinel broker needs (none for a plain Redis URL).

kombu's SentinelChannel and Celery's SentinelBackend read ``master_name`` and
``sentinel_kwargs`` from their transport options; TLS is ``broker_use_ssl`` and
``redis_backend_use_ssl``. RedBeat (celery-redbeat 2.4.2, ``redbeat/schedulers.py``) takes
its own form: a URL starting ``redis-sentinel`` plus ``sentinels``/``service_name``/``db``/
``password`` in ``redbeat_redis_options``; it builds a Sentinel and asks it for the master
on every ``get_redis``, so beat follows a failover too.
"""

from __future__ import annotations

import ssl
from typing import Any

from powerfleet.broker.clients import master_name, sentinel_kwargs
from powerfleet.config.broker_urls import is_sentinel, parse_sentinel_url
from powerfleet.config.fleet import BrokerConfig


# A frozen master (SIGSTOP, a hung host) keeps its sockets open and answers nothing: a command
# waits out the socket timeout, and a worker's BRPOP (read by the event loop, with no socket
# timeout) is dropped only once its reply is ``brpop_timeout`` (1 s) + the health-check interval
# overdue. At 10 s each, ticks resumed 14-18 s after the promotion (bench/failover.py (f),
# docs/benchmarks.md); on a Sentinel broker, where a failover can happen, both are shorter.
FAILOVER_SOCKET_TIMEOUT_S = 3.0
FAILOVER_HEALTH_CHECK_S = 2


def transport_options(broker: BrokerConfig, url: str) -> dict[str, Any]:
    """Extra broker/result-backend transport options for ``url``."""
    if not is_sentinel(url):
        return {}
    return {"master_name": master_name(broker), "sentinel_kwargs": sentinel_kwargs(broker.sentinel),
            "socket_timeout": FAILOVER_SOCKET_TIMEOUT_S, "health_check_interval": FAILOVER_HEALTH_CHECK_S}


def transport_class(url: str) -> dict[str, Any]:
    """``broker_transport`` for ``url``: on a Sentinel broker, kombu's Sentinel transport with a
    failed ack releasing its prefetch slot (broker/transport.py: the stall after a freeze)."""
    if not is_sentinel(url):
        return {}  # redis:// resolves to the fleet's transport by kombu's alias (broker/transport.py)
    from powerfleet.broker.transport import SENTINEL_TRANSPORT  # kombu's Redis transport: only here

    return {"broker_transport": SENTINEL_TRANSPORT}


def backend_socket_settings(url: str) -> dict[str, Any]:
    """Celery's Redis result backend takes its socket timeout from ``redis_socket_timeout`` (120 s by
    default), not from its transport options: a pool process storing a result on a frozen master
    waited that long, and its worker consumed nothing meanwhile. On a Sentinel backend, the
    broker's figures."""
    if not is_sentinel(url):
        return {}
    return {"redis_socket_timeout": FAILOVER_SOCKET_TIMEOUT_S,
            "redis_backend_health_check_interval": FAILOVER_HEALTH_CHECK_S}


def _ssl_dict(broker: BrokerConfig) -> dict[str, Any]:
    opts: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if broker.sentinel.tls_ca_file:
        opts["ssl_ca_certs"] = broker.sentinel.tls_ca_file
    return opts


def tls_settings(broker: BrokerConfig, broker_url: str, backend_url: str) -> dict[str, Any]:
    """TLS for Sentinel-managed connections (rediss:// URLs carry theirs in the query)."""
    if not broker.sentinel.tls:
        return {}
    out: dict[str, Any] = {}
    if is_sentinel(broker_url):
        out["broker_use_ssl"] = _ssl_dict(broker)
        out["redbeat_redis_use_ssl"] = _ssl_dict(broker)
    if is_sentinel(backend_url):
        out["redis_backend_use_ssl"] = _ssl_dict(broker)
    return out


def redbeat_settings(broker: BrokerConfig, broker_url: str) -> dict[str, Any]:
    """``redbeat_redis_url`` (and options, for Sentinel) for beat's schedule and lock."""
    if not is_sentinel(broker_url):
        return {"redbeat_redis_url": broker_url}
    parsed = parse_sentinel_url(broker_url)
    # RedBeat only checks the scheme and prints the URL in beat's banner (through kombu's URL
    # parser, so it must be one host:port): the first Sentinel, no credentials.
    host, port = parsed.sentinels[0]
    url = f"redis-sentinel://{host}:{port}/{parsed.db}"
    options: dict[str, Any] = {"sentinels": list(parsed.sentinels), "service_name": master_name(broker),
                               "db": parsed.db, "socket_timeout": FAILOVER_SOCKET_TIMEOUT_S,
                               "sentinel_kwargs": sentinel_kwargs(broker.sentinel)}
    if parsed.password is not None:
        options["password"] = parsed.password
    if parsed.username is not None:
        options["username"] = parsed.username
    return {"redbeat_redis_url": url, "redbeat_redis_options": options}
