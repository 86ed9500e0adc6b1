"""The object store: thread-safe objects, one global resourceVersion, generation, an event log for watches."""

from __future__ import annotations

import copy
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from powerfleet.clock import Clock
from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.resources import ResourceType

# Watches resume from any resourceVersion still in this many recent events; older ones get 410.
_LOG_LIMIT = 10_000



class Store:
    """Thread-safe in-memory objects with one global resourceVersion counter and an event log."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.cond = threading.Condition(threading.RLock())
        self.rv = 0
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.log: deque[tuple[int, str, tuple[str, str], Obj]] = deque(maxlen=_LOG_LIMIT)
        self.on_change: Callable[[], None] | None = None

    def _now(self) -> str:
        return datetime.fromtimestamp(self.clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _bump(self, rt: ResourceType, event: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, event, rt.key, copy.deepcopy(obj)))
        if self.on_change is not None:
            self.on_change()
        self.cond.notify_all()

    def bucket(self, rt: ResourceType) -> dict[tuple[str, str], Obj]:
        return self.objects.setdefault(rt.key, {})

    def _existing(self, rt: ResourceType, key: tuple[str, str]) -> Obj:
        obj = self.bucket(rt).get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{rt.plural}.{rt.group or "core"} "{key[1]}" not found',
                           {"name": key[1], "group": rt.group, "kind": rt.plural})
        return obj

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        with self.cond:
            return copy.deepcopy(self._existing(rt, (ns if rt.namespaced else "", name)))

    def list(self, rt: ResourceType, ns: str | None, label: Callable[..., bool], field: Callable[..., bool]) -> tuple[list[Obj], int]:
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (ons, _), o in sorted(self.bucket(rt).items())
                if (ns is None or ons == ns) and label(o["metadata"].get("labels") or {}) and field(o)
            ]
            return items, self.rv

    def create(self, rt: ResourceType, ns: str, obj: Obj, *, keep_status: bool) -> Obj:
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                else:
                    raise ApiError(422, "Invalid", f"{rt.kind}: metadata.name: Required value")
            if rt.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace in the request")
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = (ns if rt.namespaced else "", meta["name"])
            if key in self.bucket(rt):
                raise ApiError(409, "AlreadyExists", f'{rt.plural}.{rt.group or "core"} "{meta["name"]}" already exists',
                               {"name": meta["name"], "group": rt.group, "kind": rt.plural})
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            # keep_status (seeding via apply) keeps what the caller wrote; HTTP create does not.
            if not (keep_status and meta.get("uid")):
                meta["uid"] = str(uuid.uuid4())
            if not (keep_status and meta.get("creationTimestamp")):
                meta["creationTimestamp"] = self._now()
            if "spec" in obj and not (keep_status and meta.get("generation")):
                meta["generation"] = 1
            if rt.status_subresource and not keep_status:
                obj.pop("status", None)
                if rt.kind == "Pod":
                    obj["status"] = {"phase": "Pending"}
            self.bucket(rt)[key] = obj
            self._bump(rt, "ADDED", obj)
            return copy.deepcopy(obj)

    def replace(self, rt: ResourceType, ns: str, name: str, new: Obj, *, subresource: str | None, require_rv: bool, raw: bool = False) -> Obj:
        """UPDATE semantics; ``raw`` (apply) replaces everything including status."""
        with self.cond:
            key = (ns if rt.namespaced else "", name)
            old = self._existing(rt, key)
            new = copy.deepcopy(new)
            meta = new.setdefault("metadata", {})
            if meta.get("name") not in (None, name):
                raise ApiError(400, "BadRequest", "the name of the object does not match the name in the request")
            rv = meta.get("resourceVersion")
            if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.plural}.{rt.group or "core"} "{name}": '
                               "the object has been modified; please apply your changes to the latest version and try again",
                               {"name": name, "group": rt.group, "kind": rt.plural})
            if rv in (None, "") and require_rv:
                raise ApiError(422, "Invalid", f"{rt.kind} {name!r}: metadata.resourceVersion: must be specified for an update")
            if subresource == "status":
                merged = copy.deepcopy(old)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                new = merged
            elif rt.status_subresource and not raw:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            meta = new["metadata"]
            keep = old["metadata"]
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = ns
            meta["uid"] = keep["uid"]
            meta["creationTimestamp"] = keep.get("creationTimestamp")
            meta["resourceVersion"] = keep["resourceVersion"]
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            if "generation" in keep:
                meta["generation"] = keep["generation"] + (1 if new.get("spec") != old.get("spec") else 0)
            if new == old:
                return copy.deepcopy(old)  # no-op: no new resourceVersion, no event
            self.bucket(rt)[key] = new
            self._bump(rt, "MODIFIED", new)
            return copy.deepcopy(new)

    def check_preconditions(self, rt: ResourceType, ns: str, name: str, preconditions: Mapping[str, Any] | None) -> Obj:
        """The stored object, or 409 when a delete precondition (resourceVersion, uid) fails."""
        with self.cond:
            old = self._existing(rt, (ns if rt.namespaced else "", name))
            pre = preconditions or {}
            meta = old["metadata"]
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.kind} "{name}": the ResourceVersion in the '
                               f'precondition ({pre["resourceVersion"]}) does not match the ResourceVersion in record '
                               f'({meta["resourceVersion"]}). The object might have been modified')
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.kind} "{name}": the UID in the precondition '
                               f'({pre["uid"]}) does not match the UID in record ({meta["uid"]}). The object might '
                               "have been replaced and a new object with the same name was created")
            return old

    def delete(self, rt: ResourceType, ns: str, name: str, preconditions: Mapping[str, Any] | None = None) -> Obj:
        with self.cond:
            key = (ns if rt.namespaced else "", name)
            old = self.check_preconditions(rt, ns, name, preconditions)
            del self.bucket(rt)[key]
            self._bump(rt, "DELETED", old)
            return copy.deepcopy(old)

    def mark_deleting(self, rt: ResourceType, ns: str, name: str, grace_s: int) -> Obj:
        """Graceful deletion: set ``deletionTimestamp`` (now + grace) and keep the object; a
        later delete may shorten the deadline, never extend it."""
        with self.cond:
            key = (ns if rt.namespaced else "", name)
            obj = copy.deepcopy(self._existing(rt, key))
            meta = obj["metadata"]
            deadline = self.clock.now() + grace_s
            current = meta.get("deletionTimestamp")
            stamp = datetime.fromtimestamp(deadline, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if current is not None and current <= stamp:
                return obj
            meta["deletionTimestamp"] = stamp
            meta["deletionGracePeriodSeconds"] = grace_s
            self.bucket(rt)[key] = obj
            self._bump(rt, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def snapshot(self) -> Obj:
        with self.cond:
            objs = [copy.deepcopy(o) for bucket in self.objects.values() for _, o in sorted(bucket.items())]
            return {"version": 1, "resourceVersion": self.rv, "objects": objs}
