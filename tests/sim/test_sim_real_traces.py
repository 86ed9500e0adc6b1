"""Checks on the real Mooncake traces (shared/traces beside the clone), on short slices."""

from __future__ import annotations

import pytest

from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.replay import replay
from powerfleet.sim.trace import read_trace

from .conftest import need_trace


@pytest.fixture(scope="module")
def conversation():
    return read_trace(need_trace("conversation_trace.jsonl.gz"))


@pytest.fixture(scope="module")
def synthetic():
    return read_trace(need_trace("synthetic_trace.jsonl"))


def test_conversation_trace_reads_whole(conversation) -> None:
    assert len(conversation.requests) == 12031 and not conversation.issues


@pytest.mark.parametrize("which, window", [("conversation", (0, 600)), ("synthetic", (0, 300))])
def test_cache_aware_routing_beats_cache_blind(which, window, conversation, synthetic) -> None:
    reqs = (conversation if which == "conversation" else synthetic).requests
    aware = replay(reqs, 8, RouterPolicy(overlap_score_credit=1.0, temperature=0.0), window=window)
    blind = replay(reqs, 8, RouterPolicy(overlap_score_credit=0.0, temperature=0.0), window=window)
    assert aware.requests == blind.requests > 0
    assert aware.cache_hit_rate > blind.cache_hit_rate
    assert aware.ttft_ms.mean < blind.ttft_ms.mean
    for s in (aware, blind):
        assert s.completed + s.dropped == s.requests
        assert s.ttft_ms.mean <= s.e2e_ms.mean


def test_a_missing_shared_trace_fails_under_ci(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        need_trace("conversation_trace.jsonl.gz", tmp_path)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        need_trace("conversation_trace.jsonl.gz", tmp_path)
