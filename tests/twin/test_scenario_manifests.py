"""A scenario's own deployments (deployments.<name>.manifest / manifest_file, twin/demo/scenario_manifests.py)
and node taints: a DGD manifest is checked against the DGD schema and the fleet's reading before anything
starts (one line naming the key path), and the twin runs it beside its own two, scheduled by the taints
and tolerations, its pods known by role though its components have names of their own."""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerfleet.twin.demo.scenario_load import ScenarioError, load, parse
from powerfleet.twin.demo.scenario_twin import twin_parts
from powerfleet.twin.runtime import Twin, TwinOptions
from tests.waiting import wait_for

CHAT: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": "team-c-chat"},
    "spec": {"services": {
        "Frontend": {"componentType": "frontend", "replicas": 1,
                     "extraPodSpec": {"mainContainer": {"image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1"}}},
        "VllmWorker": {"componentType": "worker", "replicas": 1, "resources": {"limits": {"gpu": "1"}},
                       "extraPodMetadata": {"annotations": {"dynamo.nvidia.com/gpu-power-limit": "450"}},
                       "extraPodSpec": {"nodeSelector": {"pool": "team-c"},
                                        "tolerations": [{"key": "dedicated", "operator": "Equal",
                                                         "value": "team-c", "effect": "NoSchedule"}],
                                        "mainContainer": {"image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1"}}},
    }},
}
TAINT = {"key": "dedicated", "value": "team-c", "effect": "NoSchedule"}
SCENARIO: dict[str, Any] = {
    "version": 1, "name": "team-c", "duration_s": 60,
    "topology": {"racks": {
        "rack-a": {"limit_w": 9000, "nodes": [{"count": 1, "gpus": 8}]},
        "rack-b": {"limit_w": 3000, "nodes": [{"count": 1, "gpus": 4, "labels": {"pool": "team-c"},
                                               "taints": [TAINT]}]}}},
    "deployments": {"llm-agg": {"builtin": "llm-agg", "retune": False},
                    "team-c-chat": {"manifest_file": "chat.yaml", "retune": False,
                                    "sla": {"ttft_ms": 3000, "itl_ms": 50}}},
    "tenants": [{"name": "batch", "node": "twin-gpu-00", "gpus": 6, "power_w": 300},
                {"name": "intruder", "gpus": 3, "load": 0.3},
                {"name": "tolerant", "gpus": 2, "load": 0.3,
                 "tolerations": [{"key": "dedicated", "operator": "Exists"}]}],
    "events": [{"at": "10%", "kind": "propose", "deployment": "team-c-chat", "replicas": {"worker": 2}},
               {"at": "20%", "kind": "set_annotation", "deployment": "team-c-chat", "component": "worker",
                "watts": 400}],
}


