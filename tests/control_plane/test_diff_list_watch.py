"""LIST pagination and WATCH (410 Gone and re-list, bookmarks): the same official-client calls
against the loopback server and the real kube-apiserver, the same answers."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import ClusterError
from tests.control_plane.servers import GROUP, PLURAL, Server, pod


# The controller-manager puts kube-root-ca.crt in every namespace: the pages list only the test's own.
PAGED, SELECTOR = {"set": "paged"}, "set=paged"


def _configmaps(server: Server, n: int) -> list[str]:
    names = [f"cm-{i}" for i in range(n)]
    for name in names:
        server.core.create_namespaced_config_map(server.namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, labels=PAGED), data={"i": name}))
    return names


def test_list_pages_with_limit_and_continue_in_name_order(server: Server) -> None:
    names = [f"d-{i}" for i in range(5)]
    for name in names:
        server.create_dgd(server.dgd(name))
    seen, token, pages = [], None, []
    while True:
        page = server.custom.list_namespaced_custom_object(GROUP, "v1alpha1", server.namespace, PLURAL, limit=2,
                                                           _continue=token)
        pages.append((len(page["items"]), page["metadata"].get("remainingItemCount")))
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert seen == names, seen
    assert pages == [(2, 3), (2, 1), (1, None)], pages


def test_a_selected_list_pages_without_a_remaining_count(server: Server) -> None:
    names = _configmaps(server, 3)
    first = server.core.list_namespaced_config_map(server.namespace, limit=2, label_selector=SELECTOR)
    assert [i.metadata.name for i in first.items] == names[:2] and first.metadata._continue, first.metadata
    assert first.metadata.remaining_item_count is None, first.metadata  # unknown under a selector
    rest = server.core.list_namespaced_config_map(server.namespace, limit=2, label_selector=SELECTOR,
                                                  _continue=first.metadata._continue)
    assert [i.metadata.name for i in rest.items] == names[2:] and not rest.metadata._continue, rest.metadata


def test_a_page_past_the_end_is_empty_and_a_bad_continue_token_is_400(server: Server) -> None:
    for name in ("d-0", "d-1"):  # DGDs: under a selector a full page may carry a token (objects it skipped)
        server.create_dgd(server.dgd(name))
    full = server.custom.list_namespaced_custom_object(GROUP, "v1alpha1", server.namespace, PLURAL, limit=2)
    assert len(full["items"]) == 2 and not full["metadata"].get("continue"), full["metadata"]
    try:
        server.core.list_namespaced_config_map(server.namespace, limit=1, _continue="not-a-token")
    except ApiException as exc:
        assert exc.status == 400 and json.loads(exc.body)["reason"] == "BadRequest", exc.body
    else:
        raise AssertionError("a malformed continue token was accepted")


@pytest.mark.timeout(400)  # the real server drops history only after 75 s (Server.forget_history)
def test_a_watch_from_a_forgotten_version_is_410_and_the_adapter_relists(server: Server) -> None:
    server.core.create_namespaced_pod(server.namespace, pod("p0"))
    _configmaps(server, 2)
    server.forget_history()
    server.core.create_namespaced_pod(server.namespace, pod("p1"))
    kube = KubeCluster(server.api)
    try:
        events = list(kube.watch_pods(server.namespace, resource_version="1", timeout_seconds=5))
    except ClusterError as exc:
        assert exc.status == 410, repr(exc)
    else:
        raise AssertionError(f"a watch from a forgotten version streamed without 410: {events}")
    pods, rv = kube.list_pods_with_version(server.namespace, resource_version=None)
    assert sorted(p.name for p in pods) == ["p0", "p1"] and rv, (pods, rv)
    kube.core.create_namespaced_pod(server.namespace, pod("p2"))
    fresh = [(e.type, e.pod.name) for e in kube.watch_pods(server.namespace, resource_version=rv, timeout_seconds=2)]
    assert fresh == [("ADDED", "p2")], fresh


# kube-apiserver's watch cache (k8s.io/apiserver, storage/cacher) schedules a watcher's BOOKMARKs
# every minute and 2 s before its deadline. A ticker of 1 s (jitter up to 25 %) pops the watchers due
# in one-second buckets, so the deadline's one goes out between T-3 s and T-0.75 s, and twice when it
# was popped early and queued again. Each carries the version of the last event the cache processed
# and is dropped unless it is newer than the watcher's. It is scheduled only when the watcher is
# registered before T-2 s: T leaves 4 s for that on a loaded machine, and the test waits T plus slack.
WATCH_S, WATCH_SLACK_S = 6, 30


def test_a_watch_with_bookmarks_is_told_of_versions_its_namespace_never_saw(server: Server) -> None:
    server.core.create_namespaced_pod(server.namespace, pod("p0"))
    listed = server.core.list_namespaced_pod(server.namespace)
    elsewhere = server.other_namespace()
    other = server.core.create_namespaced_pod(elsewhere, pod("other"))
    got: list[tuple[str, str]] = []

    def watch_pods() -> None:
        for ev in watch.Watch().stream(server.core.list_namespaced_pod, server.namespace, allow_watch_bookmarks=True,
                                       resource_version=listed.metadata.resource_version, timeout_seconds=WATCH_S):
            got.append((ev["type"], ev["raw_object"]["metadata"]["resourceVersion"]))

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    n, deadline = 0, time.monotonic() + WATCH_S + WATCH_SLACK_S
    while watcher.is_alive() and time.monotonic() < deadline:  # writes the watch does not match, until it ends
        n += 1
        other = server.core.patch_namespaced_pod("other", elsewhere, {"metadata": {"labels": {"n": str(n)}}})
    watcher.join(timeout=1)
    assert not watcher.is_alive(), f"a {WATCH_S} s watch still open after {WATCH_S + WATCH_SLACK_S} s: {got}"
    versions = [int(v) for _, v in got]
    assert got and {t for t, _ in got} == {"BOOKMARK"} and versions == sorted(versions), got
    assert int(listed.metadata.resource_version) < versions[0] and versions[-1] <= int(other.metadata.resource_version), \
        (got, listed.metadata.resource_version, other.metadata.resource_version)


def test_the_adapters_bookmarks_carry_a_version_a_quiet_watch_resumes_from(server: Server) -> None:
    """``KubeCluster.watch_pods(bookmarks=True)``, as the agent's pod view calls it: the BOOKMARK
    comes through as an empty pod with the server's version, and a watch from that version is
    answered (the agent's quiet node resumes without a relist: docs/agent.md)."""
    server.core.create_namespaced_pod(server.namespace, pod("p0"))
    listed = server.core.list_namespaced_pod(server.namespace)
    elsewhere = server.other_namespace()
    kube = KubeCluster(server.api)
    got: list = []

    def watch_pods() -> None:
        got.extend(kube.watch_pods(server.namespace, resource_version=listed.metadata.resource_version,
                                   timeout_seconds=WATCH_S, bookmarks=True))

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    n, deadline = 0, time.monotonic() + WATCH_S + WATCH_SLACK_S
    while watcher.is_alive() and time.monotonic() < deadline:  # writes the watch does not match
        n += 1
        server.core.create_namespaced_pod(elsewhere, pod(f"other-{n}"))
    watcher.join(timeout=1)
    assert not watcher.is_alive(), f"a {WATCH_S} s watch still open after {WATCH_S + WATCH_SLACK_S} s: {got}"
    assert got and {e.type for e in got} == {"BOOKMARK"} and {e.pod.name for e in got} == {""}, got
    version = got[-1].resource_version
    assert int(version) > int(listed.metadata.resource_version), (got, listed.metadata.resource_version)
    server.core.create_namespaced_pod(server.namespace, pod("p1"))
    resumed = [(e.type, e.pod.name) for e in kube.watch_pods(server.namespace, resource_version=version,
                                                             timeout_seconds=2)]
    assert resumed == [("ADDED", "p1")], resumed


def test_a_watch_list_ends_its_initial_events_with_a_bookmark_at_a_version_its_namespace_never_saw(
        server: Server) -> None:
    for name in ("p0", "p1"):
        server.core.create_namespaced_pod(server.namespace, pod(name))
    elsewhere = server.other_namespace()
    other = server.core.create_namespaced_pod(elsewhere, pod("other"))
    w, got = watch.Watch(), []
    for ev in w.stream(server.core.list_namespaced_pod, server.namespace, allow_watch_bookmarks=True,
                       send_initial_events=True, resource_version_match="NotOlderThan", timeout_seconds=WATCH_S):
        meta = ev["raw_object"]["metadata"]
        got.append((ev["type"], meta.get("name"), meta["resourceVersion"], meta.get("annotations") or {}))
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert sorted(g[:2] for g in got[:-1]) == [("ADDED", "p0"), ("ADDED", "p1")], got
    kind, _, version, notes = got[-1]  # at once, not on the bookmark schedule: the watch list's end
    assert kind == "BOOKMARK" and notes == {"k8s.io/initial-events-end": "true"}, got
    assert int(version) >= int(other.metadata.resource_version), (got, other.metadata.resource_version)


def test_a_watch_list_without_not_older_than_is_422_on_resource_version_match(server: Server) -> None:
    code, body, _ = server.call("GET", f"/api/v1/namespaces/{server.namespace}/pods", query=[
        ("watch", "true"), ("sendInitialEvents", "true"), ("allowWatchBookmarks", "true")])
    assert code == 422 and body["details"]["kind"] == "ListOptions", body
    assert [c["field"] for c in body["details"]["causes"]] == ["resourceVersionMatch"], body


def test_a_watch_without_a_version_starts_with_every_object_added(server: Server) -> None:
    for name in ("a", "b"):
        server.core.create_namespaced_pod(server.namespace, pod(name))
    w = watch.Watch()
    seen = []
    for ev in w.stream(server.core.list_namespaced_pod, server.namespace, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b")], seen
