"""The twin's power model: each GPU's draw follows its load and never exceeds its cap.

Shapes from ../shared/research/power_sim.md: an idle H100 draws about 70 W; prefill is
compute-bound and would draw near TDP at full load; decode is memory-bound and peaks near
380 W whatever its cap; an aggregated worker mixes the two. Under a cap below that demand
the GPU runs at the cap and its steps slow down by the simulator's cap curve
(``powerfleet.sim.CapCurve``), which the frontends' engine model applies to latency.

Pure: no clock, no I/O; the caller passes the load and a random generator for the ±5 W
telemetry noise NVML's 1-second average has.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from powerfleet.sim.profile import CapCurve
from powerfleet.twin.cluster.topology import GPU_DEFAULT_W

IDLE_W = 70.0
# Draw at full load, uncapped, per role (W).
DEMAND_W = {"prefill": 690.0, "decode": 380.0, "worker": 600.0}
NOISE_W = 5.0


@dataclass(frozen=True)
class GpuPower:
    draw_w: float
    demand_w: float  # what the load would draw without a cap
    capped: bool  # the cap is binding (NVML's SW_POWER_CAP throttle reason)
    speed: float  # throughput fraction under this cap (1.0 when not binding)


def gpu_power(role: str | None, load: float, cap_w: float, rng: random.Random | None = None,
              curve: CapCurve | None = None) -> GpuPower:
    """Draw of one GPU. ``role`` None: no pod on it (idle). ``load`` in [0, 1] is clamped."""
    load = min(max(load, 0.0), 1.0)
    noise = rng.uniform(-NOISE_W, NOISE_W) if rng is not None else 0.0
    if role is None:
        demand = IDLE_W
    else:
        peak = DEMAND_W.get(role, DEMAND_W["worker"])
        demand = IDLE_W + (peak - IDLE_W) * load
    demand = max(0.0, demand + noise)
    capped = demand > cap_w
    draw = min(demand, cap_w)
    speed = 1.0
    if role is not None and capped:
        curve = curve or CapCurve()
        fraction = max(cap_w / GPU_DEFAULT_W, curve.static_floor + 1e-3)
        speed = curve.prefill_throughput(fraction) if role == "prefill" else curve.decode_throughput(fraction)
    return GpuPower(draw, demand, capped, speed)


def load_of(tokens_per_s: float, capacity_tokens_per_s: float) -> float:
    """Utilisation from a token rate against what the GPU can process; clamped to [0, 1]."""
    if capacity_tokens_per_s <= 0:
        return 0.0
    return min(max(tokens_per_s / capacity_tokens_per_s, 0.0), 1.0)
