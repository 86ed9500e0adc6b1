"""The guard as its own process (`powerfleet power guard`, power.guard_runner: process; issue 31 item 3).

The loop's deadlines on an injected clock; beat's schedule without guard entries; the command's
refusals; and end to end with real parts: redis-server, a real agent on simulated GPUs, the loopback
API server with the group's node and the pods' deployments, and the guard process, which lowers the
low-priority GPU's cap on its own periods; once it is stopped, the agent falls back to its safe caps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.cluster.dgd import LABEL_DGD_NAME
from powerfleet.config import load_config
from powerfleet.power.loop import Deadlines, run_periods
from powerfleet.testing.waiting import wait_for
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import beat_schedule, create_app
from powerfleet.workers.launcher import Launcher
from tests.agent.conftest import device
from tests.envs import subprocess_env
from tests.integration.conftest import broker_url, redis_server, wait_worker  # noqa: F401 - fixtures
from tests.power.test_live_agent import HIGH, LOW, NODE, pod, publish

GROUPS = "{rack-a: {limit_w: 1000, oversubscription: 1.4}}"


class FakeTime:
    """The loop's clock and wait: ``wait`` moves time on; ``run`` may take time too."""

    def __init__(self, stop_after: int) -> None:
        self.now, self.runs, self.stop_after = 0.0, [], stop_after

    def monotonic(self) -> float:
        return self.now

    def wait(self, s: float) -> bool:
        self.now += s
        return len(self.runs) >= self.stop_after


def test_periods_run_on_fixed_deadlines_whatever_each_run_took() -> None:
    t = FakeTime(stop_after=4)
    took = iter([0.3, 0.9, 0.1, 0.2])

    def run() -> None:
        t.runs.append(t.now)
        t.now += next(took)

    stats = run_periods(1.0, run, t.monotonic, t.wait)
    assert t.runs == pytest.approx([0.0, 1.0, 2.0, 3.0])  # not 0, 1.3, 3.2, ...: no drift
    assert (stats.periods, stats.missed, stats.late) == (4, 0, 0)


def test_a_run_longer_than_periods_skips_them_and_a_late_start_is_counted() -> None:
    t = FakeTime(stop_after=3)
    told: list[tuple[int, float]] = []
    took = iter([2.5, 0.1, 0.1])

    def run() -> None:
        t.runs.append(t.now)
        t.now += next(took)

    stats = run_periods(1.0, run, t.monotonic, t.wait, on_missed=lambda m, late: told.append((m, late)))
    assert t.runs == pytest.approx([0.0, 3.0, 4.0])  # periods 1 and 2 skipped, not run back to back
    assert stats.missed == 2 and told == [(2, 0.0)]

    late = FakeTime(stop_after=2)
    oversleep = iter([0.7])  # the process was not scheduled for 0.7 s past the second deadline

    def wait(s: float) -> bool:
        late.now += s + (next(oversleep, 0.0) if s > 0 else 0.0)
        return len(late.runs) >= late.stop_after

    stats = run_periods(1.0, lambda: late.runs.append(late.now), late.monotonic, wait)
    assert stats.late == 1 and stats.max_lateness_s == pytest.approx(0.7)


def test_deadlines_advance_past_every_deadline_already_gone() -> None:
    d = Deadlines(period_s=2.0, start=10.0)
    assert d.due() == 10.0
    assert d.advance(10.5) == 0 and d.due() == 12.0
    assert d.advance(17.9) == 2 and d.due() == 18.0  # 14 and 16 gone


def test_with_the_process_runner_beat_has_no_guard_entries() -> None:
    env = {"POWERFLEET_BUDGET__GROUPS": GROUPS}
    assert load_config(environ=env).power.guard_runner == "process"  # the default
    assert not [k for k in beat_schedule(load_config(environ=env)) if "guard" in k]
    beat = load_config(environ={**env, "POWERFLEET_POWER__GUARD_RUNNER": "beat"})
    assert "powerfleet-power-guard-rack-a" in beat_schedule(beat)


def test_the_command_refuses_a_second_runner_and_unknown_groups(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "powerfleet.cli", "power", "guard", *args], capture_output=True,
                              text=True, timeout=60, env={**subprocess_env(), "HOME": str(tmp_path), **env})

    beat = run(POWERFLEET_BUDGET__GROUPS=GROUPS, POWERFLEET_POWER__GUARD_RUNNER="beat")
    assert beat.returncode == 2 and "power.guard_runner is 'beat'" in beat.stderr, beat.stderr
    assert "Traceback" not in beat.stderr
    unknown = run("--group", "rack-z", POWERFLEET_BUDGET__GROUPS=GROUPS)  # the default runner: process
    assert unknown.returncode == 2 and "--group: 'rack-z' is not an oversubscribed group" in unknown.stderr
    none = run()
    assert none.returncode == 2 and "no oversubscribed group to guard" in none.stderr, none.stderr


