"""Heartbeats in a real Redis; the pod watch against the loopback API server."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.agent.presence import Heartbeat, beat, heartbeat_key, heartbeat_ttl_s, live_agents
from powerfleet.agent.podcache import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, WATCH_MIN_S, PodCache, PodViewStale
from powerfleet.agent.watcher import cap_relevant
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import PodEvent
from powerfleet.tasks.fleet import tick_nodes
from powerfleet.twin.apiserver import ApiServer
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures
from tests.waiting import wait_for


def test_heartbeat_ttl_is_three_intervals() -> None:
    assert heartbeat_ttl_s(15) == 45 and heartbeat_ttl_s(0.2) == 3


def test_live_agents_are_the_nodes_with_a_heartbeat(broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    clock = FakeClock(t=1000.0)
    beat(r, "gpu-a", 15, clock)
    beat(r, "gpu-b", 15, clock)
    r.set("powerfleet:other", "x")
    assert live_agents(r) == {"gpu-a", "gpu-b"}
    assert 0 < r.ttl(heartbeat_key("gpu-a")) <= 45
    hb = Heartbeat(r, "gpu-c", 15, clock).start()
    wait_for(lambda: "gpu-c" in live_agents(r), "gpu-c's heartbeat")
    hb.stop()
    assert live_agents(r) == {"gpu-a", "gpu-b"}  # a clean stop removes the key at once


def test_heartbeat_survives_a_dead_redis_with_one_warning(caplog) -> None:
    r = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    hb = Heartbeat(r, "gpu-x", 15, FakeClock())
    with caplog.at_level("WARNING", logger="powerfleet.agent"):
        assert hb.beat_once() is False
        assert hb.beat_once() is False
    assert sum("heartbeat for gpu-x failed" in m for m in caplog.messages) == 1


def test_tick_nodes_are_configured_and_live_ones_never_an_illegal_name() -> None:
    assert tick_nodes(["gpu-a"], {"gpu-b", "bad node/../x", "gpu-a"}) == ["gpu-a", "gpu-b"]
    assert tick_nodes([], set()) == []


def ev(kind: str, uid: str, cap: str | None, phase: str = "Running") -> PodEvent:
    pod = PodInfo(name=uid, namespace="default", uid=uid, phase=phase,
                  annotations={} if cap is None else {POWER_ANNOTATION: cap})
    return PodEvent(type=kind, pod=pod, resource_version="1")  # type: ignore[arg-type]


def test_only_cap_relevant_changes_ask_for_a_pass() -> None:
    known: dict = {}
    assert cap_relevant(known, ev("ADDED", "a", "300"))
    assert not cap_relevant(known, ev("MODIFIED", "a", "300"))  # e.g. a label change
    assert cap_relevant(known, ev("MODIFIED", "a", "250"))
    assert cap_relevant(known, ev("MODIFIED", "a", "250", phase="Succeeded"))
    assert cap_relevant(known, ev("MODIFIED", "a", None))  # lost the annotation
    assert not cap_relevant(known, ev("ADDED", "plain", None))
    assert not cap_relevant(known, ev("MODIFIED", "plain", None, phase="Failed"))
    assert not cap_relevant(known, ev("DELETED", "plain", None))
    assert cap_relevant(known, ev("ADDED", "b", "300"))
    assert cap_relevant(known, ev("DELETED", "b", "300"))
    assert not cap_relevant(known, ev("BOOKMARK", "b", "300"))


@given(st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.sampled_from("xyz"),
                          st.one_of(st.none(), st.sampled_from(["300", "350", "bad"])))))
def test_a_pod_that_never_carries_the_annotation_never_asks_for_a_pass(events) -> None:
    known: dict = {}
    for kind, uid, cap in events:
        relevant = cap_relevant(known, ev(kind, uid, cap))
        if relevant:
            assert cap is not None or any(c is not None for k, u, c in events if u == uid)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeCluster]]:
    with ApiServer() as api:
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        yield api, cluster
        cluster.close()


def pod(name: str, node: str, cap: str | None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": {} if cap is None else {POWER_ANNOTATION: cap}},
            "spec": {"nodeName": node, "containers": [{"name": "m", "image": "m"}]}, "status": {"phase": "Running"}}


def test_the_watch_asks_for_a_pass_on_its_node_annotation_changes_only(kube) -> None:
    api, cluster = kube
    api.apply(pod("p", "gpu-a", "300"))
    reasons: list[str] = []
    got = threading.Event()

    def on_change(reason: str) -> None:
        reasons.append(reason)
        got.set()
    watcher = PodCache(cluster, "gpu-a", [], on_change, watch_timeout_s=5)
    with pytest.raises(PodViewStale, match="not listed yet"):
        watcher.snapshot()  # no view before the first LIST: a pass is skipped, never run on nothing
    watcher.start()
    try:
        wait_for(lambda: reasons == ["pod list of all namespaces (1 pods)"], "the initial listing")
        assert [p.name for p in watcher.snapshot()] == ["p"]
        api.apply(pod("other-node", "gpu-b", "300"))
        api.apply(pod("plain", "gpu-a", None))
        api.apply(pod("p", "gpu-a", "250"))
        wait_for(lambda: len(reasons) == 2, "the annotation change")
        assert reasons[1] == "pod default/p annotation changed"
        api.delete("v1", "Pod", "p")
        wait_for(lambda: len(reasons) == 3, "the deletion")
        assert reasons[2] == "pod default/p deleted"
        wait_for(lambda: sorted(p.name for p in watcher.snapshot()) == ["plain"], "the view to follow the watch")
        assert watcher.calls["list"] == 1  # one LIST; everything after it came from the watch
    finally:
        watcher.stop()


def test_a_quiet_nodes_view_resumes_from_bookmarks_not_a_relist_once_the_servers_history_moves_on(kube) -> None:
    """This node's pods never change; another node's do, and the server then forgets the history
    before them. The view's watch asks for BOOKMARKs, so it resumes from a version the server still
    holds. Without them it would resume from its LIST's version: a 410 and a relist every time
    (bench/scale_watch.py, on the real kube-apiserver: docs/benchmarks.md)."""
    api, cluster = kube
    api.apply(pod("p", "gpu-a", "300"))
    reasons: list[str] = []
    watcher = PodCache(cluster, "gpu-a", [], reasons.append, watch_timeout_s=4)  # a BOOKMARK at 2 s
    watcher.start()
    try:
        wait_for(lambda: reasons == ["pod list of all namespaces (1 pods)"], "the initial listing")
        api.apply(pod("elsewhere-0", "gpu-b", "300"))  # a version gpu-a's watch never gets as an event
        # two watches ended: the one that started after that write was told of its version
        wait_for(lambda: watcher.calls["watch"] >= 3, "two watches to end and resume", timeout_s=60)
        api.store.log.clear()  # the server's history before now is gone
        api.apply(pod("elsewhere-1", "gpu-b", "300"))
        wait_for(lambda: watcher.calls["watch"] >= 5, "two more watches", timeout_s=60)
        assert watcher.calls["list"] == 1, f"the view relisted: {watcher.calls}"
        assert [p.name for p in watcher.snapshot()] == ["p"]
    finally:
        watcher.stop()


class RecordingCluster:
    """A cluster whose LIST is empty and whose every watch ends at once; it records each watch's request."""

    def __init__(self) -> None:
        self.watches: list[dict] = []

    def list_pods_with_version(self, *a, **kw):
        return [], "1"

    def watch_pods(self, namespace=None, **kw):
        self.watches.append(kw)
        return iter(())


