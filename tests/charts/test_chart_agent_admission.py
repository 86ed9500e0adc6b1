"""The agent's ValidatingAdmissionPolicy, evaluated with a CEL interpreter (cel-python) over
admission requests as the API server builds them: the agent's ServiceAccount may change only the
enforcement report annotation, only on pods of the node in its token; everyone else is not
matched. The chart's rendered expressions are the ones evaluated."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.charts.chartlib import HELM_SKIP_REASON, find, objects

pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)
celpy = pytest.importorskip("celpy", reason="cel-python is not installed")

REPORT = "dynamo.nvidia.com/gpu-power-enforcement-report"
AGENT = "system:serviceaccount:fleet:pf-powerfleet-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


class Policy:
    def __init__(self, spec: dict[str, Any]) -> None:
        env = celpy.Environment()
        self.spec = spec

        def compile_(expr: str) -> Any:
            return env.program(env.compile(expr))
        self.matches = [compile_(m["expression"]) for m in spec["matchConditions"]]
        self.variables = [(v["name"], compile_(v["expression"])) for v in spec["variables"]]
        self.validations = [(compile_(v["expression"]), v["message"]) for v in spec["validations"]]

    def admit(self, user: str, extra: dict[str, list[str]] | None, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        """The messages of the failed validations; [] when admitted; ["not matched"] when the
        policy does not apply to the request."""
        info: dict[str, Any] = {"username": user}
        if extra is not None:
            info["extra"] = extra
        act: dict[str, Any] = {"request": celpy.json_to_cel({"operation": "UPDATE", "userInfo": info}),
                               "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
        if not all(bool(m.evaluate(act)) for m in self.matches):
            return ["not matched"]
        variables: dict[Any, Any] = {}
        for name, prog in self.variables:
            act["variables"] = celpy.celtypes.MapType(variables)
            variables[celpy.celtypes.StringType(name)] = prog.evaluate(act)
        act["variables"] = celpy.celtypes.MapType(variables)
        return [msg for prog, msg in self.validations if not bool(prog.evaluate(act))]


@pytest.fixture(scope="module")
def policy() -> Policy:
    objs = objects({})
    (vap,) = find(objs, "ValidatingAdmissionPolicy")
    (binding,) = find(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
    return Policy(vap["spec"])


def pod(node: str = "gpu-a", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "decode-0", "namespace": "llm", "labels": {"app": "decode"},
                         "annotations": {"dynamo.nvidia.com/gpu-power-limit": "300", **(annotations or {})},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "u"}]},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "llm:1"}]}}


def with_report(p: dict[str, Any], text: str = '{"version":1}') -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["metadata"]["annotations"][REPORT] = text
    return out


ON_NODE = {NODE_CLAIM: ["gpu-a"]}


def test_the_agent_may_write_and_rewrite_the_report_on_its_own_nodes_pods(policy: Policy) -> None:
    assert policy.admit(AGENT, ON_NODE, pod(), with_report(pod())) == []
    assert policy.admit(AGENT, ON_NODE, with_report(pod()), with_report(pod(), '{"version":1,"x":2}')) == []
    assert policy.admit(AGENT, ON_NODE, with_report(pod()), pod()) == []  # removing its own report


def test_the_agent_may_not_write_pods_of_another_node_or_without_a_node_claim(policy: Policy) -> None:
    other = pod(node="gpu-b")
    assert any("its own node" in m for m in policy.admit(AGENT, ON_NODE, other, with_report(other)))
    assert any("its own node" in m for m in policy.admit(AGENT, None, pod(), with_report(pod())))
    assert any("its own node" in m for m in policy.admit(AGENT, {NODE_CLAIM: []}, pod(), with_report(pod())))
    assert any("its own node" in m for m in policy.admit(AGENT, {"other": ["x"]}, pod(), with_report(pod())))


@pytest.mark.parametrize("change", ["label", "image", "owner", "finalizer"])
def test_the_agent_may_not_change_anything_else_of_a_pod(policy: Policy, change: str) -> None:
    new = with_report(pod())
    if change == "label":
        new["metadata"]["labels"]["app"] = "other"
    elif change == "image":
        new["spec"]["containers"][0]["image"] = "evil:1"
    elif change == "owner":
        new["metadata"]["ownerReferences"] = []
    else:
        new["metadata"]["finalizers"] = ["x/y"]
    assert policy.admit(AGENT, ON_NODE, pod(), new) == [
        "the powerfleet agent may not change a pod's spec, labels, finalizers or owner references"]


def test_other_users_are_not_matched(policy: Policy) -> None:
    changed = pod(annotations={"x": "y"})
    changed["spec"]["containers"][0]["image"] = "llm:2"
    assert policy.admit("system:serviceaccount:fleet:pf-powerfleet-worker", ON_NODE, pod(), changed) == ["not matched"]
    assert policy.admit("alice", None, pod(), changed) == ["not matched"]


KEYS = st.sampled_from([REPORT, "dynamo.nvidia.com/gpu-power-limit", "a", "b"])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(KEYS, st.sampled_from(["1", "2"]), max_size=4),
       st.dictionaries(KEYS, st.sampled_from(["1", "2"]), max_size=4))
def test_an_annotation_change_is_admitted_iff_only_the_report_changed(policy: Policy, old_ann, new_ann) -> None:
    old, new = pod(), pod()
    old["metadata"]["annotations"], new["metadata"]["annotations"] = old_ann, new_ann
    others_same = {k: v for k, v in old_ann.items() if k != REPORT} == {k: v for k, v in new_ann.items() if k != REPORT}
    assert (policy.admit(AGENT, ON_NODE, old, new) == []) is others_same
