"""The control worker's watch-backed ledger view (cluster/gpu_pod_cache.py) against the loopback
API server through the official client: it serves what a LIST would (the pods the ledger reads),
follows changes across resumed watches without listing again, relists after a 410 with what
changed while its watch was away, and while it cannot sync every read LISTs for itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.evidence import AGENT_POD_LABELS
from powerfleet.budget.tick import ledger_reads
from powerfleet.cluster.dgd import LABEL_DGD_NAME
from powerfleet.cluster.gpu_pod_cache import GpuPodCache, selector_terms
from powerfleet.cluster.gpu_pods import KubeGpuPods
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import ClusterError
from powerfleet.twin.apiserver import ApiServer
from tests.waiting import wait_for


def _pod(name: str, *, gpus: int = 1, labels: dict[str, str] | None = None, ns: str = "default") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "m", "resources": resources}]},
            "status": {"phase": "Running"}}


def _cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ApiServer, KubeCluster]]:
    with ApiServer() as api:
        for i in range(7):
            api.apply(_pod(f"gpu-{i}", ns="default" if i % 2 else "other"))
        api.apply(_pod("frontend", gpus=0, labels={LABEL_DGD_NAME: "llm"}))  # a DGD's pod without GPUs
        api.apply(_pod("agent-n1", gpus=0, labels=dict(AGENT_POD_LABELS)))
        api.apply(_pod("daemon", gpus=0))  # nothing the ledger reads
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        yield api, kube
        kube.close()


def _view(pods: list[Any]) -> dict[str, tuple[int, tuple[tuple[str, str], ...]]]:
    return {f"{p.namespace}/{p.name}": (p.gpus, tuple(sorted(p.labels.items()))) for p in pods}


def _listed(kube: KubeCluster, selector: str | None = None) -> dict[str, Any]:
    """What a LIST gives the ledger (the pods it reads)."""
    return _view([p for p in KubeGpuPods(kube).list_gpu_pods(selector) if ledger_reads(p)])


def test_the_view_serves_what_a_list_would_and_follows_changes_across_watches_without_listing_again(served):
    api, kube = served
    cache = GpuPodCache(KubeGpuPods(kube, page_size=3), keep=ledger_reads, watch_timeout_s=1).start()
    try:
        wait_for(lambda: cache.state == "synced", "the first LIST")
        assert _view(cache.list_gpu_pods()) == _listed(kube)
        assert "default/daemon" not in _view(cache.list_gpu_pods()) and cache.size() == 9
        assert _view(cache.list_gpu_pods(LABEL_DGD_NAME)) == _listed(kube, LABEL_DGD_NAME) != {}
        wait_for(lambda: cache.stats["watches"] >= 3, "three watches, each ended by the server after 1 s")
        api.apply(_pod("gpu-new", gpus=4))
        api.delete("v1", "Pod", "gpu-1")
        api.apply(_pod("daemon", gpus=0, labels={LABEL_DGD_NAME: "llm"}))  # now a DGD's pod: read
        api.apply(_pod("frontend", gpus=0))  # no longer a DGD's: dropped from memory
        wait_for(lambda: _view(cache.list_gpu_pods()) == _listed(kube),
                 lambda: f"the view to follow the changes: {sorted(_view(cache.list_gpu_pods()))}")
        assert "default/frontend" not in _view(cache.list_gpu_pods()) and "default/gpu-new" in _view(cache.list_gpu_pods())
        assert cache.stats["lists"] == 1 and cache.stats["fallbacks"] == 0, cache.stats
    finally:
        cache.stop()


def test_a_selector_the_view_cannot_answer_is_listed_by_the_server(served):
    _, kube = served
    cache = GpuPodCache(KubeGpuPods(kube), keep=ledger_reads, watch_timeout_s=1).start()
    try:
        wait_for(lambda: cache.state == "synced", "the first LIST")
        got = cache.list_gpu_pods(f"!{LABEL_DGD_NAME}")
        assert cache.stats["fallbacks"] == 1 and "default/daemon" in _view(got)  # the server's answer, whole
    finally:
        cache.stop()


def test_a_410_relists_and_the_view_has_what_changed_while_its_watch_was_away(served):
    api, kube = served
    cache = GpuPodCache(KubeGpuPods(kube), keep=ledger_reads, watch_timeout_s=1).start()
    try:
        wait_for(lambda: cache.state == "synced", "the first LIST")
        held = api.faults.hold("GET", "watch=")  # the next resumed watch waits at the server
        assert held.reached.wait(30), "the watch was never resumed"
        api.delete("v1", "Pod", "gpu-2", "other")
        api.apply(_pod("gpu-late", gpus=2))
        api.store.log.clear()  # the server's history moves past the view's version (a compaction)
        api.apply(_cm("a"))
        api.apply(_cm("b"))
        api.store.log.clear()
        api.apply(_cm("c"))
        held.release()
        wait_for(lambda: cache.stats["lists"] == 2 and cache.state == "synced", lambda: f"a relist: {cache.stats}")
        view = _view(cache.list_gpu_pods())
        assert view == _listed(kube) and "other/gpu-2" not in view and "default/gpu-late" in view
    finally:
        cache.stop()


def test_while_the_view_cannot_sync_every_read_lists_for_itself_and_then_it_recovers(served):
    api, kube = served
    api.faults.rates(error=1.0, methods=frozenset({"GET"}))
    cache = GpuPodCache(KubeGpuPods(kube), keep=ledger_reads, watch_timeout_s=1, retry_s=0.2).start()
    try:
        wait_for(lambda: cache.state == "failing", "the view to fail its LIST")
        with pytest.raises(ClusterError) as info:  # the tick's own LIST, and its error: never a stale view
            cache.list_gpu_pods()
        assert info.value.status in (500, 503, 504) and cache.stats["served"] == 0
        api.faults.rates()
        wait_for(lambda: cache.state == "synced", lambda: f"the view to recover: {cache.problem}")
        assert _view(cache.list_gpu_pods()) == _listed(kube) and cache.stats["served"] == 1
    finally:
        cache.stop()


def test_a_view_whose_watch_breaks_is_not_served_until_it_has_listed_again(served):
    api, kube = served
    cache = GpuPodCache(KubeGpuPods(kube), keep=ledger_reads, watch_timeout_s=1, retry_s=0.2).start()
    try:
        wait_for(lambda: cache.state == "synced", "the first LIST")
        assert cache.list_gpu_pods() and cache.stats["served"] == 1
        api.faults.rates(error=1.0, methods=frozenset({"GET"}))  # the next watch (after 1 s) and LISTs fail
        wait_for(lambda: cache.state == "failing", lambda: f"the broken watch to be noticed: {cache.state}")
        api.apply(_pod("scheduled-meanwhile", gpus=8))
        with pytest.raises(ClusterError):  # the tick's own LIST, failing as the server does: not the old view
            cache.list_gpu_pods()
        assert cache.stats["served"] == 1
        api.faults.rates()
        wait_for(lambda: cache.state == "synced", lambda: f"the view to list again: {cache.problem}")
        assert "default/scheduled-meanwhile" in _view(cache.list_gpu_pods()) and cache.stats["lists"] >= 2
    finally:
        cache.stop()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab.=/!,() x1-"), max_size=16))
def test_selector_terms_never_raises_and_answers_only_exists_and_equals(text: str) -> None:
    terms = selector_terms(text)
    if terms is None:
        return
    for key, value in terms:
        assert key and key == key.strip() and not any(c in key for c in "!=(), ")
        assert value is None or (value and "=" not in value and "," not in value)


@pytest.mark.parametrize(("selector", "terms"), [
    (None, []), ("", []), ("app", [("app", None)]), ("app=x,tier", [("app", "x"), ("tier", None)]),
    ("app==x", None), ("app!=x", None), ("!app", None), ("app in (x)", None), ("app=", None), (",", None),
])
def test_selector_terms(selector: str | None, terms: list[tuple[str, str | None]] | None) -> None:
    assert selector_terms(selector) == terms
