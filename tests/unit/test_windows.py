"""Epoch-aligned retune windows."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.retune.windows import (
    dedupe_key,
    first_launchable_index,
    last_closed_window,
    window,
    window_at,
    windows_to_launch,
)

intervals = st.integers(min_value=1, max_value=86400)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(t=times, interval=intervals, data=st.data())
def test_window_contains_its_time_and_has_the_right_bounds(t, interval, data) -> None:
    phase = data.draw(st.integers(min_value=0, max_value=interval - 1))
    w = window_at(t, interval, phase)
    assert w.start <= t < w.end
    assert w.start == phase + w.index * interval
    assert w.end - w.start == interval


@given(t=times, interval=intervals, data=st.data())
def test_a_restarted_process_computes_the_same_windows(t, interval, data) -> None:
    # Windows are a function of (time, interval, phase) alone: any instant of a window, seen
    # by any process at any time, names the same window, and its index gives it back.
    phase = data.draw(st.integers(min_value=0, max_value=interval - 1))
    w = window_at(t, interval, phase)
    other = data.draw(st.floats(min_value=w.start, max_value=w.end, exclude_max=True, allow_nan=False))
    assert window_at(other, interval, phase) == w
    assert window(w.index, interval, phase) == w
    assert window_at(w.end, interval, phase).index == w.index + 1


def test_first_window_after_enable_is_skipped() -> None:
    # Enabled at 1,005 s, inside window 16 = [960, 1020): that window holds pre-enable traffic.
    assert first_launchable_index(1005, 60) == 17
    assert windows_to_launch(now=1070, enabled_at=1005, last_launched=None, interval_s=60) == []
    due = windows_to_launch(now=1125, enabled_at=1005, last_launched=None, interval_s=60)
    assert [(w.index, w.start, w.end) for w in due] == [(17, 1020, 1080)]


def test_launching_the_same_window_twice_is_a_no_op() -> None:
    first = windows_to_launch(now=1200, enabled_at=1000, last_launched=None, interval_s=60)
    assert len(first) == 1
    again = windows_to_launch(now=1201, enabled_at=1000, last_launched=first[0].index, interval_s=60)
    assert again == []
    # The key is what every beat and worker agree on in Redis: pinned, not just self-equal.
    assert dedupe_key("llama", first[0].index) == f"powerfleet:retune:launched:llama:{first[0].index}"
    assert len({dedupe_key("llama", 1), dedupe_key("llama", 2), dedupe_key("qwen", 2)}) == 3


def test_after_downtime_only_the_newest_closed_window_launches() -> None:
    due = windows_to_launch(now=10_000, enabled_at=1000, last_launched=20, interval_s=60)
    assert [w.index for w in due] == [last_closed_window(10_000, 60).index]


@pytest.mark.parametrize(("interval", "phase"), [(0, 0), (-5, 0), (60, 60), (60, -1), (math.inf, 0)])
def test_invalid_window_parameters_are_rejected(interval, phase) -> None:
    with pytest.raises(ValueError):
        window_at(100, interval, phase)
