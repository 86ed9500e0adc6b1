"""Against NVIDIA Dynamo's own replay (optional extra ``[peer]``; skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.sim import peer
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.trace import read_trace

from .conftest import DATA

pytestmark = pytest.mark.skipif(not peer.available(), reason="ai-dynamo-runtime (the [peer] extra) not installed")
P = default_profile()


def test_nearest_rank_percentiles_are_dynamos_definition() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert (peer.nearest_rank(xs, 50), peer.nearest_rank(xs, 90), peer.nearest_rank(xs, 91)) == (5.0, 9.0, 10.0)


def test_the_timing_table_gives_the_same_engine(tmp_path: Path) -> None:
    # one request alone: Dynamo's TTFT is powerfleet's prefill time of its prompt
    from powerfleet.sim.trace import TraceRequest

    table = peer.write_timing_table(P, tmp_path / "t.npz")
    reqs = [TraceRequest(0.0, 1000, 11, (1, 2))]
    dyn = peer.run_peer(reqs, 1, RouterPolicy(), table=table, kv_blocks=2187)
    ours = peer.run_ours(reqs, 1, RouterPolicy())
    assert dyn.mean_ttft_ms == pytest.approx(ours.mean_ttft_ms, rel=1e-4)


def test_default_policy_mean_ttft_lies_in_the_peers_band_widened_by_3pct(tmp_path: Path) -> None:
    reqs = read_trace(DATA / "conversation_0_180.jsonl.gz").requests
    table = peer.write_timing_table(P, tmp_path / "t.npz")
    band = [peer.run_peer(reqs, 8, RouterPolicy(), table=table, kv_blocks=2187).mean_ttft_ms for _ in range(4)]
    ours = peer.run_ours(reqs, 8, RouterPolicy()).mean_ttft_ms
    assert min(band) * 0.97 <= ours <= max(band) * 1.03, (ours, band)


def test_a_disaggregated_request_costs_the_same_in_both(tmp_path: Path) -> None:
    # one request alone through a prefill pool, the KV transfer and a decode pool: prefill +
    # transfer + the first decode step, in both replays (both at 64 and at 6.4 GB/s)
    from powerfleet.sim.disagg import Pools
    from powerfleet.sim.trace import TraceRequest

    table = peer.write_timing_table(P, tmp_path / "t.npz")
    reqs = [TraceRequest(0.0, 4096, 11, tuple(range(8)))]
    for link in (64.0, 6.4):
        pools = Pools(2, 2, kv_transfer_gb_s=link)
        dyn = peer.run_peer(reqs, 4, RouterPolicy(), table=table, kv_blocks=2187, pools=pools)
        ours = peer.run_ours(reqs, 4, RouterPolicy(), pools=pools)
        assert dyn.mean_ttft_ms == pytest.approx(ours.mean_ttft_ms, rel=1e-6)


def test_disaggregated_mean_ttft_lies_in_the_peers_band_widened_by_3pct(tmp_path: Path) -> None:
    from powerfleet.sim.disagg import Pools

    reqs = read_trace(DATA / "conversation_0_180.jsonl.gz").requests
    table = peer.write_timing_table(P, tmp_path / "t.npz")
    pools = Pools(4, 4)
    band = [peer.run_peer(reqs, 8, RouterPolicy(), table=table, kv_blocks=2187, pools=pools).mean_ttft_ms
            for _ in range(4)]
    ours = peer.run_ours(reqs, 8, RouterPolicy(), pools=pools).mean_ttft_ms
    assert min(band) * 0.97 <= ours <= max(band) * 1.03, (ours, band)
