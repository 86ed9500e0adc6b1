"""The uninstall drain: a pre-delete hook Job that runs `powerfleet agent drain --all` before Helm
deletes the agents, with a ServiceAccount that has no token and no RBAC (it talks to Redis only)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts.chartlib import HELM_SKIP_REASON, env_of, find, objects, one

pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)


def hook(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return one(objects(values or {}), "Job", "agent-drain")


def test_a_pre_delete_hook_drains_every_live_agent_and_is_kept_only_when_it_failed() -> None:
    job = hook()
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-delete"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["powerfleet"]
    assert c["args"] == ["agent", "drain", "--all", "--json", "--timeout", "120", "--ttl", "3600"]
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 1
    # Within Helm's default 5 min uninstall timeout, and past the drain's own wait.
    assert 120 < job["spec"]["activeDeadlineSeconds"] <= 300
    assert "POWERFLEET_BROKER__URL" in env_of(c) and env_of(c)["POWERFLEET_CONFIG"]["value"].endswith("powerfleet.yaml")


def test_the_hook_has_no_token_no_rbac_and_no_privilege(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    jobs = find(objs, "Job", "agent-drain")
    if values.get("agent", {}).get("enabled", True) is False:
        assert jobs == []
        return
    (job,) = jobs
    spec = job["spec"]["template"]["spec"]
    sa = one(objs, "ServiceAccount", "agent-drain")
    assert spec["serviceAccountName"] == sa["metadata"]["name"] == "pf-powerfleet-agent-drain"
    assert spec["automountServiceAccountToken"] is False and sa["automountServiceAccountToken"] is False
    bound = {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]}
    assert sa["metadata"]["name"] not in bound
    assert spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    assert c["resources"]["limits"]["memory"]


def test_the_hook_command_parses_with_the_real_cli() -> None:
    from typer.testing import CliRunner

    from powerfleet.cli.main import app

    args = hook()["spec"]["template"]["spec"]["containers"][0]["args"]
    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0 and "--all" in result.output, result.output


def test_the_hook_can_be_switched_off_and_follows_its_values() -> None:
    assert not find(objects({"agent": {"uninstallDrain": {"enabled": False}}}), "Job")
    job = hook({"agent": {"uninstallDrain": {"timeoutSeconds": 200, "holdSeconds": 600}}})
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-4:] == ["--timeout", "200", "--ttl", "600"]
    assert job["spec"]["activeDeadlineSeconds"] == 260
