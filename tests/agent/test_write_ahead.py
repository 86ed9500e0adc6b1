"""Issue 32 items 4 and 5: a state record that cannot be lost (write-ahead intent, a persisted
revision) and sets addressed by UUID. The simulated driver raises pynvml's own classes."""

from __future__ import annotations

import pytest

from powerfleet.agent.simulated import SimDevice
from powerfleet.agent.state import Record, StateStore
from tests.agent.conftest import Bench


class Killed(BaseException):
    """SIGKILL, as far as the pass can tell: nothing after this line of the agent runs."""


def test_a_kill_between_the_set_and_the_save_leaves_no_cap_without_an_owner(bench: Bench,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 5: the state was saved after the set, so a kill in between left a cap no record owned."""
    bench.pod("job", "300", pids=(101,))
    bench.set_pids(0, [101])
    real = bench.gpus.set_limit

    def set_then_die(index: int, milliwatts: int, **kw: object) -> None:
        real(index, milliwatts, **kw)
        raise Killed()
    monkeypatch.setattr(bench.gpus, "set_limit", set_then_die)
    with pytest.raises(Killed):
        bench.agent().run_pass()
    monkeypatch.undo()
    assert bench.limits()[0] == 300
    bench.pods.clear()
    bench.pod("next", None, pids=(301,))  # the next tenant asks for nothing
    bench.set_pids(0, [301])
    g0 = bench.agent().run_pass().gpus[0]
    assert (g0.decision, g0.action) == ("release", "set") and bench.limits()[0] == 700, g0


def test_a_record_that_cannot_be_written_refuses_the_new_cap_and_counts_it(bench: Bench,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 5: save failing with ENOSPC left caps no record owned."""
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])

    def disk_full(*_a: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("powerfleet.agent.files.os.replace", disk_full)
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    assert (g0.action, g0.error_kind) == ("error", "state") and "No space left" in (g0.error or ""), g0
    assert bench.limits()[0] == 700 and bench.metrics.value("powerfleet_agent_state_write_failures_total") >= 1
    monkeypatch.undo()
    assert agent.run_pass().gpus[0].cap_w == 300 and bench.state.load().uuids == {"GPU-0000"}


def test_the_revision_is_persisted_and_monotonic_whatever_the_wall_clock_does(bench: Bench) -> None:
    """Finding 8: the cap-intent revision restarted from wall-clock time."""
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    first = bench.agent().run_pass().gpus[0].revision
    assert first is not None
    bench.clock.t -= 86_400  # the next agent starts with a clock a day behind
    bench.pods[0].annotations["dynamo.nvidia.com/gpu-power-limit"] = "350"
    second = bench.agent().run_pass().gpus[0]
    assert second.cap_w == 350 and second.revision is not None and second.revision > first, (first, second)


def swap_gpus(devs: list[SimDevice]) -> None:
    """A re-enumeration: the two GPUs trade indexes (what can happen across nvmlInit)."""
    a, b = devs[0].model_dump(), devs[1].model_dump()
    devs[0], devs[1] = SimDevice(**{**b, "index": 0}), SimDevice(**{**a, "index": 1})


def test_a_reenumeration_between_read_and_set_never_caps_the_other_gpu(bench: Bench,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 6: the set went to whatever GPU had the index, the evidence said the intended one."""
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    real = bench.gpus.set_limit

    def reenumerated_first(index: int, milliwatts: int, **kw: object) -> None:
        monkeypatch.setattr(bench.gpus, "set_limit", real)
        bench.gpus.update(swap_gpus)
        real(index, milliwatts, **kw)
    monkeypatch.setattr(bench.gpus, "set_limit", reenumerated_first)
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    by_uuid = {d.uuid: d.current_w for d in bench.gpus.devices()}
    assert by_uuid == {"GPU-0000": 700, "GPU-0001": 700}, by_uuid  # nothing capped the unmanaged GPU
    assert (g0.action, g0.error_kind, g0.enforced_w) == ("error", "moved", None), g0
    g1 = agent.run_pass().gpus[1]  # the next pass finds it at its new index
    assert (g1.uuid, g1.cap_w) == ("GPU-0000", 300), g1
    assert {d.uuid: d.current_w for d in bench.gpus.devices()} == {"GPU-0000": 300, "GPU-0001": 700}


def test_a_first_pass_fsyncs_its_record_once_and_the_next_agent_reads_the_same(
        bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 3 of this round: the first pass fsynced the record twice (the write-ahead, then the
    same GPUs confirmed), four fsyncs. The write-ahead now carries the targets it plans, so the
    confirmation means what the file already says and is written without fsync (its loss to a
    crash leaves the write-ahead, which the next agent reads the same)."""
    import powerfleet.agent.files as files

    for i, cap in ((0, "300"), (1, "350")):
        bench.pod(f"p{i}", cap, pids=(101 + i,))
        bench.set_pids(i, [101 + i])
    fsyncs: list[int] = []
    real_fsync = files.os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    durable: list[str] = []  # the text of every fsynced save
    real_save = StateStore.save

    def save(self: StateStore, record: Record, **kw: bool) -> None:
        if kw.get("durable", True):
            durable.append(record.dump())
        real_save(self, record, **kw)
    monkeypatch.setattr(StateStore, "save", save)
    agent = bench.agent()
    report = agent.run_pass()
    assert [g.action for g in report.gpus] == ["set", "set"] and bench.limits() == [300, 350], report
    assert len(fsyncs) == 2, fsyncs  # one save: the file and its directory
    loaded = bench.state.load()
    assert (loaded.record.managed, dict(loaded.record.targets)) == ({"GPU-0000", "GPU-0001"},
                                                                     {"GPU-0000": 300_000, "GPU-0001": 350_000}), loaded
    # A crash loses the unsynced confirmation: the fsynced write-ahead is on disk instead. The next
    # agent reads the same GPUs managed at the same targets, for the same owners.
    assert len(durable) == 1, durable
    confirmed = bench.state.path.read_text()
    bench.state.path.write_text(durable[0])
    ahead = bench.state.load()
    assert (ahead.uuids, ahead.record.targets, ahead.record.owners) == (
        loaded.uuids, loaded.record.targets, loaded.record.owners), (durable[0], confirmed)
    bench.state.path.write_text(confirmed)
    fsyncs.clear()
    assert agent.run_pass().good and fsyncs == [], fsyncs  # a steady pass writes nothing


def test_a_set_that_fails_after_the_write_ahead_is_withdrawn_on_disk(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.gpus.fail(0, "set")
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    assert (g0.action, g0.write) == ("error", "failed") and agent.managed == set(), g0
    loaded = bench.state.load()
    assert set(loaded.uuids) == set() and dict(loaded.record.targets) == {}, loaded
