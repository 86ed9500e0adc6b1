"""A short hypothesis run over every parser of outside input (bench/fuzz.py runs them longer)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.testing.fuzz_targets import SEEDS, TARGETS


def _inputs(name: str) -> st.SearchStrategy[bytes]:
    seeds = SEEDS[name]
    mutated = st.tuples(st.sampled_from(seeds), st.binary(max_size=40), st.integers(0, 200)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2]:])
    return st.binary(max_size=300) | st.sampled_from(seeds) | mutated | st.text(max_size=200).map(str.encode)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_parser_answers_or_raises_its_own_error(name: str) -> None:
    @settings(max_examples=150, deadline=None)
    @given(data=_inputs(name))
    def run(data: bytes) -> None:
        TARGETS[name](data)

    run()
