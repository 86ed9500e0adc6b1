"""With every new mechanism off, the replay equals the one captured before the engine was
split into modules: request for request, bit for bit (tests/sim/golden.py)."""

from __future__ import annotations

import pytest

from .golden import case_names, load_golden, run_case

GOLD = load_golden()


def test_every_case_is_captured() -> None:
    assert sorted(GOLD) == sorted(case_names())


@pytest.mark.parametrize("name", case_names())
def test_replay_equals_the_golden_capture(name: str) -> None:
    got = run_case(name)
    want = GOLD[name]
    for key in want:
        if got[key] != want[key]:
            bad = next((i for i, (a, b) in enumerate(zip(got[key], want[key])) if a != b), None) \
                if isinstance(want[key], list) else None
            pytest.fail(f"{name}: {key} differs (first at request {bad})")
