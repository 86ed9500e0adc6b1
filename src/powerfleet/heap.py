"""Pausing Python's cyclic garbage collector around a bulk read.

A budget tick at 10,000 nodes parses tens of megabytes of JSON (every GPU pod, every node's
enforcement report) into millions of short-lived, acyclic objects. Each 700 allocations start a
young collection and the older generations are scanned again and again as the heap grows:
measured, about 40% of the tick's CPU seconds (bench/scale.py, docs/benchmarks.md "Scale").
Reference counting frees those objects as before; only cycles wait until the pause ends, so the
extra memory is bounded by what one read allocates.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Collector off inside (also as a decorator); back on after only if it was on before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