def _files(tmp_path: Path, scenario: dict[str, Any] = SCENARIO, manifest: Any = CHAT) -> Path:
    (tmp_path / "chat.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    path = tmp_path / "team-c.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    return path


def _inline(manifest: Any, **scenario: Any) -> dict[str, Any]:
    data = copy.deepcopy(SCENARIO)
    data["deployments"]["team-c-chat"] = {"manifest": manifest, "retune": False}
    data.update(scenario)
    return data


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse(yaml.safe_dump(data), "scenario t.yaml")
    message = str(exc.value)
    assert "\n" not in message and message.startswith("scenario t.yaml: "), message
    return message


def test_a_manifest_file_beside_the_scenario_is_read_and_its_roles_named(tmp_path: Path) -> None:
    scenario, _ = load(str(_files(tmp_path)))
    d = scenario.deployments["team-c-chat"]
    assert d.builtin is None and d.manifest == CHAT, d
    assert d.roles("team-c-chat") == {"frontend": "Frontend", "worker": "VllmWorker"}
    inline = parse(yaml.safe_dump(_inline(CHAT)), "t")
    assert inline.deployments["team-c-chat"].manifest == CHAT


def _set(path: str, value: Any) -> dict[str, Any]:
    """CHAT with ``value`` at the dotted ``path`` (None: the key removed)."""
    m = copy.deepcopy(CHAT)
    keys = path.split(".")
    node = m
    for k in keys[:-1]:
        node = node[k]
    if value is None:
        node.pop(keys[-1])
    else:
        node[keys[-1]] = value
    return m


@pytest.mark.parametrize("manifest,expect", [
    (_set("spec.services.VllmWorker.replicas", -1),
     "deployments.team-c-chat: manifest.spec.services.VllmWorker.replicas: Invalid value: -1"),
    (_set("spec.services.VllmWorker.replicas", "2"),
     "manifest.spec.services.VllmWorker.replicas: Invalid value: \"2\": spec.services.VllmWorker.replicas in body "
     "must be of type integer"),
    (_set("spec.services.VllmWorker.extraPodMetadata.annotations", {}),
     "dynamo.nvidia.com/gpu-power-limit]: missing: the power cap annotation is required"),
    (_set("spec.services.VllmWorker.resources", None), "requests no nvidia.com/gpu"),
    (_set("spec.services.VllmWorker.componentType", "wrker"), "componentType: unknown component type 'wrker'"),
    (_set("spec.services.Frontend", None), "manifest.spec: no frontend component"),
    (_set("kind", "Deployment"), "manifest: apiVersion/kind nvidia.com/v1alpha1/Deployment is not a "
                                 "DynamoGraphDeployment"),
    (_set("metadata.name", "other"), "deployments.team-c-chat: manifest.metadata.name: 'other' is not the "
                                     "deployment's key 'team-c-chat'"),
    (_set("metadata", {"name": "team-c-chat", "namespace": "prod"}),
     "deployments.team-c-chat.manifest.metadata.namespace: 'prod' is not the topology's namespace 'default'"),
    ([1, 2], "deployments.team-c-chat.manifest: Input should be a valid dictionary"),
    (_set("spec.bogus", 1), "manifest.spec.bogus: unknown field: the DynamoGraphDeployment schema does not declare it"),
    (_set("surprise", 1), "manifest.surprise: unknown field"),
])
def test_a_bad_manifest_is_one_line_naming_its_path(manifest: Any, expect: str) -> None:
    message = _error(_inline(manifest))
    assert expect in message, message


def test_events_name_roles_the_manifest_has_and_one_source_is_given() -> None:
    bad_role = _inline(CHAT, events=[{"at": 5, "kind": "propose", "deployment": "team-c-chat",
                                      "replicas": {"prefill": 2}}])
    assert "events.0: team-c-chat has no prefill role (it has worker)" in _error(bad_role)
    both = _inline(CHAT)
    both["deployments"]["team-c-chat"]["builtin"] = "llm-disagg"
    assert "deployments.team-c-chat: give one of builtin, manifest or manifest_file" in _error(both)
    neither = _inline(CHAT)
    neither["deployments"]["team-c-chat"] = {"retune": False}
    assert "deployments.team-c-chat: give one of builtin, manifest or manifest_file" in _error(neither)
    renamed = _inline(CHAT)
    renamed["deployments"]["mine"] = {"builtin": "llm-disagg"}
    assert "deployments.mine: a builtin deployment is named by its builtin (llm-disagg)" in _error(renamed)
    two = _inline(CHAT)
    two["deployments"]["team-c-chat"]["manifest_file"] = "chat.yaml"
    assert "give manifest or manifest_file, not both" in _error(two)


def test_a_manifest_file_that_is_missing_a_fifo_two_dgds_or_a_repeated_key_is_refused(tmp_path: Path) -> None:
    path = _files(tmp_path)
    (tmp_path / "chat.yaml").unlink()
    with pytest.raises(ScenarioError, match="manifest_file .*chat.yaml: No such file"):
        load(str(path))
    os.mkfifo(tmp_path / "chat.yaml")
    done: list[BaseException | None] = []

    def read() -> None:
        try:
            load(str(path))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            done.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)  # opening a FIFO for reading would block until a writer came
    assert not reader.is_alive() and done and "not a regular file" in str(done[0]), done
    (tmp_path / "chat.yaml").unlink()
    (tmp_path / "chat.yaml").write_text(yaml.safe_dump(CHAT) + "---\n" + yaml.safe_dump(CHAT))
    with pytest.raises(ScenarioError, match="2 DynamoGraphDeployments"):
        load(str(path))
    (tmp_path / "chat.yaml").write_text("kind: A\nkind: B\n")
    with pytest.raises(ScenarioError, match="duplicate key 'kind'"):
        load(str(path))
    (tmp_path / "chat.yaml").write_text("a: " + "[" * 100_000)
    with pytest.raises(ScenarioError, match="manifest_file .*(nested|line)"):
        load(str(path))
    (tmp_path / "chat.yaml").write_text("a: " + "[" * 40 + "]" * 40)
    with pytest.raises(ScenarioError, match="nested deeper than 32 levels"):
        load(str(path))


