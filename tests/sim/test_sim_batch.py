"""The worker's batch and step model alone (powerfleet.sim.batch), hand-computed."""

from __future__ import annotations

import pytest

from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile

P = default_profile()


def first_tokens(reqs: list[tuple[float, int, int]], max_tokens: int = 8192) -> list[float]:
    res = simulate([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs],
                   [tuple(range(1000 * k, 1000 * k + -(-r[1] // 512))) for k, r in enumerate(reqs)],
                   1, RouterPolicy(), P, EngineConfig(max_num_batched_tokens=max_tokens), 1)
    return res.first_token_ms


def test_a_long_prompt_is_prefilled_in_chunks_capped_at_the_token_budget() -> None:
    assert first_tokens([(0.0, 20_000, 1)]) == [pytest.approx(2 * P.prefill_ms(8192) + P.prefill_ms(3616))]
    assert first_tokens([(0.0, 8192, 1)]) == [pytest.approx(P.prefill_ms(8192))]
    assert first_tokens([(0.0, 8193, 1)]) == [pytest.approx(P.prefill_ms(8192) + P.prefill_ms(1))]


def test_the_budget_is_shared_fcfs_between_prompts_in_one_step() -> None:
    got = first_tokens([(0.0, 5000, 1), (0.0, 5000, 1)], 8192)
    # A was alone when the worker started: step 1 is A's 5000; step 2 is B's 5000
    assert got == [pytest.approx(P.prefill_ms(5000)), pytest.approx(2 * P.prefill_ms(5000))]
    got = first_tokens([(0.0, 6000, 1), (0.0, 6000, 1)], 4096)
    # A: 4096 | A 1904 + B 2192 | B 3808
    p1, p2, p3 = P.prefill_ms(4096), P.prefill_ms(4096), P.prefill_ms(3808)
    assert got == [pytest.approx(p1 + p2), pytest.approx(p1 + p2 + p3)]


def test_each_decoding_sequence_takes_one_token_of_the_budget() -> None:
    # A decodes while B's 8192-token prompt arrives: B gets 8191 tokens, then 1
    a_ttft = P.prefill_ms(512)
    got = first_tokens([(0.0, 512, 100), (a_ttft, 8192, 1)])
    t = a_ttft + P.prefill_ms(8191) + P.decode_ms(1, 513)
    t += P.prefill_ms(1) + P.decode_ms(1, 514)
    assert got[1] == pytest.approx(t)
