"""What a node agent does around its passes: the state file, startup orphan recovery, the drain
restore, and shutdown (caps left in force unless drained). A mixin of ``NodeAgent``, which
holds the attributes these methods use (``managed``, ``state``, the backend, ``may_actuate``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from powerfleet.agent.gpu import GpuBackend, GpuError
from powerfleet.agent.recovery import recover_orphans, restore_all

log = logging.getLogger("powerfleet.agent")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


class NodeLifecycle:
    node: str
    managed: set[str]
    state: Any
    state_conclusive: bool
    _recovered: bool
    _unsaved: bool
    _gpus: GpuBackend | None
    _targets: dict[str, tuple[int, int]]

    may_actuate: Callable[[], str | None]

    if TYPE_CHECKING:  # defined by NodeAgent
        def gpus(self) -> GpuBackend: ...

        def _blind_spot(self, pids: list[int]) -> str | None: ...

    # -- state --

    def _persist(self, good_pass: bool) -> None:
        if not self.state_conclusive:
            if not good_pass:
                return  # keep the unreadable file for a human until a pass has succeeded
            self.state_conclusive = True
            self._unsaved = True
        if not self._unsaved:
            return
        try:
            self.state.save(frozenset(self.managed))
            self._unsaved = False
        except OSError as exc:  # retried at the next pass; the in-memory set stays right
            log.warning("cannot write %s: %s (retrying at the next pass)", self.state.path, exc.strerror or exc)

    def _recover(self, gpus: GpuBackend) -> None:
        result = recover_orphans(gpus, frozenset(self.managed))
        self._recovered = True
        if result.managed != frozenset(self.managed):
            self.managed = set(result.managed)
            self._unsaved = True
            self._persist(good_pass=True)

    def start(self) -> None:
        """Startup: check the proc root, then orphan recovery now if the GPUs can be opened, else
        at the first pass. Recovery is a write: it needs ``may_actuate``."""
        self._blind_spot([])
        if self._recovered or self.may_actuate() is not None:
            return
        try:
            self._recover(self.gpus())
        except GpuError as exc:
            log.warning("node %s: GPUs not available at startup (%s); recovery waits for the first pass",
                        self.node, one_line(exc))

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
        if left != frozenset(self.managed):
            self.managed = set(left)
            self._targets = {u: t for u, t in self._targets.items() if u in left}
            self._unsaved = True
            self._persist(good_pass=self.state_conclusive)
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
            self._persist(good_pass=self.state_conclusive)
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


