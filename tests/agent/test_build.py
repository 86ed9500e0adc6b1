"""The agent's pod view from the config (the `agent once` lister and the worker's watch-backed
cache): several namespaces make one view or none."""

from __future__ import annotations

import threading

import pytest

from powerfleet.agent.build import node_pod_lister
from powerfleet.agent.podcache import PodCache, PodViewStale
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterError
from tests.agent.conftest import Bench
from tests.waiting import wait_for


class OneNamespaceDown:
    """A reader whose LIST fails in one namespace only (an RBAC gap, a slow shard of the API)."""

    def __init__(self, down: str) -> None:
        self.down = down

    def list_pods(self, namespace: str | None = None, *, node_name: str | None = None, **_: object) -> list[PodInfo]:
        if namespace == self.down:
            raise ClusterError(f"list pods in {namespace}: 403 Forbidden", status=403)
        return [PodInfo(name=f"p-{namespace}", namespace=namespace or "", uid=f"uid-{namespace}", node_name=node_name)]


def test_a_partial_pod_list_over_several_namespaces_skips_the_pass(bench: Bench) -> None:
    uid = bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    assert bench.limits()[0] == 300
    lister = node_pod_lister(OneNamespaceDown("b"), "node-a", ["a", "b", "c"])  # type: ignore[arg-type]
    with pytest.raises(ClusterError):
        lister()
    agent._list_pods = lister  # b fails: the pass must not run on a and c alone
    report = agent.run_pass()
    assert report.skipped and "403" in report.skipped
    assert bench.limits()[0] == 300 and agent.managed == {"GPU-0000"} and uid
    assert bench.metrics.value("powerfleet_agent_pod_list_failures_total") == 1


class OneScopeDown:
    """A cluster for the worker's watch-backed view (PodCache): while ``down`` names a namespace,
    its watch ends with a 403 and its LISTs fail; the other namespaces keep answering."""

    def __init__(self, pods: list[PodInfo]) -> None:
        self.pods = pods
        self.down: str | None = None
        self.list_failed = threading.Event()
        self.quiet = threading.Event()  # set at the end: every watch returns at once

    def list_pods_with_version(self, namespace: str | None = None, *, node_name: str | None = None,
                               **_: object) -> tuple[list[PodInfo], str]:
        if namespace == self.down:
            self.list_failed.set()
            raise ClusterError(f"list pods in {namespace}: 403 Forbidden", status=403)
        return [p for p in self.pods if p.namespace == namespace], "1"

    def watch_pods(self, namespace: str | None = None, **_: object):
        if namespace == self.down:
            raise ClusterError(f"watch pods in {namespace}: 403 Forbidden", status=403)
        self.quiet.wait(0.05)  # a quiet watch the server ends; the cache resumes it
        yield from ()


def test_the_workers_pod_view_over_several_namespaces_skips_the_pass_while_one_fails(bench: Bench) -> None:
    # build.pod_view: the agent worker reads this cache, not node_pod_lister (issue 24, survivor 1)
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    cluster = OneScopeDown([p.model_copy(update={"namespace": "b"}) for p in bench.pods])
    cache = PodCache(cluster, "node-a", ["a", "b", "c"], lambda reason: None, retry_s=0.01).start()
    try:
        agent = bench.agent()
        agent._list_pods, agent.complete_view = cache.snapshot, False  # as build_runtime wires it
        wait_for(cache.snapshot, "the first LIST of every namespace")
        assert not agent.run_pass().skipped and bench.limits()[0] == 300
        cluster.down = "b"  # a and c stay synced; b's watch fails and its relist keeps failing
        assert cluster.list_failed.wait(30), "b was never relisted"
        with pytest.raises(PodViewStale, match="b: .*403"):
            cache.snapshot()
        report = agent.run_pass()
        assert report.skipped and "pod view incomplete" in report.skipped
        assert bench.limits()[0] == 300 and agent.managed == {"GPU-0000"}
        cluster.down = None
        assert [p.name for p in wait_for(cache.snapshot, "b listed again")] == ["p"]
        assert not agent.run_pass().skipped and bench.limits()[0] == 300
    finally:
        cache.stop()
        cluster.quiet.set()


def test_a_server_that_never_answers_costs_one_bounded_request_without_retries(tmp_path, monkeypatch) -> None:
    import socket
    import threading

    from powerfleet.agent import podcache
    from powerfleet.agent.build import connect_cluster
    from powerfleet.config import FleetConfig

    accepted: list[socket.socket] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(conn)  # read nothing, answer nothing
    threading.Thread(target=accept, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{srv.getsockname()[1]}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n")
    cluster, why = connect_cluster(FleetConfig.model_validate({"agent": {"kubeconfig": str(kubeconfig)}}))
    assert cluster is not None, why
    monkeypatch.setattr(podcache, "READ_TIMEOUT_S", 0.5)
    cache = podcache.PodCache(cluster, "gpu-a", [], lambda reason: None)
    with pytest.raises(Exception, match="timed out|Timeout"):
        cache._list(cache._scopes[0])
    assert len(accepted) == 1  # urllib3's default would have tried four times
    srv.close()


def test_the_agents_api_connections_probe_a_silent_peer_with_tcp_keepalive(tmp_path) -> None:
    """A quiet node's pod watch may carry nothing for its whole 5-10 min (agent/podcache.py), so
    only the kernel's keepalive notices a peer that is gone; checked on the socket a real request
    left in the client's pool, not on the configuration."""
    import socket

    from powerfleet.agent.build import connect_cluster
    from powerfleet.cluster.keepalive import KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES
    from powerfleet.config import FleetConfig
    from powerfleet.twin.apiserver import ApiServer

    with ApiServer() as api:
        cluster, why = connect_cluster(FleetConfig.model_validate(
            {"agent": {"kubeconfig": str(api.write_kubeconfig(tmp_path / "kubeconfig"))}}))
        assert cluster is not None, why
        cluster.list_pods_with_version(None, node_name="gpu-a", resource_version="0")
        pools = cluster.api_client.rest_client.pool_manager.pools
        socks = [c.sock for key in pools.keys() for c in list(pools[key].pool.queue) if c is not None and c.sock]
        assert socks, "the request left no pooled connection to look at"
        sock = socks[0]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL_S
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_PROBES
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1  # urllib3's own option kept
        assert KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES <= 60
        cluster.close()
