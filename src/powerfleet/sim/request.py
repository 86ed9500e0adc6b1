"""One request inside the simulator: what the trace says, and where it stands."""

from __future__ import annotations


class Req:
    """Mutable per-request state shared by the router, the worker and its cache."""

    __slots__ = (
        "idx", "arrival", "isl", "osl", "hashes", "nhash", "hits", "dev_hits", "loaded", "left",
        "private", "router_prefill", "router_blocks", "finish_step", "onboard_ms", "seq", "admits",
        "out_blocks", "done", "generated", "decode_from", "length", "held",
    )

    def __init__(self, idx: int, arrival: float, isl: int, osl: int, hashes: tuple[int, ...]) -> None:
        self.idx = idx
        self.arrival = arrival
        self.isl = isl
        self.osl = osl
        self.hashes = hashes
        self.nhash = len(hashes)
        self.hits = 0  # prefix blocks found at admission (device or a tier)
        self.dev_hits = 0  # of which on the device
        self.loaded = 0  # of which loaded from a tier
        self.left = 0  # prompt tokens still to prefill
        self.private = 0  # blocks reserved outside the shared prefix cache
        self.router_prefill = 0  # the router's estimate of its uncached prompt tokens
        self.router_blocks = 0  # the router's count of its prompt blocks
        self.finish_step = 0
        self.onboard_ms = 0.0
        self.seq = 0  # admission order on its worker (preemption takes the newest)
        self.admits = 0  # times admitted to a batch (more than once after a preemption)
        self.out_blocks = 0  # output blocks the router counts (router_track_output_blocks)
        self.done = False
        self.decode_from = 0  # worker step count when its first token came
        self.generated = 0  # output tokens produced before a preemption (recomputed on readmission)
        self.length = 0  # tokens whose KV the sequence holds at admission (prompt + recomputed output)
        self.held = 0  # blocks the sequence holds (prompt + output), incremental allocation

    def __deepcopy__(self, memo: dict[int, object]) -> Req:
        # Every field is a number or an immutable tuple: a shallow copy is a deep one, and
        # it spares walking the hash ids when a warm-started simulation is forked.
        other = Req.__new__(Req)
        for name in Req.__slots__:
            setattr(other, name, getattr(self, name))
        memo[id(self)] = other
        return other
