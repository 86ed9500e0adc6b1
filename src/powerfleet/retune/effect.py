"""Sweep axes that cannot change a replay, found from the router's own cost code.

The KV router picks the worker of least cost (``sim/router.py``)::

    cost(w) = prefill_load_scale * adj(w) + active_blocks(w) + active_request_weight * active(w)

and its pick depends on the costs only up to a positive factor: ``Router.select`` takes the
minimum (ties to the lowest index, or a seeded draw among equal costs), or samples a softmax
over the costs normalised to their range. So a knob that multiplies every worker's whole cost,
with nothing added beside it, does nothing: every positive value of it replays the same. The
disaggregated prefill router books no active blocks (``sim.disagg.PrefillRouter``), so with
``decode_active_request_weight`` 0 its cost is ``prefill_load_scale * adj`` alone, and the
decode stage never sees the scale (``sim.decode.decode_policy``): sweeping the scale there
replays one candidate six times, and its tied copies made moves that changed nothing.

Rather than naming that case, ``pure_scales`` asks the simulator's routers: it routes a few
requests with shared prefixes through the deployment's router under the current settings
and, at every arrival, compares each worker's cost with the knob at each other value. A knob
is a pure scale when those costs are the current ones times (value / current) on every
worker at every step, every value is positive, and the decode stage's settings do not depend
on it. An aggregated router keeps its block term, so nothing is found there and aggregated
sweeps are unchanged.

Exactness: for values that are powers of two apart (the default grid) the scaled costs are
exact and the replays identical; for other ratios they agree to rounding, which could move
a softmax draw sitting on a boundary by an ulp (never seen).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.decode import decode_policy
from powerfleet.sim.disagg import PrefillRouter
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.request import Req
from powerfleet.sim.router import Router

_BT = 16  # block tokens of the probe's caches
_WORKERS = 3
_REQUESTS = 12


def _probe_router(disaggregated: bool, policy: RouterPolicy, options: RouterOptions | None) -> Router:
    caches = [BlockCache(10_000, _BT) for _ in range(_WORKERS)]
    for w, cache in enumerate(caches):  # different cached prefixes, so the credit terms differ per worker
        for h in range(100 * w, 100 * w + 1 + 2 * w):
            cache.blocks[h] = 1
    cls = PrefillRouter if disaggregated else Router
    return cls(policy, caches, _BT, seed=0, options=options)


def _requests() -> list[Req]:
    out = []
    for i in range(_REQUESTS):
        w = i % _WORKERS
        hashes = tuple(range(100 * w, 100 * w + 1 + i % 4))
        out.append(Req(i, float(i), _BT * len(hashes) + 7 * i + 3, 1, hashes))
    return out


def _proportional(a: list[float], b: list[float], ratio: float) -> bool:
    return all(math.isclose(y, x * ratio, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a, b))


def pure_scales(current: RouterPolicy, axes: Iterable[tuple[str, list[float]]], *, disaggregated: bool,
                options: RouterOptions | None = None) -> list[str]:
    """The knobs among ``axes`` (name, values; those with one value are skipped) that only
    scale the router's whole cost, so every value of them replays as the current one."""
    out = []
    for knob, values in axes:
        cur = float(getattr(current, knob))
        others = [v for v in values if v != cur]
        if not others or cur <= 0 or any(v <= 0 for v in values):
            continue  # a zero scale makes every cost equal: that does change the pick
        alts = [current.model_copy(update={knob: v}) for v in others]
        if any(decode_policy(p) != decode_policy(current) for p in alts):
            continue
        rt = _probe_router(disaggregated, current, options)
        scale_only = True
        for r in _requests():
            base, _ = rt.costs(r, r.arrival)
            for p in alts:
                rt.set_policy(p)
                got, _ = rt.costs(r, r.arrival)
                if not _proportional(base, got, float(getattr(p, knob)) / cur):
                    scale_only = False
            rt.set_policy(current)
            if not scale_only:
                break
            rt.route(r, r.arrival)  # pending prefill and active requests build up on the workers
        if scale_only:
            out.append(knob)
    return out
