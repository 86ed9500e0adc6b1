"""Beat, workers, agents: the shape of each workload, its command line and its config."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartlib import (
    HELM_SKIP_REASON,
    annotations_of,
    component_of,
    env_of,
    find,
    objects,
    one,
    pod_spec,
    workloads,
)

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


def test_beat_has_no_replicas_value() -> None:
    with pytest.raises(helm.HelmValuesError, match="additional properties 'replicas' not allowed"):
        objects({"beat": {"replicas": 3}})


def test_agent_daemonset_runs_on_gpu_nodes_with_host_pid() -> None:
    ds = one(objects({}), "DaemonSet", "agent")
    spec = pod_spec(ds)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    c = _container(ds)
    assert c["command"] == ["powerfleet"]
    assert c["args"][:3] == ["agent", "--node", "$(NODE_NAME)"]
    node_name = env_of(c)["NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Defined before the args reference it.
    assert [e["name"] for e in c["env"]][0] == "NODE_NAME"
    assert c["securityContext"]["privileged"] is True
    assert "securityContext" not in spec or not spec["securityContext"].get("runAsNonRoot")
    # Node tasks' hard limit is 30 s by default; shutdown restores caps, so at least 60 s.
    assert spec["terminationGracePeriodSeconds"] >= 60


def test_agent_state_and_proc_are_host_paths_and_named_in_its_config() -> None:
    objs = objects({"agent": {"stateDir": "/var/lib/pf-agent", "safeDefaultWatts": 450}})
    ds = one(objs, "DaemonSet", "agent")
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    mounts = {m["name"]: m for m in _container(ds)["volumeMounts"]}
    assert volumes["state"]["hostPath"] == {"path": "/var/lib/pf-agent", "type": "DirectoryOrCreate"}
    assert mounts["state"]["mountPath"] == "/var/lib/pf-agent" and not mounts["state"].get("readOnly")
    assert volumes["host-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    agent_cfg = yaml.safe_load(one(objs, "ConfigMap", "config")["data"]["agent.yaml"])["agent"]
    assert agent_cfg["state_dir"] == mounts["state"]["mountPath"]
    assert agent_cfg["proc_root"] == mounts["host-proc"]["mountPath"]
    assert agent_cfg["safe_default_watts"] == 450
    assert volumes["config"]["configMap"]["items"] == [{"key": "agent.yaml", "path": "powerfleet.yaml"}]


def test_agent_is_ready_over_http_and_has_no_liveness_probe() -> None:
    objs = objects({})
    c = _container(one(objs, "DaemonSet", "agent"))
    assert "livenessProbe" not in c and "startupProbe" not in c
    probe = c["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": "probe"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    agent_cfg = yaml.safe_load(one(objs, "ConfigMap", "config")["data"]["agent.yaml"])["agent"]
    # The kubelet probes the pod IP, so the agent binds every address on that port.
    assert agent_cfg["probe_port"] == ports["probe"] == 8081
    assert agent_cfg["probe_address"] == "0.0.0.0"


def test_agent_resources_are_small_and_guaranteed() -> None:
    resources = _container(one(objects({}), "DaemonSet", "agent"))["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS needs requests == limits"
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_agent_extra_tolerations_keep_the_gpu_toleration() -> None:
    values = {"agent": {"tolerations": [{"key": "x", "operator": "Exists"}], "priorityClassName": "",
                        "runtimeClassName": ""}}
    spec = pod_spec(one(objects(values), "DaemonSet", "agent"))
    assert spec["tolerations"][0] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert {"key": "x", "operator": "Exists"} in spec["tolerations"]
    assert "priorityClassName" not in spec
    assert "runtimeClassName" not in spec


def test_worker_command_names_the_worker_after_its_pod() -> None:
    worker = one(objects({}), "Deployment", "worker")
    c = _container(worker)
    assert c["command"] == ["powerfleet"]
    args = c["args"]
    assert args[:5] == ["worker", "--queues", "control,sweep", "--name", "fleet@$(POD_NAME)"]
    assert env_of(c)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    probe = " ".join(c["livenessProbe"]["exec"]["command"])
    assert 'celery -A powerfleet.workers.entry inspect ping -d "fleet@${POD_NAME}"' in probe


def test_sweep_pool_consumes_only_sweep_and_calls_no_api() -> None:
    volume = {"persistentVolumeClaim": {"claimName": "traces"}}
    objs = objects({"sweepWorker": {"enabled": True, "replicas": 4, "concurrency": 8},
                    "worker": {"queues": ["control"]}, "retune": {"enabled": True, "traceVolume": volume}})
    pool = one(objs, "Deployment", "sweep-worker")
    assert pool["spec"]["replicas"] == 4
    c = _container(pool)
    assert c["args"][:5] == ["worker", "--queues", "sweep", "--name", "fleet@$(POD_NAME)"]
    assert c["args"][c["args"].index("--concurrency") + 1] == "8"
    spec = pod_spec(pool)
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "pf-powerfleet-sweep-worker"
    assert spec["terminationGracePeriodSeconds"] == 660 + 60
    assert "traces" in {v["name"] for v in spec["volumes"]}  # the shards read the window
    bound = {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]}
    assert "pf-powerfleet-sweep-worker" not in bound
    assert one(objs, "PodDisruptionBudget", "sweep-worker")["spec"]["selector"] == pool["spec"]["selector"]
    # The control pool keeps its API access and a control-sized grace period.
    worker = one(objs, "Deployment", "worker")
    assert pod_spec(worker)["automountServiceAccountToken"] is True
    assert pod_spec(worker)["terminationGracePeriodSeconds"] == 90 + 60
    assert not find(objects({}), "Deployment", "sweep-worker")
    # With the window kept in Redis only the control workers (the cut) need the volume.
    redis_store = objects({"sweepWorker": {"enabled": True}, "worker": {"queues": ["control"]},
                           "retune": {"enabled": True, "traceVolume": volume},
                           "config": {"retune": {"window_store": "redis"}}})
    assert "traces" not in {v["name"] for v in pod_spec(one(redis_store, "Deployment", "sweep-worker"))["volumes"]}
    assert "traces" in {v["name"] for v in pod_spec(one(redis_store, "Deployment", "worker"))["volumes"]}


def test_worker_probe_can_be_switched_off() -> None:
    worker = one(objects({"worker": {"livenessProbe": {"enabled": False}}}), "Deployment", "worker")
    assert "livenessProbe" not in _container(worker)


@pytest.mark.parametrize(("values", "worker_grace", "agent_grace"), [
    ({}, 660 + 60, 30 + 30),                                                        # FleetConfig defaults
    ({"config": {"limits": {"sweep": {"soft_s": 1100, "hard_s": 1200.5},
                            "node": {"soft_s": 40, "hard_s": 45}}}}, 1201 + 60, 45 + 30),
    ({"worker": {"queues": ["control"]}}, 90 + 60, 60),                             # no sweep: control's 90 s
    ({"worker": {"terminationGracePeriodSeconds": 900}, "agent": {"terminationGracePeriodSeconds": 61}}, 900, 61),
])
def test_grace_period_outlasts_the_hard_time_limit(values: dict[str, Any], worker_grace: int, agent_grace: int) -> None:
    objs = objects(values)
    assert pod_spec(one(objs, "Deployment", "worker"))["terminationGracePeriodSeconds"] == worker_grace
    assert pod_spec(one(objs, "DaemonSet", "agent"))["terminationGracePeriodSeconds"] == agent_grace


def test_grace_period_at_or_below_the_hard_limit_fails() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"worker.terminationGracePeriodSeconds \(660\) must exceed"):
        objects({"worker": {"terminationGracePeriodSeconds": 660}})
    with pytest.raises(helm.HelmRenderError, match=r"agent.terminationGracePeriodSeconds \(70\) must exceed"):
        objects({"agent": {"terminationGracePeriodSeconds": 70},
                 "config": {"limits": {"node": {"soft_s": 60, "hard_s": 80}}}})


def test_metrics_port_is_exposed_only_when_enabled() -> None:
    for workload in workloads(objects({"metrics": {"port": 0}})):
        assert all(p["name"] != "metrics" for p in _container(workload).get("ports", []))
    objs = objects({})
    exposed = set()
    for workload in workloads(objs):
        ports = {p["name"]: p["containerPort"] for p in _container(workload).get("ports", [])}
        if "metrics" in ports:
            assert ports["metrics"] == 9808
            exposed.add(component_of(workload))
    # The agent serves its metrics on its probe port, beside /readyz.
    assert exposed == {"beat", "worker"}
    config = yaml.safe_load(one(objs, "ConfigMap", "config")["data"]["fleet.yaml"])
    assert config["metrics"] == {"port": 9808, "address": "0.0.0.0"}


def _checksum(objs: list[dict[str, Any]], kind: str, component: str) -> str:
    return annotations_of(one(objs, kind, component))["checksum/config"]


def test_each_pod_mounts_its_own_config_file_and_rolls_only_when_it_changes() -> None:
    objs = objects({})
    cm = one(objs, "ConfigMap", "config")
    assert set(cm["data"]) == {"fleet.yaml", "agent.yaml"}
    files = {}
    for workload in workloads(objs):
        component = component_of(workload)
        if component == "redis":
            assert "checksum/config" not in annotations_of(workload)
            continue
        vols = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        (item,) = vols["config"]["configMap"]["items"]
        assert item["path"] == "powerfleet.yaml"
        files[component] = item["key"]
        mounts = {m["name"]: m for m in _container(workload)["volumeMounts"]}
        assert mounts["config"]["mountPath"] == "/etc/powerfleet" and mounts["config"]["readOnly"] is True
    assert files == {"beat": "fleet.yaml", "worker": "fleet.yaml", "agent": "agent.yaml"}

    # A retune setting rolls the workers and beat, not the agents.
    retuned = objects({"config": {"retune": {"window_interval_s": 600}}})
    assert _checksum(retuned, "Deployment", "worker") != _checksum(objs, "Deployment", "worker")
    assert _checksum(retuned, "Deployment", "beat") != _checksum(objs, "Deployment", "beat")
    assert _checksum(retuned, "DaemonSet", "agent") == _checksum(objs, "DaemonSet", "agent")
    # An agent setting rolls the agents, not the workers.
    capped = objects({"agent": {"safeDefaultWatts": 400}})
    assert _checksum(capped, "DaemonSet", "agent") != _checksum(objs, "DaemonSet", "agent")
    assert _checksum(capped, "Deployment", "worker") == _checksum(objs, "Deployment", "worker")
    # What both read (the reconcile interval) rolls both.
    faster = objects({"config": {"beat": {"reconcile_interval_s": 5}}})
    assert _checksum(faster, "DaemonSet", "agent") != _checksum(objs, "DaemonSet", "agent")
    assert _checksum(faster, "Deployment", "worker") != _checksum(objs, "Deployment", "worker")


def test_agent_config_holds_only_the_sections_the_agent_reads(tmp_path: Path) -> None:
    from powerfleet.config import load_config

    values = {"config": {"retune": {"window_interval_s": 600}, "beat": {"reconcile_interval_s": 5},
                         "nodes": ["gpu-a"]}}
    data = one(objects(values), "ConfigMap", "config")["data"]
    agent = yaml.safe_load(data["agent.yaml"])
    assert set(agent) == {"agent", "beat", "nodes"}
    path = tmp_path / "agent.yaml"
    path.write_text(data["agent.yaml"])
    config = load_config(path, environ={"POWERFLEET_BROKER__URL": "redis://:pw@r:6379/0"})
    assert config.beat.reconcile_interval_s == 5 and config.nodes == ["gpu-a"]
    assert config.retune.window_interval_s != 600  # left out: the agent does not read it


@pytest.mark.parametrize("file", ["fleet.yaml", "agent.yaml"])
def test_rendered_config_is_a_valid_fleet_config(variant: tuple[str, dict[str, Any]], tmp_path: Path,
                                                 file: str) -> None:
    from powerfleet.config import load_config

    _, values = variant
    data = one(objects(values), "ConfigMap", "config")["data"]
    if file not in data:
        assert values.get("agent", {}).get("enabled") is False
        return
    path = tmp_path / "powerfleet.yaml"
    path.write_text(data[file])
    env = {"POWERFLEET_BROKER__URL": "redis://:pw@pf-powerfleet-redis.fleet.svc:6379/0"}
    config = load_config(path, environ=env)
    assert config.broker.url == env["POWERFLEET_BROKER__URL"]
    assert config.nodes == values.get("config", {}).get("nodes", [])
    if file == "fleet.yaml":
        assert config.metrics.port == values.get("metrics", {}).get("port", 9808)
    else:
        assert config.agent.safe_default_watts == values.get("agent", {}).get("safeDefaultWatts", 500)
        assert config.agent.namespaces == values.get("agent", {}).get("namespaces", [])


def test_every_command_line_parses_with_the_real_cli(variant: tuple[str, dict[str, Any]]) -> None:
    """Each container's args are accepted by `powerfleet` (checked with --help, so nothing runs)."""
    from typer.testing import CliRunner

    from powerfleet.cli.main import app

    _, values = variant
    runner = CliRunner()
    checked = 0
    for c in (c for workload in workloads(objects(values)) for c in pod_spec(workload)["containers"]):
        if c["command"] != ["powerfleet"]:
            continue
        result = runner.invoke(app, [*c["args"], "--help"])
        assert result.exit_code == 0, (c["args"], result.output)
        assert re.search(rf"Usage: \S+ {c['args'][0]} ", result.output), result.output
        checked += 1
    assert checked >= 2