_values = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text(max_size=8),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_paths = st.sampled_from(["apiVersion", "kind", "metadata", "spec", "spec.services", "spec.services.VllmWorker",
                          "spec.services.VllmWorker.replicas", "spec.services.VllmWorker.resources",
                          "spec.services.VllmWorker.extraPodMetadata", "spec.services.VllmWorker.extraPodSpec",
                          "spec.services.VllmWorker.componentType", "spec.services.Frontend.componentType",
                          "spec.services.VllmWorker.extraPodSpec.tolerations"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_paths, _values)
def test_any_change_to_a_manifest_is_a_scenario_or_one_line_error(path: str, value: Any) -> None:
    manifest = _set(path, value) if value is not None else _set(path, None)
    try:
        parse(yaml.safe_dump(_inline(manifest)), "scenario t.yaml")
    except ScenarioError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("scenario t.yaml: "), exc


def test_the_twin_runs_the_manifest_on_the_tainted_node_it_tolerates(tmp_path: Path) -> None:
    scenario, file = load(str(_files(tmp_path)))
    parts = twin_parts(scenario, file)
    twin = Twin(TwinOptions(spec=parts.spec, root=tmp_path / "twin", window_s=5, manifests=parts.manifests,
                            tenant_pods=parts.tenant_pods, tenant_load=parts.tenant_load,
                            rack_limit_w=parts.rack_limit_w, traffic=parts.traffic)).start()
    try:
        node = twin.api.get("v1", "Node", "twin-gpu-01")
        assert node["spec"]["taints"] == [TAINT], node["spec"]

        def running() -> list[dict[str, Any]]:
            return [p for p in twin.api.list("v1", "Pod") if (p.get("status") or {}).get("phase") == "Running"]

        wait_for(lambda: {"tolerant"} <= {p["metadata"]["name"] for p in running()} and any(
            twin.role_of(p) == "worker" and p["metadata"]["labels"].get("nvidia.com/dynamo-graph-deployment-name")
            == "team-c-chat" for p in running()), "the manifest's worker and the tolerant tenant to run", 90)
        pods = {p["metadata"]["name"]: p for p in twin.api.list("v1", "Pod")}
        on_tainted = sorted(n for n, p in pods.items() if p["spec"].get("nodeName") == "twin-gpu-01")
        chat_gpu = [n for n in on_tainted if n.startswith("team-c-chat-vllmworker-")]
        assert len(chat_gpu) == 1 and "tolerant" in on_tainted, on_tainted
        # Nothing that does not tolerate the taint runs there; the intruder fits only there, so it waits.
        assert all(n in chat_gpu + ["tolerant"] or pods[n]["spec"].get("tolerations") for n in on_tainted), on_tainted
        intruder = pods["intruder"]
        assert "spec" in intruder and not intruder["spec"].get("nodeName"), intruder
        cond = next(c for c in intruder["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["reason"] == "Unschedulable" and "untolerated taint {dedicated: team-c}" in cond["message"], cond
        # Its components have names of their own: the twin knows them by role, serves it and measures it.
        wait_for(lambda: any(f.dgd == "team-c-chat" for f in twin.frontends.values()), "its frontend to start", 60)
        wait_for(lambda: any(w.dgd == "team-c-chat" and w.ttft_ms_current is not None and w.itl_ms_current
                             for w in twin.snapshot_windows()), "a window with its TTFT and ITL", 90)
        worker = chat_gpu[0]
        wait_for(lambda: any(g.pod == worker and g.draw_w > 100 for g in twin.snapshot_samples()[-1].gpus),
                 "its worker to draw power under its load", 60)
    finally:
        twin.stop()


def test_the_report_groups_a_manifests_gpus_by_its_deployment_and_component() -> None:
    from powerfleet.twin.demo.report import cap_group

    assert cap_group("team-c-chat-vllmworker-0a1b2c-3", "VllmWorker") == "team-c-chat/VllmWorker"
    assert cap_group("llm-disagg-prefill-560966-0", "prefill") == "llm-disagg/prefill"
    assert cap_group("batch-a", "worker") == "batch-a/worker"  # a tenant: its own name
    assert cap_group(None, None) == "idle"
