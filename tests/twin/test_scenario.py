"""The scenario degrades honestly: a capability this build lacks is a failed step with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.twin.runtime import Twin, TwinOptions
from powerfleet.twin.scenario import Scenario
from powerfleet.twin.topology import TwinSpec


@pytest.fixture
def twin(tmp_path: Path):
    tw = Twin(TwinOptions(spec=TwinSpec(nodes=1), root=tmp_path / "twin", window_s=10)).start()
    yield tw
    tw.stop()


def test_absent_tasks_fail_their_steps_with_the_reason(twin) -> None:
    sent: list[tuple[str, dict]] = []
    log: list[str] = []
    sc = Scenario(twin, lambda name, kw: sent.append((name, kw)), lambda name: False, log.append)
    sc.tick(1.0)
    sc.finish()
    states = sc.states()
    assert states["scale_up_clamped"] == ("failed: powerfleet.budget.propose is not a task in this build "
                                          "(budget planner absent)")
    assert "live retune absent" in states["retune_applied"]
    assert "router actuation absent" in states["manual_change_reverted"]
    assert not sent  # nothing was sent for a capability that is not there
    # The cap change needs no task: it was made on the DGD, and without agents it cannot hold.
    assert states["cap_change"].startswith("failed: not reached before the end")
    dgd = twin.api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llm-disagg")
    assert dgd["spec"]["services"]["decode"]["extraPodMetadata"]["annotations"][
        "dynamo.nvidia.com/gpu-power-limit"] == "380"


def test_a_refused_send_fails_only_its_step(twin) -> None:
    def refuse(name: str, kwargs: dict) -> None:
        raise ValueError(f"{name}: deployment: bad shape")

    sc = Scenario(twin, refuse, lambda name: True, lambda line: None)
    sc.tick(0.3)
    states = sc.states()
    assert states["scale_up_clamped"].startswith("failed: ValueError: powerfleet.budget.readmit: deployment: bad shape")
    assert states["cap_change"] == "running" and states["retune_applied"] == "running"


def test_the_scale_step_reads_the_budgets_reasons_from_its_status_configmap(twin) -> None:
    from powerfleet.cluster.budget_store import KubeBudgetStore, Owner
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.twin.manifests import DISAGG

    sc = Scenario(twin, lambda name, kw: None, lambda name: True, lambda line: None)
    scale = next(s for s in sc.steps if s.name == "scale_up_clamped")
    assert scale.start() is None and sc.budget_status(DISAGG) == {}  # nothing written yet
    kube = KubeCluster.from_kubeconfig(str(twin.kubeconfig))
    try:
        dgd = twin.api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", DISAGG, twin.spec.namespace)
        written = {"ready": "True", "reason": "Planned", "reasons": ["power_budget_clamped", "power_rebalance_staged"]}
        KubeBudgetStore(kube).write_status(Owner.of(dgd), written, None)
    finally:
        kube.close()
    assert sc.budget_status(DISAGG) == written
    holds, seen = scale.poll()
    assert not holds  # decode has not grown
    assert "staged; planner reasons seen ['power_budget_clamped', 'power_rebalance_staged']" in seen
