"""How a deployment's traffic becomes its workers' load, and what a frontend's window replay is
given (pure): the twin's serving model, by role (twin/cluster/roles.py), so a deployment's
components may have any names.

* ``worker_loads``: each ready worker pod's utilisation, its deployment's served token rate split
  over the GPUs of its ready peers of the same role (prefill by input tokens/s, decode by output
  tokens/s, an aggregated worker by both);
* ``window_inputs``: the ready decode (or aggregated) workers of a deployment and their mean cap
  as a fraction of the card's maximum, and, for a disaggregated one, its ready prefill workers and
  theirs: what ``TwinFrontend.close_windows`` replays the window over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerfleet.cluster.dgd import LABEL_DGD_NAME
from powerfleet.cluster.gpu_pods import pod_gpus
from powerfleet.twin.cluster.kubelet import serving
from powerfleet.twin.cluster.topology import GPU_DEFAULT_W
from powerfleet.twin.gpus.power import load_of

# What one GPU processes at full load (tokens/s): sets how the trace's rate becomes utilisation.
PREFILL_CAPACITY_TPS = 25_000.0
DECODE_CAPACITY_TPS = 1_000.0
WORKER_ROLES = ("prefill", "decode", "worker")

Role = Callable[[Mapping[str, Any]], str]  # a pod's role (twin/cluster/roles.py pod_role)


def _dgd(pod: Mapping[str, Any]) -> str:
    return str((pod["metadata"].get("labels") or {}).get(LABEL_DGD_NAME, ""))


def worker_loads(pods: Sequence[Mapping[str, Any]], role_of: Role, rates: Mapping[str, tuple[float, float]],
                 scale: Mapping[str, float]) -> dict[str, float]:
    """Pod name -> utilisation (0..1); ``rates``: each deployment's (input, output) tokens/s;
    ``scale``: a deployment's factor on its workers' load (a demand surge)."""
    ready: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for p in pods:
        role = role_of(p)
        if role in WORKER_ROLES and serving(p):
            ready.setdefault((_dgd(p), role), []).append(p)
    out: dict[str, float] = {}
    for (dgd, role), peers in ready.items():
        isl, osl = rates.get(dgd, (0.0, 0.0))
        n = sum(max(1, pod_gpus(p.get("spec") or {})) for p in peers)
        if role == "prefill":
            load = load_of(isl / n, PREFILL_CAPACITY_TPS)
        elif role == "decode":
            load = load_of(osl / n, DECODE_CAPACITY_TPS)
        else:
            load = min(1.0, load_of(isl / n, PREFILL_CAPACITY_TPS) * 0.6 + load_of(osl / n, DECODE_CAPACITY_TPS) * 0.6)
        for p in peers:
            out[p["metadata"]["name"]] = min(1.0, load * scale.get(dgd, 1.0))
    return out


@dataclass(frozen=True)
class WindowInputs:
    workers: int  # ready decode (or aggregated) workers
    cap_fraction: float  # their mean cap / the card's maximum
    prefill: int | None  # ready prefill workers (None: aggregated)
    prefill_cap_fraction: float | None


def window_inputs(dgd: str, pods: Sequence[Mapping[str, Any]], role_of: Role,
                  caps: Mapping[str, list[float]]) -> WindowInputs:
    """``caps``: pod name -> the caps of its GPUs now."""
    mine = [(p["metadata"]["name"], role_of(p)) for p in pods if _dgd(p) == dgd and serving(p)]

    def mean_fraction(names: set[str]) -> float | None:
        got = [c for n in names for c in caps.get(n, [])]
        return sum(got) / len(got) / GPU_DEFAULT_W if got else None

    workers = {n for n, r in mine if r in ("decode", "worker")}
    roles = {r for _, r in mine}
    prefill = pre_cap = None
    if "prefill" in roles or "decode" in roles:  # disaggregated: the prefill pool at its own cap
        pre = {n for n, r in mine if r == "prefill"}
        prefill, pre_cap = len(pre), mean_fraction(pre)
    cap = mean_fraction(workers)
    return WindowInputs(len(workers), 1.0 if cap is None else cap, prefill, pre_cap)
