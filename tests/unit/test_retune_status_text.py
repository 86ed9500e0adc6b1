"""`powerfleet retune status` text: windows as clock times, each outcome said once, no "-0.00 %"."""

from __future__ import annotations

from powerfleet.cli.retune_status_cmd import _text
from powerfleet.config.fleet import RetuneConfig


def _deployment(**over):  # type: ignore[no-untyped-def]
    d = {"deployment": "llama", "enabled": True, "mode": "active", "dgd": "found",
         "leader": {"holder": "ctl-a", "term": 2}, "engine_profile": {"name": "p", "source": "built-in"},
         "corrupt_state": None, "routers": [],
         "state": {"desired": {}, "last_window": 6_000_000, "rollback": "none", "pending": [{"window": 6_000_001}],
                   "outcomes": {"decided": 1, "abandoned": 0, "dropped": 0}},
         "decisions": [{"window": 6_000_000, "outcome": "keep", "requests": 70, "confidence": 0.5,
                        "runner_up_margin_pct": -0.0004, "reason": "keep: +0.2 % beats the probe, but temperature moved at window 5999999 (0 -> 0.5)"}]}
    return {**d, **over}


def test_windows_show_as_clock_times_and_the_outcome_once() -> None:
    cfg = RetuneConfig(window_interval_s=300, deployments=["llama"])
    text = _text(_deployment(), cfg)
    # window 6,000,000 of 300 s = [1_800_000_000, 1_800_000_300) = 2027-01-15 08:00:00-08:05:00 UTC
    assert "last window 2027-01-15 08:00:00-08:05:00 UTC (#6000000)" in text
    assert "in flight: 2027-01-15 08:05:00-08:10:00 UTC (#6000001)" in text
    assert "window 2027-01-15 08:00:00-08:05:00 UTC (#6000000): keep: +0.2 % beats the probe, but temperature " \
           "moved at window 2027-01-15 07:55:00-08:00:00 UTC (#5999999) (0 -> 0.5)" in text
    assert "keep: keep:" not in text and "-0.00" not in text and "runner-up 0.00 % behind" in text


def test_a_missing_dgd_is_not_shown_as_enabled() -> None:
    text = _text(_deployment(dgd="not found"), RetuneConfig(deployments=["llama"]))
    assert text == "llama: not found (in retune.deployments, but no such DynamoGraphDeployment)\n"
