"""Who holds a GPU: the live pod view, the kubelet's allocations, and a managed GPU's owners.

Pure functions over one pass's inputs. A pod in a terminal phase (``Succeeded``, ``Failed``)
no longer exists for the agent: the kubelet's PodResources keeps listing a finished pod's
devices (kubernetes/kubernetes#119423, #132020), and its annotation must not cap the GPU's
next tenant. Device IDs come as the NVIDIA device plugin gives them: GPU or MIG UUIDs, or
with ``deviceIDStrategy=index`` NVML indexes (``"0"``; ``"0:1"`` for a MIG slice of GPU 0),
which are mapped to the UUID read at that index this pass; any other form is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from powerfleet.agent.gpu import GpuReading
from powerfleet.agent.state import Owner
from powerfleet.cluster.objects import PodInfo

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_INDEX = re.compile(r"(\d{1,4})(?::\d{1,4})?")


def live_pods(pods: Iterable[PodInfo]) -> list[PodInfo]:
    """The pods that may still run something: every phase but the terminal ones."""
    return [p for p in pods if p.phase not in TERMINAL_PHASES]


DEPARTED_MAX = 4096  # UIDs remembered as gone after they left the view


def gone_uids(pods: Iterable[PodInfo], live: Mapping[str, PodInfo], previous: Mapping[str, PodInfo],
              departed: dict[str, None]) -> set[str]:
    """Pod UIDs known to be gone at this pass: in a terminal phase, or seen in an earlier view and
    absent from this one (``departed`` keeps them, oldest first, bounded; updated in place). A
    process still naming one counts for nobody, even where the view is not complete."""
    for uid in previous.keys() - live.keys():
        departed[uid] = None
    while len(departed) > DEPARTED_MAX:
        del departed[next(iter(departed))]
    return {p.uid.lower() for p in pods if p.uid and p.phase in TERMINAL_PHASES} | departed.keys()


def gpu_of_device(device_id: str, readings: Iterable[GpuReading]) -> str | None:
    """The GPU UUID an allocation's device ID names (a MIG slice: its parent), or None when the
    ID is an index no GPU was read at this pass. Raises ValueError for an unknown ID form."""
    readings = list(readings)
    if device_id.startswith("GPU-"):
        return device_id
    if device_id.startswith("MIG-"):
        return next((r.uuid for r in readings if device_id in r.mig_uuids), device_id)
    m = _INDEX.fullmatch(device_id)
    if m is None:
        raise ValueError(f"device ID {device_id[:60]!r} is neither a GPU/MIG UUID nor an NVML index")
    return next((r.uuid for r in readings if r.index == int(m.group(1))), None)


@dataclass
class Allocated:
    by_gpu: dict[str, set[str]] = field(default_factory=dict)  # GPU UUID -> live pod UIDs
    refused: list[str] = field(default_factory=list)  # device IDs of an unknown form (one line each)


def allocated_pods(got: Mapping[str, Iterable[Any]], live: Mapping[str, PodInfo],
                   readings: Iterable[GpuReading]) -> Allocated:
    """GPU UUID -> the live pods the kubelet allocated it (or one of its slices) to. An allocation
    of a pod absent from the live view (gone, or finished) is ignored."""
    readings = list(readings)
    by_name = {(p.namespace, p.name): uid for uid, p in live.items()}
    out = Allocated()
    for device, owners in got.items():
        try:
            gpu = gpu_of_device(device, readings)
        except ValueError as exc:
            out.refused.append(str(exc))
            continue
        if gpu is None:
            continue
        for a in owners:
            uid = by_name.get((a.namespace, a.pod))
            if uid is not None:
                out.by_gpu.setdefault(gpu, set()).add(uid)
    return out


def owners_of(uids: Iterable[str], annotations: Mapping[str, str], live: Mapping[str, PodInfo]) -> tuple[Owner, ...]:
    """The opted-in pods among ``uids``, as recorded with a cap."""
    return tuple(Owner(u, live[u].namespace, live[u].name) for u in sorted(set(uids))
                 if u in annotations and u in live)


def owners_alive(owners: Iterable[Owner], live: Mapping[str, PodInfo]) -> bool:
    """True while one of a managed GPU's recorded owners is in the live pod view."""
    return any(o.uid in live for o in owners)
