"""The agent's pod lister from the config: several namespaces make one view or none."""

from __future__ import annotations

import pytest

from powerfleet.agent.build import node_pod_lister
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterError
from tests.agent.conftest import Bench


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