def test_disabled_components_render_nothing() -> None:
    objs = objects({"beat": {"enabled": False}, "worker": {"enabled": False}, "agent": {"enabled": False}})
    assert {component_of(o) for o in objs} == {"config", "redis"}
    assert not find(objs, "Role") and not find(objs, "ClusterRole")


def test_the_agents_config_carries_the_oversubscribed_groups_and_the_power_section(tmp_path: Path) -> None:
    # the agent accepts the guard's overlays only for groups its own config oversubscribes (docs/power.md)
    from powerfleet.config import load_config

    budget = {"groups": {"rack-a": 28000, "rack-b": 9000}, "group_oversubscription": {"rack-a": 1.3}}
    values = {"config": {"budget": budget, "power": {"guard_period_s": 2}, "nodes": ["gpu-a"]}}
    data = one(objects(values), "ConfigMap", "config")["data"]
    agent = yaml.safe_load(data["agent.yaml"])
    assert agent["budget"] == {"groups": {"rack-a": 28000}, "group_oversubscription": {"rack-a": 1.3}}, agent
    path = tmp_path / "agent.yaml"
    path.write_text(data["agent.yaml"])
    config = load_config(path, environ={"POWERFLEET_BROKER__URL": "redis://:pw@r:6379/0"})
    assert config.budget.oversubscribed() == {"rack-a": 28000} and config.power.guard_period_s == 2
    # a budget setting that is no oversubscription does not roll the agents; none oversubscribed: no budget
    objs = objects(values)
    other = objects({"config": {**values["config"], "budget": {**budget, "max_settable_gpu_w": 900}}})
    assert _checksum(other, "DaemonSet", "agent") == _checksum(objs, "DaemonSet", "agent")
    plain = objects({"config": {**values["config"], "budget": {"groups": {"rack-a": 28000}}}})
    assert "budget" not in yaml.safe_load(one(plain, "ConfigMap", "config")["data"]["agent.yaml"])


