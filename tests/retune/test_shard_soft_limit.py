"""A sweep shard whose soft time limit fires before its replay (building its ports on a very loaded
machine) returns a reported failure, not an unexpected exception: a demo's
`no_unexpected_task_failures` and Flower's failure count stay for real failures."""

from __future__ import annotations

import logging

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from powerfleet.config import FleetConfig
from powerfleet.tasks import retune as retune_tasks
from powerfleet.workers.app import create_app

SPEC = {"dgd": "llm", "window": 3, "window_file": "llm/w3.jsonl.gz", "window_sha256": "0" * 64, "kind": "shard",
        "index": 0, "points": [{"overlap_score_credit": 1.0, "prefill_load_scale": 1.0, "temperature": 0.0}],
        "objective": "ttft_mean", "replicas": 2}


def test_a_soft_limit_before_the_replay_is_a_failed_shard_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(FleetConfig.model_validate({"broker": {"url": "redis://127.0.0.1:1/0"}}))

    def slow_ports(task, at=None):  # noqa: ANN001, ANN202 - the limit fires while the ports are built
        raise SoftTimeLimitExceeded()
    monkeypatch.setattr(retune_tasks, "ports_for", slow_ports)
    with caplog.at_level(logging.WARNING, logger="powerfleet.retune"):
        result = app.tasks["powerfleet.sweep.shard"](sid="llm:3:0:1", spec=SPEC)
    assert result["status"] == "failed" and result["summary"].startswith(
        "skipped: failed: the soft time limit was reached before the replay"), result
    assert len(result["key"]) > 8
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "before the replay" in lines[0], lines


def test_other_errors_before_the_replay_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(FleetConfig.model_validate({"broker": {"url": "redis://127.0.0.1:1/0"}}))

    def broken(task, at=None):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug")
    monkeypatch.setattr(retune_tasks, "ports_for", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        app.tasks["powerfleet.sweep.shard"](sid="llm:3:0:1", spec=SPEC)
