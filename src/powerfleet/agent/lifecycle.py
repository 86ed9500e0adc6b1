"""What a node agent does around its passes: the state record (write-ahead, rebuild, revision),
startup recovery, the caps owed while the node lock cannot be taken, the drain restore, and
shutdown (caps left in force unless drained). A mixin of ``NodeAgent``, which holds the
attributes these methods use (``managed``, ``state``, the backend, ``may_actuate``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from powerfleet.agent.apply import apply_limit
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading
from powerfleet.agent.ownership import live_pods, owners_alive
from powerfleet.agent.recovery import restore_all
from powerfleet.agent.report import PassReport
from powerfleet.agent.state import LoadedState, Owner, Record

if TYPE_CHECKING:
    from powerfleet.agent.metrics import AgentMetrics
    from powerfleet.clock import Clock
    from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

REVISION_BLOCK = 4096  # revisions reserved per write of the record (one write per this many new targets)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


class NodeLifecycle:
    node: str
    state: Any
    clock: Clock
    metrics: AgentMetrics
    _gpus: GpuBackend | None
    _list_pods: Callable[[], list[PodInfo]]
    may_actuate: Callable[[], str | None]
    owed_only: Callable[[], bool]

    if TYPE_CHECKING:  # defined by NodeAgent
        def gpus(self) -> GpuBackend: ...

        def _blind_spot(self, pids: list[int]) -> str | None: ...

        def run_pass(self, trigger: str = "tick", *, dry_run: bool = False) -> PassReport: ...

    # -- the state record --

    def _load_state(self, loaded: LoadedState) -> None:
        rec = loaded.record
        self.managed: set[str] = set(loaded.uuids)  # a loaded write-ahead intent counts as managed
        self.intent: set[str] = set()  # UUIDs recorded before their first set, not yet confirmed
        self.owners: dict[str, tuple[Owner, ...]] = dict(rec.owners)
        self._targets: dict[str, tuple[int, int]] = {u: (mw, rec.revision) for u, mw in rec.targets.items()}
        self._ceiling = rec.revision  # every revision up to here may have been used
        self._revision = max(rec.revision, int(self.clock.now() * 1000))
        self._durable: set[str] = set(loaded.uuids)  # what the file on disk names (a subset claim)
        self._rebuild = loaded.rebuild
        self._judged: set[str] = set()
        self._corrupt = not loaded.conclusive
        self._unsaved = bool(rec.intent) or loaded.rebuild
        self._disk: Record | None = None if loaded.rebuild else rec  # what the file says now
        self._recovered = False
        if loaded.rebuild:
            log.error("node %s: state record lost (%s): rebuilding it from the GPUs' limits (a GPU below its "
                      "default is taken as managed)", self.node, loaded.problem or "unknown")

    def _record(self, intent: set[str] | None = None, ceiling: int | None = None,
                owners: dict[str, tuple[Owner, ...]] | None = None, planned: dict[str, int] | None = None) -> Record:
        return Record(managed=frozenset(self.managed), intent=frozenset(self.intent if intent is None else intent),
                      revision=max(self._ceiling if ceiling is None else ceiling, 0),
                      targets={**{u: t[0] for u, t in self._targets.items() if u in self.managed}, **(planned or {})},
                      owners={u: o for u, o in (self.owners if owners is None else owners).items() if o})

    def _save(self, record: Record, *, durable: bool = True) -> str | None:
        """Write the record; None, or why it could not be written (the caller decides what that costs)."""
        try:
            if self._corrupt:
                self.state.keep_corrupt()
                self._corrupt = False
            self.state.save(record, durable=durable)
        except OSError as exc:
            self.metrics.state_write_failures.inc()
            why = str(exc.strerror or exc)
            log.warning("node %s: cannot write %s: %s", self.node, self.state.path, why)
            return why
        self._durable = set(record.managed | record.intent)
        self._ceiling = record.revision
        self._disk = record
        return None

    def _persist(self) -> None:
        """After a pass: the record as it is now, when it changed (retried at the next pass). Not
        fsynced when the file already means it: the pass's write-ahead named the GPUs it then
        capped, with the targets they took (an intent reads as managed), so a first pass fsyncs
        once and a crash that loses this write loses nothing."""
        if not self._unsaved:
            return
        record = self._record()
        same = self._disk is not None and _folded(record) == _folded(self._disk)
        if self._save(record, durable=not same) is None:
            self._unsaved = False

    def _write_ahead(self, caps: list[Any], *, changes: int) -> dict[str, str]:
        """Before the sets: record the GPUs about to be capped for the first time (and enough
        revisions), fsynced. Returns UUID -> why for the GPUs whose intent could not be written:
        they are not capped this pass (no cap without a record that owns it)."""
        new = {p.r.uuid for p in caps} - self._durable
        need_revisions = self._revision + changes > self._ceiling
        if not new and not need_revisions:
            return {}
        ceiling = self._revision + changes + REVISION_BLOCK if need_revisions else self._ceiling
        owners = {**self.owners, **{p.r.uuid: p.owners for p in caps if p.r.uuid in new}}
        planned = {p.r.uuid: p.clamped_mw for p in caps if p.r.uuid in new}
        why = self._save(self._record(intent=self.intent | new, ceiling=ceiling, owners=owners, planned=planned))
        if why is not None:
            return {u: why for u in new}
        self.intent |= new
        return {}

    def _next_revision(self) -> int:
        self._revision += 1
        return self._revision

    def _release(self, uuid: str) -> None:
        self.managed.discard(uuid)
        self._targets.pop(uuid, None)
        self.owners.pop(uuid, None)
        self._unsaved = True

    def _adopt(self, readings: list[GpuReading], *, complete: bool) -> None:
        """A lost record is rebuilt from the limits (below its default, unrecorded: ours); at the
        first complete scan, managed UUIDs no GPU has are dropped (the GPU is gone)."""
        if self._rebuild:
            for r in readings:
                if r.uuid in self._judged:
                    continue
                self._judged.add(r.uuid)
                if r.current_mw < r.default_mw and r.uuid not in self.managed:
                    log.warning("node %s: GPU %d (%s) is below its default with no record: taken as managed",
                                self.node, r.index, r.uuid)
                    self.managed.add(r.uuid)
            self._unsaved = True
            self._rebuild = not complete
        if complete and not self._recovered:
            self._recovered = True
            gone = self.managed - {r.uuid for r in readings}
            if gone:
                log.info("node %s: managed GPU(s) %s are gone from the node: dropped", self.node, sorted(gone))
                for uuid in gone:
                    self._release(uuid)

    def _settle(self, report: PassReport, readings: list[GpuReading]) -> None:
        """After the sets: a write-ahead intent is confirmed (managed) or withdrawn (the set
        failed and the limit is as read); a set whose readback failed may hold: managed."""
        for g in report.gpus:
            if g.uuid is None or g.uuid not in self.intent:
                continue
            if g.uuid not in self.managed and g.write == "ok" and g.readback == "failed":
                self.managed.add(g.uuid)
            self.intent.discard(g.uuid)
            self._unsaved = True

    # -- startup --

    def start(self) -> None:
        """Startup: check the proc root, then, when there is a record to act on, a first pass
        (trigger ``start``): it drops GPUs that are gone and releases idle managed GPUs whose
        recorded owners and allocations are all gone from the pod view; without a pod view it
        changes nothing (the caps stay until one says their pods are gone)."""
        self._blind_spot([])
        if not self.managed:  # nothing recorded (a lost record is rebuilt by the first pass)
            return
        if self.may_actuate() is not None and not self.owed_only():  # owed caps: at once, not at the timer
            return
        report = self.run_pass("start")
        if report.skipped:
            log.warning("node %s: startup recovery waits for the first pass (%s)", self.node, report.skipped)

    # -- fail-closed at boot --

    def _owed_pass(self, trigger: str, pods: list[PodInfo] | None, why: str) -> PassReport:
        """The node lock cannot be taken because Redis is unreachable (the node-local lock proves
        no other agent runs here): apply the caps the state owes (a reboot put the defaults back)
        to managed GPUs whose owners may still exist, from the pod view or, without one, the
        persisted owners. Nothing is released and no new cap is decided."""
        live = None if pods is None else {p.uid.lower(): p for p in live_pods(pods) if p.uid}
        applied: list[str] = []
        try:
            gpus = self.gpus()
            count = gpus.device_count()
        except GpuError as exc:
            count, why = 0, f"{why}; GPU backend: {one_line(exc)}"
        for i in range(count):
            try:
                r = gpus.read(i)
                owed = self._targets.get(r.uuid)
                if r.uuid not in self.managed or owed is None or r.current_mw <= owed[0]:
                    continue
                if live is not None and not owners_alive(self.owners.get(r.uuid, ()), live):
                    continue
                apply_limit(gpus, r, owed[0], "owed by the state record (node lock unavailable)")
                applied.append(r.uuid)
            except GpuError as exc:
                log.warning("node %s: GPU %d: owed cap not applied: %s", self.node, i, one_line(exc))
        return PassReport(node=self.node, trigger=trigger, dry_run=False, at=self.clock.now(), duration_s=0.0,
                          skipped=f"{why}; applied only the caps the state owes ({len(applied)} re-applied)",
                          managed=sorted(self.managed))

    # -- shutdown and drain --

    def restore(self, why: str) -> frozenset[str]:
        """Every managed GPU back to its default (drain), persisted; returns what is still managed."""
        if not self.managed:
            return frozenset()
        if self._gpus is None:
            self._gpus = self._try_open()
        if self._gpus is None:
            return frozenset(self.managed)
        left = restore_all(self._gpus, frozenset(self.managed))
        for uuid in self.managed - left:
            self._release(uuid)
        self._persist()
        log.info("node %s: %s: restored the default on every managed GPU%s", self.node, why,
                 f" except {sorted(left)}" if left else "")
        return left

    def shutdown(self, *, restore: bool = False) -> None:
        """Leave the caps in force for the next agent (it adopts them from the state file), or with
        ``restore`` (a drain) put the defaults back first; persist, then close. Never raises."""
        try:
            if restore and self.may_actuate() is None:
                self.restore("shutdown after a drain")
            elif self.managed:
                log.info("shutdown: %d managed GPU(s) keep their caps for the next agent", len(self.managed))
            self._persist()
        except Exception:
            log.exception("shutdown failed")
        finally:
            self.close_quietly()

    def close_quietly(self) -> None:
        if self._gpus is not None:
            try:
                self._gpus.close()  # after any restore, never before
            except Exception:
                log.exception("shutdown: closing the GPU backend failed")
            self._gpus = None

    def close(self) -> None:
        """Close the backend without restoring anything (``agent once``: the caps stay)."""
        if self._gpus is not None:
            try:
                self._gpus.close()
            finally:
                self._gpus = None

    def _try_open(self) -> GpuBackend | None:
        try:
            return self.gpus()
        except Exception:
            log.exception("cannot open the GPU backend; managed caps stay")
            return None


def _folded(r: Record) -> tuple[frozenset[str], dict[str, int], dict[str, tuple[Owner, ...]], int]:
    """What a record means to the next agent: an intent counts as managed."""
    return r.managed | r.intent, dict(r.targets), dict(r.owners), r.revision
