"""Every command fails in one line (issue 29, defects 6, 7, 9): the broker dying while `trigger` waits,
Ctrl-C at a wait, FIFOs with no writer behind a file option, and `budget plan`'s errors on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from powerfleet.broker.embedded import EmbeddedRedis
from tests.envs import subprocess_env
from tests.waiting import wait_for

TIMEOUT_ENV = {"POWERFLEET_INPUT_TIMEOUT_S": "1"}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = subprocess_env()
    return {**env, **extra}


def _as_in_a_terminal() -> None:
    # A command run in the foreground of a terminal gets Ctrl-C. A suite started as a background job
    # of a script inherits SIGINT ignored (POSIX shells ignore it for asynchronous commands), and
    # Python then leaves it ignored: the Ctrl-C tests waited 60 s for an exit that never came.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "powerfleet.cli", *args], env=_env(env or {}), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=_as_in_a_terminal)


def _one_line(stderr: str) -> None:
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr


def _waiting_trigger(url: str) -> subprocess.Popen[str]:
    """A trigger waiting for a result no worker will give (nobody consumes control)."""
    proc = _cli("trigger", "powerfleet.fleet.echo", "--timeout", "120", env={"POWERFLEET_BROKER__URL": url})
    r = redis.Redis.from_url(url)
    wait_for(lambda: r.llen("control") >= 1 or proc.poll() is not None, "the echo to be queued", 60)
    assert proc.poll() is None, proc.communicate()
    return proc


def test_the_broker_dying_while_trigger_waits_is_one_line() -> None:
    server = EmbeddedRedis().start()
    try:
        proc = _waiting_trigger(server.url)
    finally:
        server.stop()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (proc.returncode, err)
    assert "broker lost while waiting for the result" in err, err
    _one_line(err)


def test_ctrl_c_while_trigger_waits_is_one_line(broker_url: str) -> None:
    proc = _waiting_trigger(broker_url)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "powerfleet: interrupted" in err, (proc.returncode, err)
    _one_line(err)


def test_ctrl_c_while_a_drain_waits_for_its_answer_is_one_line(broker_url: str) -> None:
    proc = _cli("agent", "drain", "--node", "gpu-quiet", "--force", "--timeout", "120",
                env={"POWERFLEET_BROKER__URL": broker_url})
    r = redis.Redis.from_url(broker_url)
    wait_for(lambda: r.exists("powerfleet:agent:drain:gpu-quiet") or proc.poll() is not None,
             "the drain to be requested", 60)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "powerfleet: interrupted" in err, (proc.returncode, err)
    _one_line(err)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv", [
    ["--config", "{f}", "status"],
    ["trigger", "powerfleet.fleet.echo", "--args", "@{f}"],
    ["budget", "plan", "--input", "{f}"],
    ["validate", "dgd-update", "--old", "{f}", "--new", "{f}"],
    ["agent", "once", "--node", "n1", "--dry-run", "--pods", "{f}"],
    ["power", "whatif", "--trace", "{f}", "--workers", "2", "--gpus-per-worker", "1", "--cap-w", "500",
     "--limit-w", "900"],
])
def test_a_fifo_with_no_writer_fails_in_one_line_after_the_timeout(fifo: Path, argv: list[str]) -> None:
    proc = _cli(*[a.format(f=fifo) for a in argv], env={**TIMEOUT_ENV, "POWERFLEET_BROKER__URL": "redis://127.0.0.1:1/0"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (argv, proc.returncode, err)
    assert "gave no end of input within 1 s" in err, (argv, err)
    _one_line(err)


def test_process_substitution_feeds_agent_once(fifo: Path, tmp_path: Path) -> None:
    """`agent once --pods <(kubectl get pods -o json)`, as docs/agent.md suggests: a pipe is read."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text("[]")
    writer = threading.Thread(target=lambda: fifo.write_text(json.dumps({"kind": "List", "items": []})), daemon=True)
    writer.start()
    proc = _cli("agent", "once", "--node", "n1", "--dry-run", "--pods", str(fifo), "--gpus", str(gpus), "--json",
                env={"POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state")})
    out, err = proc.communicate(timeout=60)
    writer.join(5)
    assert "not a regular file" not in err and "--pods" not in err, err
    assert proc.returncode in (0, 1) and json.loads(out)["node"] == "n1", (proc.returncode, out, err)  # 1: no GPUs


def test_process_substitution_feeds_power_whatif(fifo: Path) -> None:
    lines = "".join(json.dumps({"timestamp": 1000 * i, "input_length": 512, "output_length": 64,
                                "hash_ids": [i]}) + "\n" for i in range(40))
    writer = threading.Thread(target=lambda: fifo.write_text(lines), daemon=True)
    writer.start()
    proc = _cli("power", "whatif", "--trace", str(fifo), "--workers", "2", "--gpus-per-worker", "1",
                "--cap-w", "500", "--limit-w", "900", "--json")
    out, err = proc.communicate(timeout=300)
    writer.join(5)
    assert proc.returncode == 0, (proc.returncode, err)
    assert json.loads(out)["schema"] == "powerfleet.power.whatif/v1", out[:300]


def test_budget_plan_reports_errors_on_stderr(tmp_path: Path) -> None:
    bad = tmp_path / "in.json"
    bad.write_text(json.dumps({"budget": {"power_limit_w": 100}, "extra": 1}))
    proc = _cli("budget", "plan", "--input", str(bad))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == "", (out, err)
    assert err.startswith("powerfleet: error: input 1: roles: Field required"), err
    _one_line(err)
    as_json = _cli("budget", "plan", "--input", str(bad), "--json")
    out, err = as_json.communicate(timeout=60)
    assert as_json.returncode == 2 and json.loads(out)["error"], out  # the JSON answer line stays on stdout
    assert err.startswith("powerfleet: error: input 1: roles: Field required"), err
    _one_line(err)
    two = tmp_path / "two.jsonl"
    two.write_text("{}\n[]\n")
    many = _cli("budget", "plan", "--input", str(two))
    out, err = many.communicate(timeout=60)
    assert many.returncode == 2 and "(and 1 more of 2 inputs; --json answers each)" in err, err
    _one_line(err)
