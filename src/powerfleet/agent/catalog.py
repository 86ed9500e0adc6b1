"""GPU products' settable power range, and the range a cap is validated against.

The catalog is Dynamo's table of verified settable TGP bounds
(``deploy/operator/internal/webhook/validation/gpu_power_limits.csv`` and the operator design
doc's GB200 example; ../shared/research/power_control.md section 1.5), GH200 (100-900 W) included. The range used for a
GPU is the device's own ``[min, max]`` intersected with its product's entry, so neither a
device that reports a wider range than its product is qualified for nor a wrong catalog
entry can put a cap outside what the hardware accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (tokens that must all appear in the NVML product name, (min W, max W)). Tokens are whole
# words ("L40" never matches "L40S"); the first match wins, so specific entries come first.
CATALOG: tuple[tuple[tuple[str, ...], tuple[int, int]], ...] = (
    (("GB200",), (200, 1200)),
    (("GH200",), (100, 900)),  # NVIDIA-GH200-120GB/480GB in the same table
    (("B200",), (200, 1000)),
    (("H200", "NVL"), (200, 600)),
    (("H200",), (200, 700)),
    (("H100", "NVL"), (200, 400)),
    (("H100", "PCIE"), (200, 350)),
    (("H100",), (200, 700)),
    (("A100", "PCIE"), (150, 300)),
    (("A100",), (100, 400)),
    (("L40S",), (100, 350)),
    (("L40",), (100, 300)),
    (("L4",), (40, 72)),
)


def product_range_w(name: str | None) -> tuple[int, int] | None:
    """The catalog's (min, max) watts for an NVML product name such as ``NVIDIA A100 80GB PCIe``."""
    if not name:
        return None
    tokens = set(re.split(r"[^A-Z0-9]+", name.upper()))
    # "A100-SXM4-80GB" and "A100 80GB PCIe" both split into their parts; "PCIe" -> "PCIE".
    for need, rng in CATALOG:
        if all(t in tokens for t in need):
            return rng
    return None


@dataclass(frozen=True)
class CardRange:
    """The range caps on one GPU are validated against, in milliwatts."""

    min_mw: int
    max_mw: int
    qualified: bool  # the device's range lies inside its product's catalog entry
    note: str = ""


def card_range(device_min_mw: int, device_max_mw: int, name: str | None) -> CardRange:
    cat = product_range_w(name)
    if cat is None:
        return CardRange(device_min_mw, device_max_mw, False, f"product {name!r} is not in the catalog")
    lo, hi = max(device_min_mw, cat[0] * 1000), min(device_max_mw, cat[1] * 1000)
    if lo > hi:  # disjoint: trust the device, which is what the driver will accept
        return CardRange(device_min_mw, device_max_mw, False,
                         f"device range {device_min_mw // 1000}-{device_max_mw // 1000} W is outside the catalog's "
                         f"{cat[0]}-{cat[1]} W for {name}")
    qualified = lo == device_min_mw and hi == device_max_mw
    note = "" if qualified else (f"device range {device_min_mw // 1000}-{device_max_mw // 1000} W narrowed to the "
                                 f"catalog's {cat[0]}-{cat[1]} W for {name}")
    return CardRange(lo, hi, qualified, note)


def safe_default_mw(rng: CardRange, *, fraction: float, override_w: int | None) -> int:
    """The cap for a GPU whose pods give no valid cap: ``override_w`` clamped into the range when
    it is set and below the maximum, else ``fraction`` of the maximum (at least the minimum).
    Never at or above the maximum while the card has any room below it."""
    if override_w is not None:
        mw = min(max(override_w * 1000, rng.min_mw), rng.max_mw)
        if mw < rng.max_mw:
            return mw
    mw = max(rng.min_mw, round(rng.max_mw * fraction))
    if mw >= rng.max_mw and rng.min_mw < rng.max_mw:
        mw = rng.min_mw  # fraction*max rounded onto max (a card with almost no range): the floor is the safe side
    return mw
