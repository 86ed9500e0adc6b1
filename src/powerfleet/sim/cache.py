"""KV cache tiers of one worker: the device prefix cache and the optional offload tiers.

* ``BlockCache``: one block per trace hash id, reference-counted. Blocks of running
  requests are pinned; unreferenced ones sit in an LRU list and are evicted oldest first.
  ``private`` counts blocks reserved outside the shared prefix cache: new prompt blocks
  until their prefill completes, and output blocks.
* ``OffloadTiers``: LRU copies of evicted blocks in host memory and on disk per worker,
  plus one pool shared by the cluster (off unless the engine gives them a size). A prompt
  block found there is loaded at the tier's per-block cost instead of being recomputed.

``journal`` (off unless a router sees KV events late) records, in order, every block that
enters (``+1``) or leaves (``-1``) the device cache.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from powerfleet.sim.request import Req


def lru_put(lru: OrderedDict[int, None], h: int, cap: int) -> int | None:
    """Insert or refresh ``h`` as most recent; return the block pushed out, if any."""
    lru[h] = None
    lru.move_to_end(h)
    if len(lru) > cap:
        return lru.popitem(last=False)[0]
    return None


class OffloadTiers:
    """Host and disk LRU tiers of one worker, and the cluster's shared pool."""

    __slots__ = ("host", "disk", "shared", "host_cap", "disk_cap", "shared_cap", "host_ms", "disk_ms", "shared_ms")

    def __init__(self, host_cap: int, disk_cap: int, shared: OrderedDict[int, None], shared_cap: int,
                 host_ms: float, disk_ms: float, shared_ms: float) -> None:
        self.host: OrderedDict[int, None] = OrderedDict()
        self.disk: OrderedDict[int, None] = OrderedDict()
        self.shared = shared
        self.host_cap = host_cap
        self.disk_cap = disk_cap
        self.shared_cap = shared_cap
        self.host_ms = host_ms
        self.disk_ms = disk_ms
        self.shared_ms = shared_ms

    def __deepcopy__(self, memo: dict[int, Any]) -> OffloadTiers:
        # Keys are ints: C-level copies of the LRU dicts are deep copies, and much faster than
        # copy.deepcopy's walk. The shared pool is copied once for all workers (memo).
        other = copy.copy(self)
        memo[id(self)] = other
        other.host = OrderedDict(self.host)
        other.disk = OrderedDict(self.disk)
        if id(self.shared) not in memo:
            memo[id(self.shared)] = OrderedDict(self.shared)
        other.shared = memo[id(self.shared)]
        return other

    def offload(self, h: int) -> None:
        """A block left the device: keep a copy (device -> host -> disk; and the shared pool)."""
        if self.host_cap:
            spilled = lru_put(self.host, h, self.host_cap)
            if spilled is not None and self.disk_cap:
                lru_put(self.disk, spilled, self.disk_cap)
        elif self.disk_cap:
            lru_put(self.disk, h, self.disk_cap)
        if self.shared_cap:
            lru_put(self.shared, h, self.shared_cap)

    def walk(self, device: dict[int, int], hs: tuple[int, ...]) -> tuple[int, int, int, int]:
        """Contiguous prefix found on the device / host / disk / shared (first tier holding each)."""
        host, disk, shared = self.host, self.disk, self.shared
        dev = hst = dsk = shr = 0
        for h in hs:
            if h in device:
                dev += 1
            elif h in host:
                hst += 1
            elif h in disk:
                dsk += 1
            elif h in shared:
                shr += 1
            else:
                break
        return dev, hst, dsk, shr


