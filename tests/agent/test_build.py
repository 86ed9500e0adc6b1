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
