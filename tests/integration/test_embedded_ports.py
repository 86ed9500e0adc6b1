"""The embedded Redis on a port another process took between the probe and the bind."""

from __future__ import annotations

import pytest
import redis

from powerfleet.broker import embedded
from powerfleet.broker.embedded import EmbeddedRedis


def test_a_probed_port_taken_by_another_redis_is_probed_again_never_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parallel test workers each start Redis on a probed free port; when two probes meet, the second
    # Redis cannot bind, and until it has exited the first one answers PING on that port.
    with EmbeddedRedis() as other:
        ports = iter([other.port])
        real = embedded.free_loopback_port
        monkeypatch.setattr(embedded, "free_loopback_port", lambda: next(ports, None) or real())
        with EmbeddedRedis() as ours:
            assert ours.port != other.port, ours.port
            pid = redis.Redis(port=ours.port).info("server")["process_id"]
            assert ours._proc is not None and pid == ours._proc.pid, (pid, ours._proc)
        assert redis.Redis(port=other.port).ping()  # the other one is untouched


def test_a_given_port_is_never_moved() -> None:
    with EmbeddedRedis() as other:
        with pytest.raises(embedded.BrokerUnavailable, match="Address already in use"):
            EmbeddedRedis(port=other.port, start_timeout_s=5).start()
