"""Null and power of the retune decision rule (issue 33 item 2; figures in docs/retune.md).

Each window: 16 paired batches; every candidate's per-batch difference with the probe is
independent noise of N % of the probe's score (the review's model); for the power rows one
candidate is 5 % better. Two rules on the same windows:

* ``chosen``: the candidate best on its mean, tested alone (a paired test of the one already
  chosen: the rule before the correction; the sign-flip test with one candidate);
* ``live``: ``retune.decision.decide`` with the live guard (max-t over every candidate).

Both need the 1 % minimum gain. Printed: the share of windows that apply, and for the power
rows the share that apply the candidate really better.

Usage: python bench/retune_selection.py [--windows 1000] [--grids 1,12,108] [--noise 2,3,4] [--seed 33]
"""

from __future__ import annotations

import argparse

import numpy as np

from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.guard import NoiseGuard
from powerfleet.retune.selection import maxt_confidence

BATCHES = 16
GAIN = 0.05


def sweep(rng: np.random.Generator, grid: int, noise: float, gain: float) -> tuple[list[Candidate], Candidate]:
    load = 1000.0 * (1 + rng.uniform(-0.5, 0.5, BATCHES))
    rel = rng.normal(0.0, noise, (grid, BATCHES))
    rel[0] += gain
    probe = Candidate(params={"i": -1.0}, score=float(load.mean()), batches=load.tolist(), requests=400)
    cands = [Candidate(params={"i": float(i)}, score=float((load * (1 - r)).mean()), batches=(load * (1 - r)).tolist(),
                       requests=400) for i, r in enumerate(rel)]
    return cands, probe


def chosen_rule(cands: list[Candidate], probe: Candidate, guard: NoiseGuard, min_pct: float) -> bool:
    best = min(cands, key=lambda c: float(c.score))  # type: ignore[arg-type]
    conf = maxt_confidence([best.batches], probe.batches, maximize=False)[0]
    gain = (float(probe.score) - float(best.score)) / float(probe.score) * 100  # type: ignore[arg-type]
    return conf is not None and conf >= guard.confidence and gain > min_pct


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=1000)
    ap.add_argument("--grids", default="1,12,108")
    ap.add_argument("--noise", default="2,3,4")
    ap.add_argument("--seed", type=int, default=33)
    a = ap.parse_args()
    guard, min_pct = NoiseGuard(), 1.0
    rng = np.random.default_rng(a.seed)
    print(f"{a.windows} windows per row; {BATCHES} batches; guard {guard}; min gain {min_pct:g} %")
    print(f"{'grid':>5} {'noise':>6} | {'null chosen':>11} {'null live':>9} | {'5% chosen':>9} {'5% live':>8} {'right':>6}")
    for grid in (int(g) for g in a.grids.split(",")):
        for noise in (float(n) / 100 for n in a.noise.split(",")):
            nc = nl = pc = pl = right = 0
            for _ in range(a.windows):
                cands, probe = sweep(rng, grid, noise, 0.0)
                nc += chosen_rule(cands, probe, guard, min_pct)
                nl += decide(cands, probe, "ttft", min_pct, guard=guard).action == "apply"
                cands, probe = sweep(rng, grid, noise, GAIN)
                pc += chosen_rule(cands, probe, guard, min_pct)
                d = decide(cands, probe, "ttft", min_pct, guard=guard)
                pl += d.action == "apply"
                right += d.action == "apply" and d.params == {"i": 0.0}
            w = a.windows
            print(f"{grid:>5} {noise * 100:>5.0f}% | {nc / w:>11.1%} {nl / w:>9.1%} | {pc / w:>9.1%} {pl / w:>8.1%} "
                  f"{right / max(pl, 1):>6.1%}", flush=True)


if __name__ == "__main__":
    main()
