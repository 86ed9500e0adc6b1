"""Beat, workers, agents: the shape of each workload, its command line and its config."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartlib import HELM_SKIP_REASON, env_of, find, objects, one, pod_spec, workloads

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(obj)["containers"]
    return c


def test_beat_is_one_replica_with_recreate(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    beat = one(objects(values), "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert _container(beat)["args"][0] == "beat"


def test_beat_replicas_cannot_be_raised_through_values() -> None:
    beat = one(objects({"beat": {"replicas": 3}, "worker": {"replicas": 2}}), "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1


def test_agent_daemonset_runs_on_gpu_nodes_with_host_pid() -> None:
    ds = one(objects({}), "DaemonSet", "agent")
    spec = pod_spec(ds)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    c = _container(ds)
    assert c["command"] == ["powerfleet"]
    assert c["args"][:3] == ["agent", "--node", "$(NODE_NAME)"]
    node_name = env_of(c)["NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Defined before the args reference it.
    assert [e["name"] for e in c["env"]][0] == "NODE_NAME"
    assert c["securityContext"]["privileged"] is True
    assert "securityContext" not in spec or not spec["securityContext"].get("runAsNonRoot")
    probe = " ".join(c["livenessProbe"]["exec"]["command"])
    assert 'inspect ping -d "agent@${NODE_NAME}"' in probe
    # Node tasks' hard limit is 30 s by default.
    assert spec["terminationGracePeriodSeconds"] > 30


def test_agent_extra_tolerations_keep_the_gpu_toleration() -> None:
    values = {"agent": {"tolerations": [{"key": "x", "operator": "Exists"}], "priorityClassName": "",
                        "runtimeClassName": "nvidia"}}
    spec = pod_spec(one(objects(values), "DaemonSet", "agent"))
    assert spec["tolerations"][0] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert {"key": "x", "operator": "Exists"} in spec["tolerations"]
    assert "priorityClassName" not in spec
    assert spec["runtimeClassName"] == "nvidia"


def test_worker_command_names_the_worker_after_its_pod() -> None:
    worker = one(objects({}), "Deployment", "worker")
    c = _container(worker)
    assert c["command"] == ["powerfleet"]
    args = c["args"]
    assert args[:5] == ["worker", "--queues", "control,sweep", "--name", "fleet@$(POD_NAME)"]
    assert env_of(c)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    probe = " ".join(c["livenessProbe"]["exec"]["command"])
    assert 'celery -A powerfleet.workers.entry inspect ping -d "fleet@${POD_NAME}"' in probe


def test_worker_probe_can_be_switched_off() -> None:
    worker = one(objects({"worker": {"livenessProbe": {"enabled": False}}}), "Deployment", "worker")
    assert "livenessProbe" not in _container(worker)


@pytest.mark.parametrize(("values", "worker_grace", "agent_grace"), [
    ({}, 660 + 60, 30 + 30),                                                        # FleetConfig defaults
    ({"config": {"limits": {"sweep": {"soft_s": 1100, "hard_s": 1200.5},
                            "node": {"soft_s": 40, "hard_s": 45}}}}, 1201 + 60, 45 + 30),
    ({"worker": {"queues": ["control"]}}, 90 + 60, 60),                             # no sweep: control's 90 s
    ({"worker": {"terminationGracePeriodSeconds": 900}, "agent": {"terminationGracePeriodSeconds": 31}}, 900, 31),
])
def test_grace_period_outlasts_the_hard_time_limit(values: dict[str, Any], worker_grace: int, agent_grace: int) -> None:
    objs = objects(values)
    assert pod_spec(one(objs, "Deployment", "worker"))["terminationGracePeriodSeconds"] == worker_grace
    assert pod_spec(one(objs, "DaemonSet", "agent"))["terminationGracePeriodSeconds"] == agent_grace


def test_grace_period_at_or_below_the_hard_limit_fails() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"worker.terminationGracePeriodSeconds \(660\) must exceed"):
        objects({"worker": {"terminationGracePeriodSeconds": 660}})
    with pytest.raises(helm.HelmRenderError, match=r"agent.terminationGracePeriodSeconds \(30\) must exceed"):
        objects({"agent": {"terminationGracePeriodSeconds": 30}})


def test_metrics_port_is_exposed_only_when_enabled() -> None:
    for workload in workloads(objects({})):
        assert "ports" not in _container(workload) or all(
            p["name"] != "metrics" for p in _container(workload)["ports"])
    objs = objects({"metrics": {"port": 9808}})
    exposed = set()
    for workload in workloads(objs):
        ports = {p["name"]: p["containerPort"] for p in _container(workload).get("ports", [])}
        if "metrics" in ports:
            assert ports["metrics"] == 9808
            exposed.add(workload["metadata"]["labels"]["app.kubernetes.io/component"])
    assert exposed == {"beat", "worker", "agent"}
    config = yaml.safe_load(one(objs, "ConfigMap", "config")["data"]["powerfleet.yaml"])
    assert config["metrics"] == {"port": 9808, "address": "0.0.0.0"}


def test_config_is_mounted_and_pods_roll_when_it_changes() -> None:
    objs = objects({})
    cm = one(objs, "ConfigMap", "config")
    sums = set()
    for workload in workloads(objs):
        if workload["metadata"]["labels"]["app.kubernetes.io/component"] == "redis":
            continue
        spec = pod_spec(workload)
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        mounts = {m["name"]: m for m in _container(workload)["volumeMounts"]}
        assert mounts["config"]["mountPath"] == "/etc/powerfleet" and mounts["config"]["readOnly"] is True
        sums.add(workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"])
    assert len(sums) == 1
    changed = one(objects({"config": {"nodes": ["gpu-a"]}}), "Deployment", "worker")
    assert changed["spec"]["template"]["metadata"]["annotations"]["checksum/config"] not in sums


def test_rendered_config_is_a_valid_fleet_config(variant: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    from powerfleet.config import load_config

    _, values = variant
    objs = objects(values)
    path = tmp_path / "powerfleet.yaml"
    path.write_text(one(objs, "ConfigMap", "config")["data"]["powerfleet.yaml"])
    env = {"POWERFLEET_BROKER__URL": "redis://:pw@pf-powerfleet-redis.fleet.svc:6379/0"}
    config = load_config(path, environ=env)
    assert config.broker.url == env["POWERFLEET_BROKER__URL"]
    assert config.nodes == values.get("config", {}).get("nodes", [])
    assert config.metrics.port == values.get("metrics", {}).get("port", 0)


def test_every_command_line_parses_with_the_real_cli(variant: tuple[str, dict[str, Any]]) -> None:
    """Each container's args are accepted by `powerfleet` (checked with --help, so nothing runs)."""
    from typer.testing import CliRunner

    from powerfleet.cli.main import app

    _, values = variant
    runner = CliRunner()
    checked = 0
    for workload in workloads(objects(values)):
        c = _container(workload)
        if c["command"] != ["powerfleet"]:
            continue
        result = runner.invoke(app, [*c["args"], "--help"])
        assert result.exit_code == 0, (c["args"], result.output)
        assert re.search(rf"Usage: \S+ {c['args'][0]} ", result.output), result.output
        checked += 1
    assert checked >= 2


def test_disabled_components_render_nothing() -> None:
    objs = objects({"beat": {"enabled": False}, "worker": {"enabled": False}, "agent": {"enabled": False}})
    assert {o["kind"] for o in objs} == {"ConfigMap", "Secret", "ServiceAccount", "Service", "StatefulSet"}
    assert not find(objs, "Role") and not find(objs, "ClusterRole")
