"""Tasks read time from the injectable clock: a worker pointed at a clock file ticks at the file's time.

Window and lease logic is tested at chosen instants this way (tests/retune drive retune.tick
with an explicit ``now`` too), never by hoping no boundary falls between two real ticks.
"""

from powerfleet.clock import FileClock
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker


def test_a_worker_reads_now_from_the_clock_file(launcher: Launcher, app, tmp_path) -> None:
    clock = FileClock(str(tmp_path / "now"))
    clock.set(1_800_000_000.5)
    launcher.env.update({"POWERFLEET_CLOCK_FILE": clock.path, "POWERFLEET_NODES": "[]"})
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@clock")
    wait_worker(app, "ctl@clock")

    assert app.send_task("powerfleet.fleet.reconcile").get(timeout=30)["at"] == 1_800_000_000.5
    clock.set(1_800_000_060.0)  # the next instant the test chooses, in the worker too
    assert app.send_task("powerfleet.fleet.reconcile").get(timeout=30)["at"] == 1_800_000_060.0
