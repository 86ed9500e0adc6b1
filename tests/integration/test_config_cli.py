"""A malformed config file fails at start: exit 2, one line naming the file and the dotted key."""

import pytest

from tests.integration.conftest import run_cli


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("beat:\n  reconcile_interval_s: -3\n", "beat.reconcile_interval_s: Input should be greater than 0"),
        ("beat:\n  reconcile_intervall_s: 3\n", "beat.reconcile_intervall_s: unknown key"),
        ("flower:\n  port: seventy\n", "flower.port: Input should be a valid integer"),
        ("limits:\n  sweep:\n    soft_s: 10\n    hard_s: 5\n", "limits.sweep: Value error, soft_s must be less than hard_s"),
        ("nodes: [gpu_01]\n", "nodes: Value error, 'gpu_01' is not a valid Kubernetes node name"),
        ("broker: [1, 2\n", "line 2"),
        ("- just\n- a list\n", "top level must be a mapping"),
    ],
)
def test_malformed_config_exits_2_naming_file_and_key(tmp_path, text, expected) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(text)
    for command in (["status"], ["up"]):
        out = run_cli("--config", str(cfg), *command)
        assert out.returncode == 2, (command, out.stderr)
        assert str(cfg) in out.stderr and expected in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_environment_override_errors_name_the_variable(tmp_path) -> None:
    out = run_cli("status", env={"POWERFLEET_BEAT__BUDGET_INTERVAL_S": "soon"})
    assert out.returncode == 2
    assert "POWERFLEET_BEAT__BUDGET_INTERVAL_S: beat.budget_interval_s" in out.stderr


def test_missing_config_file(tmp_path) -> None:
    out = run_cli("--config", str(tmp_path / "absent.yaml"), "status")
    assert out.returncode == 2
    assert "absent.yaml: cannot read config file" in out.stderr
