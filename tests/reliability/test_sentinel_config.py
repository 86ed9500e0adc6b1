"""Sentinel broker URLs in the config, the Celery/kombu/RedBeat settings built from them, and
the NOREPLICAS retry: pure, no process started (the failovers are in test_sentinel_failover.py)."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from celery.backends.redis import SentinelBackend
from redis.sentinel import SentinelConnectionPool

from powerfleet.broker.clients import redis_client
from powerfleet.broker.outage import FleetSentinelBackend
from powerfleet.broker.publish import BrokerRefusedWrite, retry_noreplicas
from powerfleet.clock import FakeClock
from powerfleet.config import ConfigError, load_config
from powerfleet.config.broker_urls import BrokerUrlError, parse_sentinel_url, redact
from powerfleet.workers.app import celery_settings, create_app

URL = "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"
ENV = {"POWERFLEET_BROKER__URL": URL, "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": "fleet",
       "POWERFLEET_BROKER__SENTINEL__PASSWORD": "sentinel-pw"}


def test_a_sentinel_url_without_a_master_name_is_one_line_naming_the_key() -> None:
    for env in ({"POWERFLEET_BROKER__URL": URL},
                {"POWERFLEET_BROKER__URL": "redis://h:6379/0", "POWERFLEET_BROKER__RESULT_BACKEND": URL}):
        with pytest.raises(ConfigError) as err:
            load_config(environ=env)
        text = str(err.value)
        assert "broker.sentinel.master_name" in text and "\n" not in text and "s3cret" not in text, text


@pytest.mark.parametrize(("url", "says"), [
    ("sentinel://h:1;redis://h:2", "entry 2 of the sentinel list: every entry must start with sentinel://"),
    ("sentinel://:pw@h:99999", "entry 1 of the sentinel list: the port must be a number"),
    ("sentinel://:26379", "needs a host and a port"),
    ("sentinel://h:1/db7x", "the path must be a database number"),
    ("sentinel://h:1?ssl=true", "TLS is broker.sentinel.tls"),
    ("amqp://h", "must be a redis://"),
])
def test_bad_broker_urls_are_one_line_without_the_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={"POWERFLEET_BROKER__URL": url, "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": "m"})
    assert says in str(err.value) and "pw@" not in str(err.value), str(err.value)


def test_the_sentinel_list_parses_with_the_masters_credentials_and_db_from_the_first_entry() -> None:
    parsed = parse_sentinel_url(URL)
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379))
    assert (parsed.db, parsed.username, parsed.password) == (2, None, "s3cret")
    assert redact(URL) == "sentinel://:***@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"


def test_celery_kombu_and_redbeat_get_the_sentinel_options_and_no_url_carries_a_secret() -> None:
    config = load_config(environ=ENV)
    s = celery_settings(config, URL)
    want = {"master_name": "fleet", "sentinel_kwargs": {"password": "sentinel-pw", "socket_timeout": 2.0,
                                                        "socket_connect_timeout": 2.0}}
    assert s["broker_transport_options"].items() >= want.items()
    assert s["result_backend_transport_options"].items() >= want.items()
    assert s["result_backend"] == URL  # the scheme picks the backend (the fleet's SentinelBackend)
    assert s["redbeat_redis_url"].startswith("redis-sentinel://") and "s3cret" not in s["redbeat_redis_url"]
    opts = s["redbeat_redis_options"]
    assert (opts["service_name"], opts["db"], opts["password"]) == ("fleet", 2, "s3cret")
    assert opts["sentinels"] == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)]
    assert "broker_use_ssl" not in s
    # a frozen master is left within seconds (bench/failover.py (f): 14-18 s after the promotion at 10 s)
    for opts_ in (s["broker_transport_options"], s["result_backend_transport_options"]):
        assert (opts_["socket_timeout"], opts_["health_check_interval"]) == (3.0, 2), opts_
    assert opts["socket_timeout"] == 3.0, opts
    app = create_app(config)
    # Celery's SentinelBackend, storing through a short outage (broker/outage.py)
    assert isinstance(app.backend, FleetSentinelBackend) and isinstance(app.backend, SentinelBackend)
    assert "s3cret" not in app.backend.as_uri() and "s3cret" not in app.connection_for_write().as_uri()


def test_tls_reaches_the_broker_the_backend_redbeat_and_the_sentinels() -> None:
    config = load_config(environ={**ENV, "POWERFLEET_BROKER__SENTINEL__TLS": "true",
                                  "POWERFLEET_BROKER__SENTINEL__TLS_CA_FILE": "/etc/ca.pem"})
    s = celery_settings(config, URL)
    for key in ("broker_use_ssl", "redis_backend_use_ssl", "redbeat_redis_use_ssl"):
        assert s[key]["ssl_ca_certs"] == "/etc/ca.pem", key
    assert s["broker_transport_options"]["sentinel_kwargs"]["ssl"] is True


def test_the_plain_url_settings_are_unchanged() -> None:
    config = load_config(environ={"POWERFLEET_BROKER__URL": "redis://h:6379/0"})
    s = celery_settings(config, "redis://h:6379/0")
    assert "master_name" not in s["broker_transport_options"] and "redbeat_redis_options" not in s
    assert s["redbeat_redis_url"] == "redis://h:6379/0"


def test_the_client_factory_follows_the_sentinel_master() -> None:
    config = load_config(environ=ENV)
    client = redis_client(URL, config.broker, socket_timeout=3)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "fleet"
    assert pool.connection_kwargs["password"] == "s3cret" and pool.connection_kwargs["db"] == 2
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels] == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)]
    assert sentinels[0].connection_pool.connection_kwargs["password"] == "sentinel-pw"
    plain = redis_client("redis://h:6379/3", config.broker)
    assert not isinstance(plain.connection_pool, SentinelConnectionPool)


def _refusals(n: int, clock: FakeClock) -> tuple[list[float], object]:
    calls: list[float] = []

    def publish() -> str:
        calls.append(clock.monotonic())
        if len(calls) <= n:
            raise redis.ResponseError("NOREPLICAS Not enough good replicas to write.")
        return "sent"
    return calls, publish


def test_a_noreplicas_publish_is_retried_then_reported_in_one_line() -> None:
    clock = FakeClock()
    calls, publish = _refusals(3, clock)
    assert retry_noreplicas(publish, "publish t", 5.0, clock=clock, sleep=clock.advance) == "sent"
    assert len(calls) == 4
    calls, publish = _refusals(10**6, clock)
    with pytest.raises(BrokerRefusedWrite) as err:
        retry_noreplicas(publish, "publish t", 5.0, clock=clock, sleep=clock.advance)
    assert "\n" not in str(err.value) and "NOREPLICAS" in str(err.value)
    assert calls[-1] - calls[0] == pytest.approx(5.0)  # retried for the whole period, no longer


def test_other_redis_errors_are_not_retried() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def publish() -> None:
        calls.append(1)
        raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    with pytest.raises(redis.ResponseError):
        retry_noreplicas(publish, "publish t", 5.0, clock=clock, sleep=clock.advance)
    assert calls == [1]


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("sentinel:/;@:h.0123456789x% ?#[]"), max_size=80)
       | st.text(max_size=60).map(lambda t: "sentinel://" + t))
def test_any_text_parses_or_is_a_one_line_url_error_and_redaction_hides_the_password(text: str) -> None:
    try:
        parsed = parse_sentinel_url(text)
    except BrokerUrlError as exc:
        assert "\n" not in str(exc)
        return
    assert parsed.sentinels and all(1 <= port <= 65535 for _, port in parsed.sentinels)
    if parsed.password:
        assert f":{parsed.password}@" not in redact(text)


def test_noreplicas_is_recognised_as_kombu_wraps_it() -> None:
    from kombu.exceptions import OperationalError

    from powerfleet.broker.publish import is_noreplicas

    try:
        try:
            raise redis.ResponseError("Command # 1 (SADD b q) of pipeline caused error: NOREPLICAS Not enough")
        except redis.ResponseError as inner:
            raise OperationalError(str(inner)) from inner
    except OperationalError as wrapped:
        assert is_noreplicas(wrapped)
    assert not is_noreplicas(OperationalError("Connection refused"))


def test_status_puts_the_broker_in_one_line() -> None:
    from powerfleet.cli.status_cmd import broker_line

    line = broker_line({"mode": "sentinel", "master_name": "fleet", "master": "10.0.0.5:6379", "master_flags": "master",
                        "replicas": [{"address": "10.0.0.6:6379", "flags": "slave", "link": "ok"},
                                     {"address": "10.0.0.7:6379", "flags": "s_down,slave,disconnected", "link": "err"}],
                        "sentinels": 3, "quorum": 2, "last_failover": {"epoch": 4, "age_s": 61.2},
                        "sentinels_configured": 3, "sentinels_answered": 3, "failover_possible": True})
    assert line == ("broker: Sentinel master 'fleet' at 10.0.0.5:6379 (master; 3 Sentinels, quorum 2); replicas: "
                    "10.0.0.6:6379 (link ok), 10.0.0.7:6379 (DOWN); last failover: 61 s ago (failover epoch 4); "
                    "3 of 3 Sentinels answered, a failover can be authorised")
    lost = broker_line({"mode": "sentinel", "master_name": "m", "master": "h:1", "master_flags": "master",
                        "replicas": [], "sentinels": 3, "quorum": 2, "last_failover": None, "sentinels_configured": 3,
                        "sentinels_answered": 1, "failover_possible": False,
                        "quorum_detail": "NOQUORUM 1 usable Sentinels. Not enough available Sentinels to reach the "
                                         "specified quorum for this master"})
    assert lost.endswith("; WARNING: 1 of 3 Sentinels answered, NO failover can happen (NOQUORUM 1 usable Sentinels. "
                         "Not enough available Sentinels to reach the specified quorum for this master)"), lost
    assert "never" in broker_line({"mode": "sentinel", "master_name": "m", "master": "h:1", "master_flags": "master",
                                   "replicas": [], "sentinels": 1, "quorum": 1, "last_failover": None})
    assert broker_line({"mode": "sentinel", "error": "no Sentinel answered: h:1 (refused)", "sentinels_configured": 1,
                        "sentinels_answered": 0, "failover_possible": False}) == \
        "broker (sentinel): no Sentinel answered: h:1 (refused); WARNING: 0 of 1 Sentinels answered, NO failover can " \
        "happen (no quorum)"


def test_a_sentinel_address_that_is_not_redis_is_one_line() -> None:
    import socket
    import threading

    from powerfleet.broker.clients import BrokerConfigError
    from powerfleet.broker.topology import describe, find_master

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_garbage() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()
    threading.Thread(target=answer_garbage, daemon=True).start()
    config = load_config(environ={"POWERFLEET_BROKER__URL": f"sentinel://127.0.0.1:{port}",
                                  "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": "fleet"})
    with pytest.raises(BrokerConfigError) as err:
        find_master(config.broker.url, config.broker, 2.0)
    assert str(err.value).startswith(f"no Sentinel answered: 127.0.0.1:{port} (") and "\n" not in str(err.value)
    assert describe(config.broker.url, config.broker, 2.0)["error"].startswith("no Sentinel answered")
    server.close()


def test_the_failover_retry_waits_out_a_failover_by_a_deadline_not_a_count() -> None:
    from powerfleet.broker.clients import FailoverRetry

    now = [0.0]
    retry = FailoverRetry(15.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    calls = []

    def promoted_after(s: float) -> str:
        calls.append(now[0])
        if now[0] < s:
            raise redis.ConnectionError("Connection refused")
        return "ok"

    assert retry.call_with_retry(lambda: promoted_after(7.0), lambda e: None) == "ok"  # the chart's failover
    assert [round(t, 6) for t in calls[:5]] == [0.0, 0.2, 0.6, 1.4, 2.4] and now[0] < 8.5
    now[0], calls[:] = 0.0, []
    with pytest.raises(redis.ConnectionError):  # an outage longer than the deadline: given up at it
        retry.call_with_retry(lambda: promoted_after(1e9), lambda e: None)
    assert calls[-1] == 15.0 and len(calls) < 20
    with pytest.raises(redis.ResponseError):  # anything but a connection error is not retried
        retry.call_with_retry(lambda: (_ for _ in ()).throw(redis.ResponseError("WRONGTYPE")), lambda e: None)


def test_a_sentinel_broker_gets_the_transport_whose_failed_ack_frees_its_prefetch_slot() -> None:
    from kombu import Connection

    from powerfleet.broker.transport import FleetSentinelTransport, SlotReleasingQoS

    s = celery_settings(load_config(environ=ENV), URL)
    assert s.get("broker_transport") == "powerfleet.broker.transport:FleetSentinelTransport", s.get("broker_transport")
    assert "broker_transport" not in celery_settings(load_config(environ={}), "redis://127.0.0.1:6379/0")
    conn = Connection(URL, transport=s["broker_transport"], transport_options=s["broker_transport_options"])
    assert conn.transport_cls is FleetSentinelTransport or isinstance(conn.transport, FleetSentinelTransport), conn
    assert FleetSentinelTransport.Channel.QoS is SlotReleasingQoS
    assert (s["redis_socket_timeout"], s["redis_backend_health_check_interval"]) == (3.0, 2), s
