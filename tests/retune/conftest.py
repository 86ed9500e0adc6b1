from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.clock import FakeClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.router import RouterClient
from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.context import Ports
from powerfleet.testing.retune_world import GRID, INTERVAL, World
from powerfleet.twin.apiserver import ApiServer


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with ApiServer() as api:
        (tmp_path / "traces").mkdir()
        w = World(api, tmp_path / "traces", api.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            yield w
        finally:
            w.stop()


@pytest.fixture
def kube(world: World) -> Iterator[KubeCluster]:
    k = KubeCluster.from_kubeconfig(str(world.kubeconfig))
    yield k
    k.close()


def retune_config(world: World, deployments: list[str], **over: Any) -> RetuneConfig:
    base: dict[str, Any] = dict(deployments=deployments, window_interval_s=INTERVAL, trace_dir=str(world.trace_dir),
                                kubeconfig=str(world.kubeconfig), grid=GRID, objective="ttft",
                                min_improvement_percentage=0.0, max_shards=2, time_budget_s=40, shard_timeout_s=30,
                                lease_duration_s=30, lease_renew_s=5,
                                # the tests' windows are small: the noise guard is tested on its own
                                min_requests=0, confidence=0.0, dwell_s=0, search_rounds=0)
    base.update(over)
    return RetuneConfig.model_validate(base)


class Outbox:
    """A ``send`` that records messages instead of publishing (for in-process steps)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def __call__(self, name: str, kwargs: dict[str, Any], opts: dict[str, Any]) -> None:
        self.sent.append((name, kwargs, opts))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [kw for n, kw, _ in self.sent if n == name]


def make_ports(url: str, kube: KubeCluster, identity: str, clock: FakeClock, send: Any = None) -> Ports:
    r = redis.Redis.from_url(url)
    return Ports(r=r, cluster=kube, router=RouterClient(leader=identity), clock=clock, identity=identity,
                 send=send or Outbox(), sweep_consumers=lambda _dir: {"sweep@test": True})


def launch_window_k1(world: World, kube: KubeCluster, redis_url: str, cfg: RetuneConfig, k: int,
                     lines: list[str]) -> tuple[Ports, dict[str, Any]]:
    """Lead deployment "llama" from window k, write ``lines`` as its frontends' segments, tick
    once window k+1 has closed and run the window step the tick sent (window k+1, warmed by k)."""
    from powerfleet.retune import control, live
    from powerfleet.testing.retune_world import start_of, write_segments

    clock = FakeClock(start_of(k) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert control.tick_deployment(cfg, ports, "llama", clock.now())["status"] == "leader"
    write_segments(world.trace_dir, "llama", sorted(world.frontends["llama"]), lines)
    clock.advance(start_of(k + 2) - start_of(k))
    control.tick_deployment(cfg, ports, "llama", clock.now())
    (win,) = ports.send.of(control.WINDOW_TASK)
    return ports, live.launch_window(cfg, ports, "llama", win["window"], leader=win["leader"], term=win["term"],
                                     generation=win["generation"])
