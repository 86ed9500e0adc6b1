"""The loopback server's chunked LISTs (limit/continue, 410 on an expired token) and injected
faults (429 with Retry-After, 5xx, held requests), and the budget tick's paginated, retried reads
against them (cluster/gpu_pods.py, cluster/retries.py)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.clock import FakeClock
from powerfleet.cluster.gpu_pods import KubeGpuPods
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import ClusterError
from powerfleet.cluster.retries import with_retries
from powerfleet.twin.apiserver import ApiError, ApiServer
from powerfleet.twin.apiserver.pages import Pages, parse_limit


def _pod(name: str, ns: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}


@pytest.fixture
def served(tmp_path):
    clock = FakeClock(1_000_000.0)
    with ApiServer(clock=clock) as api:
        for i in range(10):
            api.apply(_pod(f"p{i:02d}", "default" if i % 2 else "other"))
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        yield api, kube, client.CoreV1Api(kube.api_client), clock
        kube.close()


def _names(listed) -> list[str]:
    return [p.metadata.name for p in listed.items]


def test_a_limited_list_pages_through_one_snapshot(served):
    api, _, core, _ = served
    first = core.list_pod_for_all_namespaces(limit=4)
    assert len(first.items) == 4 and first.metadata._continue and first.metadata.remaining_item_count == 6
    api.apply(_pod("p99"))  # a change after the first page is not in this list (one resourceVersion)
    api.delete("v1", "Pod", "p01")
    second = core.list_pod_for_all_namespaces(limit=4, _continue=first.metadata._continue)
    third = core.list_pod_for_all_namespaces(limit=4, _continue=second.metadata._continue)
    assert third.metadata._continue is None and len(third.items) == 2
    assert first.metadata.resource_version == second.metadata.resource_version == third.metadata.resource_version
    got = _names(first) + _names(second) + _names(third)
    assert sorted(got) == [f"p{i:02d}" for i in range(10)] and len(set(got)) == 10, got
    assert len(core.list_pod_for_all_namespaces().items) == 10  # no limit: everything, now


def test_an_expired_or_compacted_token_is_410_and_a_bad_one_400(served):
    api, _, core, clock = served
    token = core.list_pod_for_all_namespaces(limit=3).metadata._continue
    clock.advance(301)  # past the tokens' life (etcd compacts every 5 minutes)
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(limit=3, _continue=token)
    assert info.value.status == 410 and "Expired" in info.value.body and "too old" in info.value.body
    token = core.list_pod_for_all_namespaces(limit=3).metadata._continue
    api.pages.expire()
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(limit=3, _continue=token)
    assert info.value.status == 410
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(limit=3, _continue="not-a-token")
    assert info.value.status == 400
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{api.url}/api/v1/pods?limit=x", timeout=10)
    assert bad.value.code == 400


def test_the_ledgers_pod_list_is_paginated(served):
    api, kube, _, _ = served
    reader = KubeGpuPods(kube, page_size=3)
    pods = reader.list_gpu_pods()
    assert sorted(p.name for p in pods) == [f"p{i:02d}" for i in range(10)] and reader.pages_read == 4
    assert all(p.gpus == 1 for p in pods)


def test_the_ledgers_list_starts_again_once_when_its_token_expires_mid_list(served):
    api, kube, _, _ = served
    reader = KubeGpuPods(kube, page_size=4)
    held = api.faults.hold("GET", "continue=")  # the second page waits; the list is compacted meanwhile
    out: list = []
    t = threading.Thread(target=lambda: out.append(reader.list_gpu_pods()))
    t.start()
    assert held.reached.wait(30)
    api.pages.expire()
    api.apply(_pod("p10"))
    held.release()
    t.join(30)
    assert out and sorted(p.name for p in out[0]) == [f"p{i:02d}" for i in range(11)], out
    assert reader.pages_read == 1 + 3  # the first page, then the fresh list's 3 (the 410 answered none)


def test_429_with_retry_after_and_5xx_are_injected_and_reads_retry_them(served):
    api, kube, core, _ = served
    api.faults.rates(throttle=1.0, retry_after_s=1)
    with pytest.raises(ApiException) as info:
        core.list_node()  # urllib3 itself waits out a 429's Retry-After, 3 times, then gives up
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    api.faults.rates(error=1.0)
    codes = set()
    for _ in range(6):
        with pytest.raises(ApiException) as info:
            core.list_node()
        codes.add(info.value.status)
    assert codes <= {500, 503, 504} and len(codes) >= 2, codes
    api.faults.rates(throttle=0.2, error=0.1, retry_after_s=0, seed=3)
    for _ in range(10):  # each read gets through within its 4 tries (seeded), over a kept-alive connection
        assert len(KubeGpuPods(kube, page_size=4).list_gpu_pods()) == 10
        kube.list_nodes()
    assert api.faults.served[429] > 0 and sum(n for c, n in api.faults.served.items() if c >= 500) > 0
    api.faults.rates(throttle=1.0, retry_after_s=0)
    with pytest.raises(ClusterError) as err:
        kube.list_nodes()
    assert err.value.status == 429


def test_with_retries_waits_the_servers_retry_after_bounded():
    waits: list[float] = []
    answers = iter([ApiException(status=429), ApiException(status=503), ApiException(status=429)])

    def call():
        exc = next(answers, None)
        if exc is None:
            return "ok"
        exc.headers = {"Retry-After": "60"} if exc.status == 429 else {}
        raise exc

    assert with_retries(call, sleep=waits.append) == "ok"
    assert waits == [5.0, 0.2, 5.0], waits
    with pytest.raises(ApiException):
        with_retries(lambda: (_ for _ in ()).throw(ApiException(status=403)), sleep=waits.append)
    assert len(waits) == 3  # a 403 is not retried


@given(st.text(max_size=80) | st.builds(lambda d: __import__("base64").urlsafe_b64encode(
    __import__("json").dumps(d).encode()).decode(), st.dictionaries(st.sampled_from(["id", "start", "rv", "v"]),
                                                                      st.none() | st.integers(-3, 3) | st.text(max_size=3))))
@settings(max_examples=300, deadline=None)
def test_any_continue_token_is_400_or_410_never_a_crash(token):
    pages = Pages(FakeClock(0.0))
    try:
        pages.page([], 1, 2, token)
    except ApiError as exc:
        assert exc.code in (400, 410), exc.status()
    for raw in (token, "0", "-1", "7"):
        try:
            assert parse_limit(raw) is None or parse_limit(raw) > 0
        except ApiError as exc:
            assert exc.code == 400