def test_the_views_watches_are_long_and_drawn_so_a_fleet_resumes_few_and_not_together() -> None:
    """10,000 agents on 30 s watches resume ~330 a second, all together after a rollout; drawn in
    [5, 10) min as client-go's reflector draws them, ~22 a second, spread (bench/scale_watch.py)."""
    core = RecordingCluster()
    w = PodCache(core, "gpu-a", [], lambda reason: None, rng=random.Random(7)).start()  # type: ignore[arg-type]
    try:
        wait_for(lambda: len(core.watches) >= 50, "50 watches")
    finally:
        w.stop()
    asked = core.watches[:50]
    timeouts = [kw["timeout_seconds"] for kw in asked]
    assert all(WATCH_MIN_S <= t < 2 * WATCH_MIN_S for t in timeouts), timeouts
    assert len(set(timeouts)) > 25, f"not drawn: {sorted(set(timeouts))}"
    for kw in asked:  # a quiet watch may be silent for its whole length: the read deadline covers it
        assert kw["bookmarks"] is True and kw["request_timeout"] == (CONNECT_TIMEOUT_S, kw["timeout_seconds"] + READ_TIMEOUT_S)
    a, b = (PodCache(core, n, [], lambda reason: None) for n in ("gpu-a", "gpu-b"))  # type: ignore[arg-type]
    assert [a.next_watch_timeout_s() for _ in range(10)] != [b.next_watch_timeout_s() for _ in range(10)]
    assert PodCache(core, "gpu-c", [], lambda reason: None, watch_timeout_s=4).next_watch_timeout_s() == 4  # type: ignore[arg-type]