def test_the_guard_runs_as_its_own_deployment_only_with_the_process_runner() -> None:
    # config.power.guard_runner: process, the default (docs/power.md): beat has no guard entries, this
    # process keeps them; only where a group is oversubscribed (with none it would have nothing to guard)
    groups = {"budget": {"groups": {"rack-a": 28000}, "group_oversubscription": {"rack-a": 1.3}}, "nodes": ["gpu-a"]}
    assert not find(objects({"config": {**groups, "power": {"guard_runner": "beat"}}}), "Deployment", "guard")
    plain = {"budget": {"groups": {"rack-a": 28000}}, "nodes": ["gpu-a"]}
    assert not find(objects({"config": plain}), "Deployment", "guard")
    assert not find(objects({"config": {**plain, "budget": {**plain["budget"], "group_oversubscription": {"rack-a": 1.0}}}}),
                    "Deployment", "guard")
    objs = objects({"config": groups, "guard": {"loglevel": "DEBUG"}})
    guard = one(objs, "Deployment", "guard")
    assert guard["spec"]["replicas"] == 1 and guard["spec"]["strategy"]["type"] == "Recreate"
    assert _container(guard)["args"] == ["power", "guard", "--loglevel", "DEBUG"]
    # under the worker's ServiceAccount, whose group-budget grant lists the group's nodes and pods
    worker = one(objs, "Deployment", "worker")
    assert pod_spec(guard)["serviceAccountName"] == pod_spec(worker)["serviceAccountName"]
    assert pod_spec(guard)["automountServiceAccountToken"] is True
    assert not find(objs, "ServiceAccount", "guard")
