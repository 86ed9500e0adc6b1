"""The guard's view of the agents' per-GPU reports, behind a small port (docs/power.md, "Live").

The node agents publish one Redis hash per node, ``powerfleet:enforcement:<node>`` (docs/budget.md,
"Enforcement reports"): field = GPU UUID, value = JSON with at least ``draw_w`` (measured draw,
NVML's 1-second average) and ``at`` (epoch seconds). The guard also reads, where present, the
cap the pod requested (``requested_w``; else the post-clamp ``target_w``; else ``enforced_w``)
and the card's range (``min_w``, ``max_w``). Where a field is missing the reading is taken
conservatively: the request falls back to a lower figure that may already be throttled (the guard
then never releases above it), a missing minimum is the request itself (the group's floor is
counted high, so a doubtful group is refused rather than guarded on a guess), a missing maximum
is the request. Anything malformed is no reading, never an error. A report without a draw
(``draw_w: null``: NVML could not read it) is kept with ``draw_w`` None: the guard counts that
GPU as lost (power/sensors.py), never forgets it. An idle GPU (no pod, no requested cap) is
reported with ``idle`` set: the guard cannot throttle it (the agent leaves idle GPUs alone), so
it leaves the guarded set. ``enforced_w`` is the limit last read back (else ``current_w``): what
a GPU can draw if its agent dies now. ``pod_uids``: every pod on the GPU (a shared GPU takes the
lowest priority among them). A GPU whose pods carry no cap (decision
``release``) or whose cap the agent holds (``hold``) is not throttled by the overlay either: it is
read as a fixed load, its range pinned at the limit it has.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

REPORT_KEY = "powerfleet:enforcement:{node}"  # the same hash the budget ledger reads (budget/evidence.py)
MAX_REPORT_BYTES = 64 * 1024
UNTHROTTLED = ("release", "hold")  # the agent's decisions under which it applies no overlay


@dataclass(frozen=True)
class GpuTelemetry:
    """One GPU's last report, as the guard uses it (watts, epoch seconds)."""

    gpu: str
    node: str
    pod_uid: str
    cap_w: float
    min_w: float
    max_w: float
    draw_w: float | None  # None: the agent could not read it
    at: float
    enforced_w: float | None = None
    pod_uids: tuple[str, ...] = ()
    idle: bool = False


def _watts(data: dict[str, Any], key: str) -> float | None:
    v = data.get(key)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) and f >= 0 else None


def parse_telemetry(node: str, gpu: str, raw: str | bytes) -> GpuTelemetry | None:
    """One hash field; None for anything that is not a usable report."""
    if not gpu or len(raw) > MAX_REPORT_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    pod = data.get("pod_uid")
    listed = data.get("pods") if isinstance(data.get("pods"), list) else []
    uids = {p["uid"] for p in listed if isinstance(p, dict) and isinstance(p.get("uid"), str) and p["uid"]}
    pods = tuple(sorted(uids | ({pod} if isinstance(pod, str) and pod else set())))
    draw, at = _watts(data, "draw_w"), _watts(data, "at")
    if at is None:
        return None
    if not pods and _watts(data, "requested_w") is None and _watts(data, "target_w") is None:
        # No pod holds the GPU and none asks for a cap: an idle GPU, which the agent leaves alone
        # (it draws idle power whatever the overlay says). It is outside the guarded set; its idle
        # draw belongs in the reserve below the group's limit, as the budget keeps it (docs/power.md).
        return GpuTelemetry(gpu=gpu, node=node, pod_uid="", cap_w=0.0, min_w=0.0, max_w=0.0, draw_w=draw, at=at,
                            idle=True)
    cap = next((w for k in ("requested_w", "target_w", "enforced_w") if (w := _watts(data, k))), None)
    if cap is None:
        return None
    lo, hi = _watts(data, "min_w"), _watts(data, "max_w")
    lo = cap if lo is None or lo <= 0 else lo
    hi = cap if hi is None or hi <= 0 else hi
    if data.get("decision") in UNTHROTTLED:
        # The agent applies no overlay to this GPU (agent/reconcile.py: its pods carry no cap, or it
        # holds the cap for processes it cannot attribute): a fixed load at the limit it has, which
        # the guard fits the others around and never counts as throttled.
        cap = next((w for k in ("enforced_w", "current_w", "requested_w") if (w := _watts(data, k))), cap)
        lo = hi = cap
    if lo > hi:
        return None
    enforced = next((w for k in ("enforced_w", "current_w") if (w := _watts(data, k))), None)
    return GpuTelemetry(gpu=gpu, node=node, pod_uid=pod if isinstance(pod, str) else "", cap_w=cap, min_w=lo,
                        max_w=hi, draw_w=draw, at=at, enforced_w=enforced, pod_uids=pods)


class TelemetryReader(Protocol):
    def read(self, nodes: Iterable[str]) -> dict[str, list[GpuTelemetry]]:
        """node -> its GPUs' last reports, idle GPUs included (a node without a report: absent)."""


class RedisTelemetry:
    """One pipelined HGETALL per node."""

    def __init__(self, client: Any) -> None:
        self._r = client

    def read(self, nodes: Iterable[str]) -> dict[str, list[GpuTelemetry]]:
        names = sorted(set(nodes))
        pipe = self._r.pipeline(transaction=False)
        for n in names:
            pipe.hgetall(REPORT_KEY.format(node=n))
        out: dict[str, list[GpuTelemetry]] = {}
        for n, fields in zip(names, pipe.execute(), strict=True):
            got = []
            for k, v in sorted((fields or {}).items()):
                key = k.decode(errors="replace") if isinstance(k, bytes) else str(k)
                t = parse_telemetry(n, key, v)
                if t is not None:
                    got.append(t)
            if got:
                out[n] = got
        return out


def publish_telemetry(client: Any, node: str, reports: dict[str, dict[str, Any]], ttl_s: float) -> None:
    """Write a node's hash as the agents do (replacing it, with its TTL): the twin and tests
    use it where no agent publishes."""
    key = REPORT_KEY.format(node=node)
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    if reports:
        pipe.hset(key, mapping={gpu: json.dumps(r, allow_nan=False) for gpu, r in reports.items()})
        pipe.pexpire(key, max(1, int(ttl_s * 1000)))
    pipe.execute()
