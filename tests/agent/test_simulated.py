"""The simulated backend: device validation, and sharing one node's GPUs between processes."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from powerfleet.agent.gpu import GpuError
from powerfleet.agent.simulated import SimulatedGpus, parse_devices
from tests.agent.conftest import device


@pytest.mark.parametrize("data,msg", [
    ({"x": 1}, "expected a JSON list"),
    ([device(0, min_w=800)], "min_w <= default_w <= max_w"),
    ([device(1)], "indexes must be 0..0"),
    ([device(0), {**device(1), "uuid": "GPU-0000"}], "uuids must be unique"),
    ([{**device(0), "bogus": 1}], "bogus"),
    ([{**device(0), "pids": "x"}], "pids"),
])
def test_bad_device_lists_are_refused_with_the_reason(data, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_devices(data)


def test_current_defaults_to_default_and_out_of_range_set_fails() -> None:
    g = SimulatedGpus([{k: v for k, v in device(0).items() if k != "current_w"}])
    assert g.read(0).current_mw == 700_000
    with pytest.raises(GpuError, match="Invalid Argument"):
        g.set_limit(0, 100_000)


def _twin_starts_process(path: str) -> None:
    gpus = SimulatedGpus.shared(path)

    def start(devs) -> None:
        devs[1].pids = [4242]
        devs[1].draw_w = 612.5
    gpus.update(start)


def test_a_file_shared_by_two_processes_sees_both_sides_changes(tmp_path: Path) -> None:
    path = tmp_path / "sim" / "node-a.json"
    agent_side = SimulatedGpus.shared(path, [device(0), device(1)])
    agent_side.set_limit(0, 300_000)
    p = multiprocessing.get_context("spawn").Process(target=_twin_starts_process, args=(str(path),))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    r1 = agent_side.read(1)
    assert (r1.pids, r1.draw_mw) == ((4242,), 612_500)
    assert agent_side.read(0).current_mw == 300_000  # the twin's write kept the agent's limit
    assert json.loads(path.read_text())["devices"][0]["current_w"] == 300


def test_a_missing_shared_file_is_a_gpu_error(tmp_path: Path) -> None:
    with pytest.raises(GpuError, match="does not exist"):
        SimulatedGpus.shared(tmp_path / "none.json")