@pytest.fixture
def fleet(tmp_path: Path, broker_url: str) -> Iterator[tuple[dict[str, str], SimulatedGpus, Launcher]]:  # noqa: F811
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.apply({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": NODE, "labels": {"powerfleet.io/rack": "rack-a"}},
                   "status": {"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "2"}}})
        for name, uid, dgd in (("low-0", LOW, "low"), ("high-0", HIGH, "high")):
            body = pod(name, uid)
            body["metadata"]["labels"] = {LABEL_DGD_NAME: dgd}
            api.apply(body)
        env = {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig), "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"),
               "POWERFLEET_AGENT__NAMESPACES": "[llm]", "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc"),
               "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig), "POWERFLEET_BUDGET__GROUPS": GROUPS,
               "POWERFLEET_BUDGET__DEPLOYMENTS": "{llm/low: {power_limit_w: 700, priority: low}, "
                                                 "llm/high: {power_limit_w: 700, priority: high}}",
               # a loaded agent takes an overlay within its 1.5 periods (tests/power/test_live_agent.py)
               "POWERFLEET_POWER__GUARD_PERIOD_S": "4", "POWERFLEET_POWER__CAP_CEILING": "null",
               "POWERFLEET_POWER__GUARD_RUNNER": "process"}
        write_proc_entry(tmp_path / "proc", 101, LOW)
        write_proc_entry(tmp_path / "proc", 102, HIGH)
        gpus = SimulatedGpus.shared(tmp_path / "sim" / f"{NODE}.json",
                                    [device(0, pids=[101]), device(1, pids=[102])])
        with Launcher(log_dir=tmp_path / "logs", env=dict(env)) as launcher:
            yield env, gpus, launcher


def test_the_guard_process_throttles_on_its_own_periods_and_its_stop_leaves_the_agents_at_safe_caps(
        fleet: tuple[dict[str, str], SimulatedGpus, Launcher]) -> None:
    env, gpus, launcher = fleet
    app = create_app(load_config(environ=env))
    r = redis.Redis.from_url(env["POWERFLEET_BROKER__URL"])
    agent = launcher.spawn(NODE, "agent", "--node", NODE, "--metrics-port", "0")
    wait_worker(app, f"agent@{NODE}")

    def limits() -> list[float]:
        return [d.current_w or 0 for d in gpus.devices()]

    wait_for(lambda: limits() == [700, 700], "the agent's first pass (the annotation caps)")
    # The node's telemetry, fresh every second: 2 x 480 W = 960 W, above t1 (950 W) of the 1,000 W limit.
    stop = threading.Event()

    def report() -> None:
        while not stop.is_set():
            publish(SimpleNamespace(r=r), draw_w=480.0, at=float(r.time()[0]))  # type: ignore[arg-type]
            stop.wait(1.0)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        guard = launcher.spawn("guard", "power", "guard", "--metrics-port", "0")
        # the low-priority GPU (its pod's deployment is llm/low) is cut to 700 W x 0.85, the high one kept
        try:
            wait_for(lambda: limits() == [595, 700], "the guard process's overlay to lower the low GPU's cap",
                     timeout_s=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; caps {limits()}; the guard's log:\n{guard.log.read_text()[-3000:]}\n"
                                 f"the agent's:\n{agent.log.read_text()[-3000:]}") from None
        assert "guard: rack-a, a period every 4 s on its own deadlines" in guard.log.read_text()
        launcher.stop_child(guard)
        assert guard.proc.returncode == 0, guard.log.read_text()[-3000:]
        log = guard.log.read_text()
        assert "guard: stopped after" in log and "Traceback" not in log, log[-3000:]
        # no period any more: 1.5 periods after the last overlay the agent takes its safe caps by itself,
        # each GPU's share of the limit (1000 W x 700 / 1400 = 500 W)
        wait_for(lambda: limits() == [500, 500], "the agent's fallback once the guard process stopped", timeout_s=60)
    finally:
        stop.set()
        reporter.join(timeout=10)
    assert "Traceback" not in agent.log.read_text()
