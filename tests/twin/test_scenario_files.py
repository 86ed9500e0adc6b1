"""Scenario files (twin/demo/scenario_model.py, scenario_load.py): the shipped ones match the shipped JSON
Schema, and hostile input is refused with one line naming the key path, never read forever,
never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerfleet.twin.demo.scenario_load import SCHEMA_PATH, ScenarioError, load, parse, schema_text, shipped

MINIMAL = {"version": 1, "name": "mine",
           "topology": {"racks": {"rack-a": {"limit_w": 9000, "nodes": [{"count": 2, "gpus": 8}]}}},
           "deployments": {"llm-agg": {"builtin": "llm-agg"}}}


def _with(path: str, value: object) -> dict:
    """MINIMAL with ``value`` set at the dotted ``path`` (list indices as numbers)."""
    data = json.loads(json.dumps(MINIMAL))
    keys = path.split(".")
    node: object = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})  # type: ignore[index]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value  # type: ignore[index]
    return data


def _error(data: object) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse(yaml.safe_dump(data), "scenario t.yaml")
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def test_the_shipped_schema_is_generated_from_the_models() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), "regenerate: python -m powerfleet.twin.demo.scenario_load --schema"


@pytest.mark.parametrize("name", shipped())
def test_every_shipped_scenario_validates_against_the_schema_and_the_models(name: str) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    path = SCHEMA_PATH.parent / f"{name}.yaml"
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text())))
    assert not errors, [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]
    scenario, found = load(name)
    assert found == path and scenario.name == name


def test_the_shipped_scenarios_are_the_default_and_the_three_worked_examples() -> None:
    assert set(shipped()) >= {"default", "limit-below-minimums", "tenant-pending", "agent-dies-mid-rebalance"}


@pytest.mark.parametrize("path,value,expect", [
    ("topology.racks.rack-a.colour", "red", "topology.racks.rack-a.colour: Extra inputs are not permitted"),
    ("surprise", 1, "surprise: Extra inputs are not permitted"),
    ("topology.racks.rack-a.nodes.0.gpus", "8", "topology.racks.rack-a.nodes.0.gpus: Input should be a valid integer"),
    ("topology.racks.rack-a.nodes.0.count", 10 ** 30, "topology.racks.rack-a.nodes.0.count: Input should be less"),
    ("topology.racks.rack-a.limit_w", 1e400, "topology.racks.rack-a.limit_w: Input should be a valid integer"),
    ("topology.racks.rack-a.limit_w", True, "topology.racks.rack-a.limit_w: Input should be a valid integer"),
    ("topology.racks.rack-a.nodes.0.model", "NVIDIA A100-SXM4-80GB", "the twin simulates only cards of 200-700 W"),
    ("topology.racks.rack-a.nodes.0.model", "Voodoo 2", "'Voodoo 2' is not in the agent's catalog"),
    ("topology.racks.rack-a.nodes.0.taints", [{"key": "gpu", "effect": "NoWay"}],
     "topology.racks.rack-a.nodes.0.taints.0.effect: Input should be 'NoSchedule', 'PreferNoSchedule' or"),
    ("topology.racks.rack-a.nodes.0.taints", [{"key": "gpu", "effect": "NoSchedule", "colour": 1}],
     "topology.racks.rack-a.nodes.0.taints.0.colour: Extra inputs are not permitted"),
    ("deployments.llm-agg.sla", {"ttft_ms": 500, "itl_ms": -20},
     "deployments.llm-agg.sla.itl_ms: Input should be greater than 0"),
    ("tenants", [{"name": "t", "tolerations": [{"operator": "Maybe"}]}],
     "tenants.0.tolerations.0.operator: Input should be 'Equal' or 'Exists'"),
    ("events", [{"at": 5, "kind": "propose", "deployment": "llm-agg", "replicas": {"decode": 2}}],
     "events.0: llm-agg has no decode role (it has worker)"),
    ("deployments.llm-agg.builtin", "llm-mine", "deployments.llm-agg.builtin: Input should be 'llm-disagg' or"),
    ("events", [{"at": "10%", "kind": "kill_broker", "down_s": 600}],
     "events.0.down_s: Input should be less than or equal to 60"),
    ("events", [{"at": "10%", "kind": "reboot_rack"}], "events.0: Input tag 'reboot_rack' found using 'kind'"),
    ("events", [{"at": "10%", "kind": "set_limit", "rack": "rack-z", "limit_w": 10}],
     "events.0.rack: rack-z is not a rack of the topology"),
    ("events", [{"at": 999, "kind": "flush_redis"}], "events.0.at: 999 s is outside the run (0..180 s)"),
    ("events", [{"at": "150%", "kind": "flush_redis"}], "events.0.at: '150%' is neither seconds nor a share"),
    ("events", [{"at": 5, "kind": "kill_agent", "node": "twin-gpu-07"}], "events.0: twin-gpu-07 is not a node"),
    ("events", [{"at": 5, "kind": "propose", "deployment": "llm-disagg", "replicas": {"decode": 2}}],
     "events.0.deployment: llm-disagg is not a deployment of the scenario"),
    ("tenants", [{"name": "t", "node": "twin-gpu-00", "rack": "rack-a"}], "tenants.0: give node or rack, not both"),
    ("version", 2, "version: Input should be 1"),
])
def test_a_bad_key_is_one_line_naming_its_path(path: str, value: object, expect: str) -> None:
    message = _error(_with(path, value))
    assert message.startswith("scenario t.yaml: ") and expect in message, message
    assert "(top level)" not in message, message


def test_many_nodes_are_refused_by_the_total() -> None:
    data = _with("topology.racks.rack-b", {"nodes": [{"count": 40}]})
    data["topology"]["racks"]["rack-a"]["nodes"][0]["count"] = 30
    assert "70 nodes in all; the twin runs at most 64" in _error(data)


def test_not_yaml_not_a_mapping_too_deep() -> None:
    for text, expect in (("a: [1, 2", "not YAML at line"), ("- 1\n- 2\n", "the top level must be a mapping"),
                         ("a: " + "[" * 40 + "]" * 40, "nested deeper than 32 levels")):
        with pytest.raises(ScenarioError) as exc:
            parse(text, "s")
        assert expect in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_missing_files_directories_big_files_and_binary_are_refused(tmp_path: Path) -> None:
    cases = {tmp_path / "absent.yaml": "No such file or directory", tmp_path: "not a regular file"}
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1024 * 1024 + 1))
    cases[big] = "over the 1048576 byte limit"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    cases[binary] = "not UTF-8 text"
    for path, expect in cases.items():
        with pytest.raises(ScenarioError) as exc:
            load(str(path))
        assert expect in str(exc.value), (path, str(exc.value))
    with pytest.raises(ScenarioError, match="neither a shipped scenario"):
        load("no-such-scenario")


def test_a_fifo_and_a_device_are_refused_without_being_read(tmp_path: Path) -> None:
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(_load_error(str(fifo))), daemon=True)
    reader.start()
    reader.join(timeout=30)  # opening a FIFO for reading would block until a writer came
    assert not reader.is_alive(), "the loader blocked on a FIFO"
    assert "not a regular file" in result[0], result
    assert "not a regular file" in _load_error("/dev/zero")


def _load_error(path: str) -> str:
    try:
        load(path)
    except ScenarioError as exc:
        return str(exc)
    return "loaded"


def test_a_trace_path_must_be_a_regular_file_beside_the_scenario(tmp_path: Path) -> None:
    data = _with("traffic", {"llm-agg": {"trace": "traces/mine.jsonl"}})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert "traffic.llm-agg.trace: " in _load_error(str(path)) and "No such file" in _load_error(str(path))
    (tmp_path / "traces").mkdir()
    os.mkfifo(tmp_path / "traces" / "mine.jsonl")
    assert "not a regular file" in _load_error(str(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=30))
def test_any_yaml_document_is_a_scenario_or_one_line_error(doc: object) -> None:
    try:
        text = yaml.safe_dump({"version": 1, "name": "f", **(doc if isinstance(doc, dict) else {"x": doc})})
    except yaml.YAMLError:
        return
    try:
        parse(text, "f")
    except ScenarioError as exc:
        assert "\n" not in str(exc)


def test_demo_refuses_a_bad_scenario_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text(yaml.safe_dump(_with("topology.racks.rack-a.limit_w", -5)))
    report = tmp_path / "report"
    for cmd in (["demo", "--scenario", str(bad), "--report", str(report)], ["twin", "--scenario", str(bad)]):
        out = subprocess.run([sys.executable, "-m", "powerfleet.cli", *cmd], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (cmd, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert lines == ["powerfleet: error: --scenario: scenario mine.yaml: topology.racks.rack-a.limit_w: "
                         "Input should be greater than or equal to 1"], (cmd, out.stderr)
    assert not report.exists()  # nothing started, not even the report directory


def test_twin_runs_a_scenarios_cluster_and_says_its_events_are_not_run(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--scenario", "tenant-pending", "--json",
                          "--duration", "2", "--dir", str(tmp_path / "twin")], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    manifest = json.loads(out.stdout)
    assert manifest["racks"] == {"rack-a": ["twin-gpu-00", "twin-gpu-01"]}, manifest["racks"]
    assert manifest["rack_budget_w"] == {"rack-a": 9000.0}, manifest
    assert "the scenario's 2 events are not run here" in out.stderr, out.stderr


def test_the_oversubscribe_file_gives_the_guards_plan() -> None:
    from powerfleet.twin.demo.oversubscribe import GuardPlan, group_limit, plan_of, twin_spec

    scenario, _ = load("oversubscribe")
    plan = plan_of(scenario)
    default = GuardPlan()
    assert plan.limit_w == group_limit(twin_spec(0)) == 3308 and plan.ratio == default.ratio, plan
    assert plan.surge[0] == default.surge[0] and abs(plan.surge[1] - default.surge[1]) < 1e-9, plan
    assert plan.loss == default.loss and plan.scale == default.scale and plan.lost_node == "twin-gpu-01", plan
    assert dict(plan.priority) == dict(default.priority), plan


def test_power_guard_needs_its_rack_its_surge_and_its_telemetry_loss() -> None:
    scenario, _ = load("oversubscribe")
    data = scenario.model_dump(mode="json", exclude_none=True)
    data["events"] = data["events"][:1]
    assert "checks: power_guard judges one rack with oversubscription > 1 through one set_load" in _error(data)
