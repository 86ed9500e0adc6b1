"""Where an evaluation persists the budget's status (the reconcile contract's one write).

``ConfigMapStatus`` (the default, ``budget.status_store: configmap``): the status lives in one
ConfigMap per deployment that powerfleet owns (cluster/budget_store.py has why); the DGD gets
only Events and one condition (``powerfleet.io/PowerBudget``), written by JSON patch without
touching the operator's conditions. ``DgdStatus`` (``budget.status_store: dgd``): the former
``status.budget`` merge patch on the DGD's status subresource, for an API server that keeps
undeclared status fields (the loopback fixture); a real server prunes it.

Both skip an unchanged write, and the caller emits transition events only after a write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from powerfleet.cluster.budget_store import KubeBudgetStore, Owner, StoredStatus, condition_of
from powerfleet.cluster.ports import ClusterError, ClusterWriter

log = logging.getLogger("powerfleet.budget")


def merge_to(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch turning ``previous`` into exactly ``desired`` (stale keys, nested too, set to null)."""
    body: dict[str, Any] = {k: None for k in previous if k not in desired}
    for k, v in desired.items():
        old = previous.get(k)
        body[k] = merge_to(old, v) if isinstance(v, Mapping) and isinstance(old, Mapping) else v
    return body


class StatusSink(Protocol):
    def previous(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The status persisted last (empty: none). Raises ClusterError when it cannot be read."""

    def write(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        """Persist ``desired`` for the DGD ``obj`` (the caller skips it when unchanged). Raises ClusterError."""

    def report(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        """Anything shown on the DGD besides events (best effort, skipped when unchanged)."""


class DgdStatus:
    def __init__(self, cluster: ClusterWriter) -> None:
        self.cluster = cluster
        self._previous: dict[str, Any] = {}

    def previous(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        status = obj.get("status")
        budget = status.get("budget") if isinstance(status, Mapping) else None
        self._previous = dict(budget) if isinstance(budget, Mapping) else {}
        return self._previous

    def write(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        owner = Owner.of(obj)
        self.cluster.patch_dgd_status(owner.namespace, owner.name, {"budget": merge_to(self._previous, desired)})

    def report(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        return None


class ConfigMapStatus:
    def __init__(self, store: KubeBudgetStore) -> None:
        self.store = store
        self._stored: StoredStatus | None = None

    def _read(self, namespace: str, dgd_name: str) -> StoredStatus | None:
        return self.store.read_status(namespace, dgd_name)  # budget/batch.py reads it from a snapshot

    def previous(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        owner = Owner.of(obj)
        self._stored = self._read(owner.namespace, owner.name)
        if self._stored is None:
            return {}
        if self._stored.owner_uid and owner.uid and self._stored.owner_uid != owner.uid:
            return {}  # written for an earlier DGD of this name: its transitions are not this one's
        return dict(self._stored.status)

    def write(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        self.store.write_status(Owner.of(obj), desired, self._stored)

    def report(self, obj: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        try:
            self.store.set_condition(obj, condition_of(desired))
        except ClusterError as exc:  # like an event: the status it mirrors is written; the next evaluation retries
            meta = obj.get("metadata") or {}
            log.warning("%s/%s: budget condition not written: %s", meta.get("namespace"), meta.get("name"), exc)
