"""A config file's values are checked even where a POWERFLEET_* variable overrides them; a YAML key given
twice and `.nan` are refused plainly (issue 29, defect 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.config import load_config
from powerfleet.config.fleet import ConfigError
from tests.envs import subprocess_env

INTERVAL = {"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "5"}
URL = {"POWERFLEET_BROKER__URL": "redis://127.0.0.1:6379/0"}


@pytest.mark.parametrize(("yaml_text", "env", "says"), [
    ("beat:\n  reconcile_interval_s: fast\n", INTERVAL, "beat.reconcile_interval_s: Input should be a valid number"),
    ("beat:\n  reconcile_interval_s: -5\n", INTERVAL, "beat.reconcile_interval_s: Input should be greater than"),
    ("beat:\n  reconcile_interval_s: 1e308\n", INTERVAL, "beat.reconcile_interval_s: Input should be less than"),
    ("broker:\n  url: ftp://example.com/x\n", URL, "broker.url: "),
])
def test_a_file_value_an_environment_variable_overrides_is_still_validated(tmp_path: Path, yaml_text, env,
                                                                           says) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as got:
        load_config(path, environ=env)
    message = str(got.value)
    assert message.startswith(f"{path}: {says}") and "overridden by POWERFLEET_" in message, message
    assert "\n" not in message


def test_a_file_completed_by_the_environment_is_judged_as_a_whole(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("beat:\n  reconcile_interval_s: 5\n")
    assert load_config(path, environ=INTERVAL).beat.reconcile_interval_s == 5
    # The variable still wins where both are valid.
    assert load_config(path, environ={"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "7"}).beat.reconcile_interval_s == 7


def test_a_yaml_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("beat:\n  reconcile_interval_s: 5\n  reconcile_interval_s: 6\n")
    with pytest.raises(ConfigError, match=r"line 3: key 'reconcile_interval_s' appears twice$"):
        load_config(path, environ={})
    # A merge key's keys may be overridden, as YAML means.
    merged = tmp_path / "merged.yaml"
    merged.write_text("beat:\n  <<: {reconcile_interval_s: 5, max_loop_interval_s: 5}\n  reconcile_interval_s: 6\n")
    assert load_config(merged, environ={}).beat.reconcile_interval_s == 6


@pytest.mark.parametrize("source", ["file", "env"])
def test_nan_is_reported_as_not_a_number(tmp_path: Path, source: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("beat:\n  reconcile_interval_s: .nan\n" if source == "file" else "{}\n")
    env = {"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": ".nan"} if source == "env" else {}
    with pytest.raises(ConfigError, match=r"beat.reconcile_interval_s: \.nan is not a number$"):
        load_config(path, environ=env)


def test_the_cli_reports_an_overridden_bad_value_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("beat:\n  reconcile_interval_s: fast\n")
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", "--config", str(path), "status"],
                         capture_output=True, text=True, timeout=60,
                         env={**subprocess_env(), **INTERVAL,
                              "POWERFLEET_BROKER__URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 2 and "overridden by POWERFLEET_BEAT__RECONCILE_INTERVAL_S" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=False), st.integers(-10**6, 10**6), st.text(max_size=6)))
def test_any_file_value_under_an_override_is_refused_in_one_line_or_valid_alone(tmp_path_factory, value) -> None:
    path = tmp_path_factory.mktemp("c") / "fleet.yaml"
    path.write_text(yaml.safe_dump({"beat": {"reconcile_interval_s": value}}))
    try:
        load_config(path, environ=INTERVAL)
    except ConfigError as exc:
        assert "\n" not in str(exc) and "reconcile_interval_s" in str(exc), str(exc)
        return
    load_config(path, environ={})  # accepted under the override: valid on its own too
