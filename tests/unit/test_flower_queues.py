"""Flower's Consumers column: which live worker consumes each queue, and when to inspect again."""

from __future__ import annotations

from powerfleet.cli.flower_queues import consumers_by_queue, needs_inspection, queue_rows

NOW = 1_800_000_000.0


def _info(*queues: str, at: float = NOW) -> dict:
    return {"active_queues": [{"name": q, "exchange": {"name": q}} for q in queues], "timestamp": at}


def test_each_queue_names_its_live_workers() -> None:
    inspected = {"ctl@a": _info("control", "sweep"), "ctl@b": _info("sweep"), "agent@n1": _info("node.n1"),
                 "agent@n2": _info("node.n2"), "odd@x": {"stats": {}}, "bad@y": {"active_queues": [None, {"name": 3}]}}
    assert consumers_by_queue(inspected, offline={"agent@n2"}) == {
        "control": ["ctl@a"], "node.n1": ["agent@n1"], "sweep": ["ctl@a", "ctl@b"]}
    rows = queue_rows([{"name": "sweep", "messages": 0}, {"name": "node.n2", "messages": 4}],
                      consumers_by_queue(inspected, offline={"agent@n2"}))
    assert rows == [{"name": "sweep", "messages": 0, "consumers": "ctl@a, ctl@b"},
                    {"name": "node.n2", "messages": 4, "consumers": "none"}]


def test_inspect_again_when_a_live_worker_is_missing_or_the_cache_is_old() -> None:
    cache = {"ctl@a": _info("control", at=NOW - 5)}
    assert not needs_inspection(cache, alive={"ctl@a"}, now=NOW)
    assert needs_inspection(cache, alive={"ctl@a", "agent@late"}, now=NOW)  # started after Flower looked
    assert needs_inspection(cache, alive={"ctl@a"}, now=NOW + 60)  # too old to trust
    assert needs_inspection({}, alive=set(), now=NOW)  # Flower has seen nobody yet
    assert not needs_inspection(cache, alive=set(), now=NOW)  # no heartbeats yet: the cache is all there is
    # A dead worker stays in Flower's cache with an old reply: it is not waited for.
    assert not needs_inspection({**cache, "gone@b": _info("sweep", at=NOW - 3600)}, alive={"ctl@a"}, now=NOW)
