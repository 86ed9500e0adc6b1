"""`powerfleet up` runs the whole fleet in the foreground and Ctrl-C stops it cleanly; `demo` exits 0."""

import json
import os
import re
import signal
import subprocess
import sys

import redis

from powerfleet.beat.ticklog import TickLog
from tests.waiting import wait_for


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERFLEET_")}
    env.update(extra)
    return env


def test_up_starts_everything_and_ctrl_c_stops_it(tmp_path) -> None:
    from powerfleet.broker.embedded import free_loopback_port

    env = _clean_env(POWERFLEET_BEAT__RECONCILE_INTERVAL_S="1", POWERFLEET_NODES="[up-node]",
                     POWERFLEET_FLOWER__PORT=str(free_loopback_port()))
    err = tmp_path / "up.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "powerfleet.cli", "up", "--log-dir", str(tmp_path / "logs")],
                                env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        url = wait_for(lambda: (m := re.search(r"embedded redis-server at (\S+)", err.read_text())) and m.group(1),
                       "up to start its embedded Redis")
        ticks = TickLog(redis.Redis.from_url(url))
        wait_for(lambda: len(ticks.origins("reconcile")) >= 2, "two reconcile ticks", timeout_s=60)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the foreground process
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = err.read_text()
    assert "stopping fleet" in text and "Traceback" not in text
    for log in ("worker", "beat", "flower", "agent-up-node"):
        assert (tmp_path / "logs" / f"{log}.log").exists()
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        raise AssertionError("the embedded Redis still answers after up stopped")
    except redis.ConnectionError:
        pass


def test_demo_runs_every_tick_family_and_exits_0() -> None:
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", "demo", "--duration", "12", "--json"],
                         env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["schema"] == "powerfleet.demo/v1"
    assert all(n >= 1 for n in summary["ticks"].values()), summary
    assert "demo finished" in out.stderr and "reconcile tick #1" in out.stderr
