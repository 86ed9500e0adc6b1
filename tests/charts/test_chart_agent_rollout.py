"""The agent DaemonSet never surges: one agent per node, also during a rollout."""

from __future__ import annotations

import pytest

from tests.charts.chartlib import HELM_SKIP_REASON, objects, one

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)


def strategy(values: dict) -> dict:
    return one(objects(values), "DaemonSet", "agent")["spec"]["updateStrategy"]


def test_the_default_rollout_replaces_one_agent_at_a_time_without_a_surge() -> None:
    assert strategy({}) == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert strategy({"agent": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}}}})["rollingUpdate"] == {
        "maxSurge": 0, "maxUnavailable": "10%"}
    assert strategy({"agent": {"updateStrategy": {"type": "OnDelete"}}}) == {"type": "OnDelete"}


@pytest.mark.parametrize("surge", [1, "25%"])
def test_a_surge_is_refused(surge) -> None:
    with pytest.raises((helm.HelmRenderError, helm.HelmValuesError), match="maxSurge"):  # schema, else template
        objects({"agent": {"updateStrategy": {"rollingUpdate": {"maxSurge": surge}}}})
