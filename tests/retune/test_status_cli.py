"""`powerfleet retune status --json` against the loopback API server and frontends.

The first call runs the real `powerfleet` process; the others run the same Typer app in this
process (typer's CliRunner: exit code, stdout and stderr apart), which spares a Python start
with every import per call (about 2 s each on the shared machine)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import yaml
from typer.testing import CliRunner

from powerfleet.clock import FakeClock
from powerfleet.retune import control
from tests.integration.conftest import run_cli
from tests.retune.conftest import make_ports, retune_config


def cli(*args: str) -> SimpleNamespace:
    """The CLI in this process; an exception that escaped it counts as a traceback on stderr."""
    from powerfleet.cli.main import app

    res = CliRunner().invoke(app, list(args))
    escaped = res.exception is not None and not isinstance(res.exception, SystemExit)
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout,
                           stderr=res.stderr + ("Traceback (escaped)\n" if escaped else ""))


def test_status_shows_leader_mode_decisions_and_convergence(world, kube, redis_url, tmp_path) -> None:
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(1_800_000_000.0, 1.0))
    control.tick_deployment(cfg, ports, "llama", 1_800_000_000.0)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"retune": cfg.model_dump(mode="json")}))
    out = run_cli("--config", str(path), "retune", "status", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (d,) = data["deployments"]
    assert data["schema"] == "powerfleet.retune.status/v1"
    assert d["leader"]["holder"] == "ctl-a" and d["leader"]["term"] == 1 and d["mode"] == "active"
    assert sorted(d["state"]["initial_saved"]) == sorted(fes)
    assert [r["converged"] for r in d["routers"]] == [None, None]  # nothing decided yet: no target
    text = cli("--config", str(path), "retune", "status")
    assert text.returncode == 0 and "leader ctl-a (term 1)" in text.stdout
    assert "desired none" in text.stdout and "windows ended: 0 decided, 0 abandoned, 0 dropped" in text.stdout
    assert "None" not in text.stdout and "{" not in text.stdout


def test_status_without_a_cluster_is_one_line_exit_1(tmp_path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"retune": {"deployments": ["x"], "kubeconfig": str(tmp_path / "missing")}}))
    out = cli("--config", str(path), "retune", "status")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "cannot reach the cluster" in out.stderr


def test_status_says_not_found_for_a_missing_dgd_and_exits_1_when_the_cluster_is_down(tmp_path) -> None:
    from powerfleet.twin.apiserver import ApiServer

    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump({"retune": {"deployments": ["ghost"], "kubeconfig": str(kubeconfig)}}))
        out = cli("--config", str(path), "retune", "status", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["deployments"][0]["dgd"] == "not found"
        text = cli("--config", str(path), "retune", "status")
        # Not "enabled": a configured deployment that does not exist says so and nothing else.
        assert text.stdout == "ghost: not found (in retune.deployments, but no such DynamoGraphDeployment)\n"
    down = cli("--config", str(path), "retune", "status")  # the API server is gone now
    assert down.returncode == 1 and "cannot reach the cluster" in down.stderr and "Traceback" not in down.stderr
