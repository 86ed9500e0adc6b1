"""LIST pagination and WATCH (410 Gone and re-list, bookmarks): the same official-client calls
against the loopback server and the real kube-apiserver, the same answers."""

from __future__ import annotations

import json
import threading

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


@pytest.mark.skip(reason="quarantined: the real server's bookmark schedule gave no bookmark at the expected version in the clean-clone CI run of 2026-12-01; issue 34")
def test_a_watch_with_bookmarks_is_told_of_versions_its_namespace_never_saw(server: Server) -> None:
    server.core.create_namespaced_pod(server.namespace, pod("p0"))
    listed = server.core.list_namespaced_pod(server.namespace)
    elsewhere = server.other_namespace()
    other = server.core.create_namespaced_pod(elsewhere, pod("other"))
    got: list[tuple[str, str]] = []

    def watch_pods() -> None:
        for ev in watch.Watch().stream(server.core.list_namespaced_pod, server.namespace, allow_watch_bookmarks=True,
                                       resource_version=listed.metadata.resource_version, timeout_seconds=4):
            got.append((ev["type"], ev["raw_object"]["metadata"]["resourceVersion"]))

    watcher = threading.Thread(target=watch_pods)
    watcher.start()
    n = 0
    while watcher.is_alive():  # writes the watch does not match, until it ends (about 4 s)
        n += 1
        other = server.core.patch_namespaced_pod("other", elsewhere, {"metadata": {"labels": {"n": str(n)}}})
    watcher.join()
    # The bookmark goes out 2 s before the deadline with the store's version then: newer than the list.
    assert [t for t, _ in got] == ["BOOKMARK"], got
    assert int(listed.metadata.resource_version) < int(got[0][1]) <= int(other.metadata.resource_version), \
        (got, listed.metadata.resource_version, other.metadata.resource_version)


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
