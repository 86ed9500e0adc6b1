"""powerfleet.heap.paused_gc: the collector is off inside and restored after, however it ends."""

import gc

import pytest

from powerfleet.heap import paused_gc


def test_the_collector_is_off_inside_and_back_on_after_even_when_the_body_raises() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("a read failed")
    assert gc.isenabled()


def test_a_pause_inside_a_pause_leaves_it_off_until_the_outer_one_ends() -> None:
    @paused_gc()
    def inner() -> bool:
        return gc.isenabled()

    with paused_gc():
        assert inner() is False
        assert not gc.isenabled(), "the inner pause turned the collector back on"
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