class BrokenCluster:
    """A cluster whose LIST fails the way an undecodable object does."""

    def __init__(self) -> None:
        self.calls = 0

    def list_pods_with_version(self, *a, **kw):
        self.calls += 1
        raise ValueError("1 validation error for V1PodSpec")


def test_a_crashing_pod_view_retries_stays_stale_and_logs_one_traceback_per_outage(caplog) -> None:
    core = BrokenCluster()
    with caplog.at_level("WARNING", logger="powerfleet.agent"):
        w = PodCache(core, "gpu-a", [], lambda reason: None, retry_s=0.01).start()  # type: ignore[arg-type]
        wait_for(lambda: core.calls >= 5, "several retries")
        with pytest.raises(PodViewStale, match="ValueError"):
            w.snapshot()
        w.stop()
    crashed = [r for r in caplog.records if "pod view of all namespaces on gpu-a failed" in r.getMessage()]
    assert len(crashed) == 1 and crashed[0].exc_info is not None


def test_the_agent_package_imports_no_budget_code() -> None:
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, powerfleet.agent as a\n"
            "for m in pkgutil.iter_modules(a.__path__): importlib.import_module('powerfleet.agent.' + m.name)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('powerfleet.budget', 'powerfleet.tasks'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_fan_out_puts_one_expiring_reconcile_on_each_node_queue(broker_url: str) -> None:  # noqa: F811
    import base64
    import json

    from powerfleet.config import load_config
    from powerfleet.tasks.fleet import fan_out
    from powerfleet.workers.app import create_app

    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": broker_url}))
    r = redis.Redis.from_url(broker_url)
    fan_out(app, [], expires=15)  # nothing to send is not an error
    nodes = [f"gpu-{i}" for i in range(50)]
    fan_out(app, nodes, expires=15)

    def calls(cmd: str) -> int:
        return int(r.info("commandstats").get(f"cmdstat_{cmd}", {}).get("calls", 0))
    before = {c: calls(c) for c in ("sadd", "llen", "lpush")}
    fan_out(app, nodes, expires=15)  # the next tick: the queues are not declared again
    assert {c: calls(c) - n for c, n in before.items()} == {"sadd": 0, "llen": 0, "lpush": 50}
    for node in nodes:
        assert r.llen(f"node.{node}") == 2
        msg = json.loads(r.lindex(f"node.{node}", 0))
        assert msg["headers"]["task"] == "powerfleet.agent.reconcile" and msg["headers"]["expires"]
        assert json.loads(base64.b64decode(msg["body"]))[1] == {"node": node}
        assert msg["properties"]["delivery_info"]["routing_key"] == f"node.{node}"