class BlockCache:
    """The device prefix cache and KV reservation of one worker (sizes in blocks)."""

    __slots__ = ("blocks", "lru", "private", "capacity", "tiers", "journal", "bt")

    def __init__(self, capacity: int, block_tokens: int, tiers: OffloadTiers | None = None) -> None:
        self.blocks: dict[int, int] = {}  # hash -> reference count
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced blocks, oldest first
        self.private = 0
        self.capacity = capacity
        self.bt = block_tokens
        self.tiers = tiers
        self.journal: list[tuple[int, int]] | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> BlockCache:
        other = copy.copy(self)
        memo[id(self)] = other
        other.blocks = dict(self.blocks)
        other.lru = OrderedDict(self.lru)
        other.tiers = copy.deepcopy(self.tiers, memo)
        other.journal = None if self.journal is None else list(self.journal)
        return other

    def free_blocks(self) -> int:
        """Blocks a new reservation may take: never used, or cached but unreferenced."""
        return self.capacity - (len(self.blocks) - len(self.lru) + self.private)

    def evict(self, over: int) -> None:
        """Evict ``over`` unreferenced blocks, oldest first (copies go to the tiers, if any)."""
        lru, blocks, tiers, journal = self.lru, self.blocks, self.tiers, self.journal
        while over > 0:
            h, _ = lru.popitem(last=False)
            del blocks[h]
            if tiers is not None:
                tiers.offload(h)
            if journal is not None:
                journal.append((-1, h))
            over -= 1

    def reserve(self, r: Req, total_blocks: int) -> bool:
        """Admit ``r`` if ``total_blocks`` fit: pin its cached prefix, load blocks found in a
        tier, reserve the rest privately, evicting unreferenced blocks as needed."""
        cache = self.blocks
        hs = r.hashes
        hits = 0
        dev_hits = 0
        free_hits = 0
        onboard = 0.0
        tiers = self.tiers
        if tiers is not None:
            host, disk, shared = tiers.host, tiers.disk, tiers.shared
            for h in hs:
                rc = cache.get(h)
                if rc is not None:
                    dev_hits += 1
                    if rc == 0:
                        free_hits += 1
                elif h in host:
                    onboard += tiers.host_ms
                elif h in disk:
                    onboard += tiers.disk_ms
                elif h in shared:
                    onboard += tiers.shared_ms
                else:
                    break
                hits += 1
        else:
            for h in hs:
                rc = cache.get(h)
                if rc is None:
                    break
                hits += 1
                if rc == 0:
                    free_hits += 1
            dev_hits = hits
        need = total_blocks - dev_hits
        lru = self.lru
        pinned = len(cache) - len(lru) + self.private
        if pinned + free_hits + need > self.capacity:
            return False
        loaded = []
        for i in range(hits):
            h = hs[i]
            rc = cache.get(h)
            if rc is None:
                loaded.append(h)
                continue
            if rc == 0:
                del lru[h]
            cache[h] = rc + 1
        over = len(cache) + self.private + need - self.capacity
        if over > 0:
            self.evict(over)
        journal = self.journal
        for h in loaded:  # loaded blocks enter the device cache at once, pinned
            cache[h] = cache.get(h, 0) + 1
            if journal is not None:
                journal.append((1, h))
        private = need - len(loaded)
        self.private += private
        r.private = private
        r.hits = hits
        r.dev_hits = dev_hits
        r.loaded = len(loaded)
        r.onboard_ms = onboard
        return True

    def commit_prompt(self, r: Req) -> None:
        """Prefill done: the request's new prompt blocks move from its reservation into the
        shared prefix cache (pinned by it)."""
        cache = self.blocks
        lru = self.lru
        journal = self.journal
        hs = r.hashes
        moved = 0
        for i in range(r.hits, r.nhash):
            h = hs[i]
            rc = cache.get(h)
            if rc is None:
                cache[h] = 1
                if journal is not None:
                    journal.append((1, h))
            else:
                if rc == 0:
                    del lru[h]
                cache[h] = rc + 1
            moved += 1
        self.private -= moved
        r.private -= moved

    def grow(self, r: Req) -> bool:
        """One more private block for ``r`` (incremental allocation); False when none is free."""
        if self.free_blocks() < 1:
            return False
        over = len(self.blocks) + self.private + 1 - self.capacity
        if over > 0:
            self.evict(over)
        self.private += 1
        r.private += 1
        r.held += 1
        return True

    def release(self, r: Req, pinned: int | None = None) -> None:
        """The request finished or was preempted: unpin its first ``pinned`` prompt blocks
        (default all; they stay cached) and free its private blocks."""
        cache = self.blocks
        lru = self.lru
        hs = r.hashes if pinned is None else r.hashes[:pinned]
        for h in hs:
            rc = cache[h] - 1
            cache[h] = rc
            if rc == 0:
                lru[h] = None
        self.private -= r.private
