"""`powerfleet demo --scenario FILE` end to end: a short scenario of an operator's own making (a limit
lowered below the pods' minimums, a tenant that waits Pending until another's GPUs are freed, an
agent killed in the middle of a rebalance and started again, a third deployment from the operator's
own DGD manifest file on a tainted node it alone tolerates, judged by TTFT and ITL, and the broker
killed and started again), judged from its JSON summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.envs import subprocess_env
from tests.twin.test_scenario_manifests import CHAT, TAINT

SCENARIO = {
    "version": 1, "name": "operator-what-if", "duration_s": 80,
    "topology": {"racks": {"rack-a": {"limit_w": 9000, "nodes": [{"count": 2, "gpus": 8}]},
                           "rack-b": {"limit_w": 3000, "nodes": [{"count": 1, "gpus": 4, "labels": {"pool": "team-c"},
                                                                  "taints": [TAINT]}]}}},
    "deployments": {"llm-disagg": {"builtin": "llm-disagg", "retune": False},
                    "llm-agg": {"builtin": "llm-agg", "retune": False},
                    "team-c-chat": {"manifest_file": "chat.yaml", "retune": False,
                                    "sla": {"ttft_ms": 60000, "itl_ms": 1000}}},
    "tenants": [{"name": "batch-a", "node": "twin-gpu-01", "gpus": 6, "power_w": 300, "grace_s": 2}],
    "events": [
        {"at": "5%", "kind": "add_tenant", "name": "train-b-arrives",
         "tenant": {"name": "train-b", "gpus": 6, "power_w": 350, "load": 0.6}},
        {"at": "15%", "kind": "propose", "name": "rebalance", "deployment": "llm-disagg",
         "replicas": {"prefill": 1, "decode": 2}},
        {"at": "20%", "kind": "kill_agent", "name": "agent-killed", "node": "twin-gpu-01"},
        {"at": "30%", "kind": "delete_pod", "name": "batch-a-gone", "pod": "batch-a"},
        {"at": "50%", "kind": "set_limit", "name": "limit-below-minimums", "rack": "rack-a", "limit_w": 1200},
        {"at": "60%", "kind": "restart_agent", "name": "agent-back", "node": "twin-gpu-01"},
        {"at": "10%", "kind": "propose", "name": "team-c-grows", "deployment": "team-c-chat",
         "replicas": {"worker": 2}},
        {"at": "70%", "kind": "kill_broker", "name": "broker-killed", "down_s": 2},
    ],
    "checks": ["no_rack_over_limit", "no_unexpected_task_failures", "slo", "events"],
}


@pytest.fixture(scope="module")
def what_if(tmp_path_factory):
    root = tmp_path_factory.mktemp("what-if")
    path = root / "mine.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    (root / "chat.yaml").write_text(yaml.safe_dump(CHAT, sort_keys=False))  # beside the scenario, by path
    env = subprocess_env()
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", "demo", "--scenario", str(path), "--plain",
                          "--report", str(root / "report"), "--json"], env=env, capture_output=True, text=True,
                         timeout=500)
    return out, root / "report"


def _summary(out: subprocess.CompletedProcess[str]) -> dict:
    assert out.stdout.strip(), out.stderr[-3000:]
    return json.loads(out.stdout)


def test_the_summary_answers_for_each_rack_check_and_event(what_if) -> None:
    out, report = what_if
    summary = _summary(out)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert summary == json.loads((report / "summary.json").read_text())
    result = summary["scenario_result"]
    assert result["name"] == "operator-what-if" and summary["nodes"] == 3, result
    assert set(result["checks"]) == {"no_rack_over_limit", "no_unexpected_task_failures", "slo", *(
        e["name"] for e in SCENARIO["events"])}, result["checks"]
    for check in result["checks"].values():
        assert isinstance(check["held"], bool) and check["detail"], check
    # Exit 0 exactly when every check held.
    assert (out.returncode == 0) == result["held"] == all(c["held"] for c in result["checks"].values()), \
        (out.returncode, result["checks"])


def test_the_limit_below_the_minimums_is_recorded_and_those_samples_are_not_judged(what_if) -> None:
    result = _summary(what_if[0])["scenario_result"]
    rack = result["racks"]["rack-a"]
    assert rack["limit_w"] == 1200 and rack["limit_w_min"] == 1200, rack
    assert rack["physical_w_max"] > 1200 and rack["measured_w_max"] > 0, rack
    check = result["checks"]["no_rack_over_limit"]
    assert "minimums exceeded the limit (not judged)" in check["detail"], check
    event = next(e for e in result["events"] if e["name"] == "limit-below-minimums")
    assert event["state"] == "ok" and event["took_effect_s"] >= event["started_s"] >= 0.5 * 60 - 2, event


def test_the_tenant_waits_pending_until_batch_a_is_gone_then_is_scheduled(what_if) -> None:
    events = {e["name"]: e for e in _summary(what_if[0])["scenario_result"]["events"]}
    arrives, gone = events["train-b-arrives"], events["batch-a-gone"]
    assert arrives["state"] == "ok" and arrives["detail"].startswith("scheduled on "), arrives
    assert gone["state"] == "ok", gone
    # Pending from its arrival until batch-a's GPUs were freed.
    assert arrives["started_s"] < gone["started_s"] <= arrives["took_effect_s"], (arrives, gone)


def test_the_agent_killed_mid_rebalance_is_killed_and_comes_back(what_if) -> None:
    out, report = what_if
    events = {e["name"]: e for e in _summary(out)["scenario_result"]["events"]}
    killed, back, rebalance = events["agent-killed"], events["agent-back"], events["rebalance"]
    assert killed["state"] == "ok" and killed["detail"] == "agent of twin-gpu-01 exited -9", killed
    assert rebalance["started_s"] is not None and rebalance["started_s"] <= killed["started_s"], rebalance
    assert back["state"] == "ok" and back["took_effect_s"] > killed["took_effect_s"], back
    assert "a fleet process stopped" not in out.stderr  # the kill is the scenario's, not a crash


def test_the_third_deployment_from_its_manifest_file_is_served_scaled_and_judged(what_if) -> None:
    out, report = what_if
    result = _summary(out)["scenario_result"]
    grows = next(e for e in result["events"] if e["name"] == "team-c-grows")
    # The budget scaled the operator's own DGD by its role (its component is VllmWorker).
    assert grows["state"] == "ok" and "replicas" in grows["detail"], grows
    chat = result["deployments"]["team-c-chat"]
    assert chat["sla_ttft_ms"] == 60000 and chat["sla_itl_ms"] == 1000, chat
    assert chat["windows"] >= 1 and chat["ttft_ms_mean"] is not None, chat
    assert chat["itl_windows"] >= 1 and chat["itl_ms_mean"] is not None and chat["itl_ms_mean"] > 0, chat
    # Its worker GPUs are on the tainted node of rack-b, and nothing else is.
    rack_b = result["racks"]["rack-b"]
    assert rack_b["limit_w"] == 3000 and 0 < rack_b["physical_w_max"] <= 3000, rack_b


def test_the_broker_killed_and_started_again_leaves_every_worker_answering_and_the_checks(what_if) -> None:
    out, _ = what_if
    result = _summary(out)["scenario_result"]
    killed = next(e for e in result["events"] if e["name"] == "broker-killed")
    assert killed["state"] == "ok" and "exited -9, back on its port" in killed["detail"], killed
    assert killed["took_effect_s"] > killed["started_s"], killed
    checks = result["checks"]
    assert checks["no_rack_over_limit"]["held"], checks["no_rack_over_limit"]
    assert checks["no_unexpected_task_failures"]["held"], checks["no_unexpected_task_failures"]
    assert "embedded redis-server exited" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
