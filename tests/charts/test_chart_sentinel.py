"""redis.mode: sentinel (three pods, each a Redis node and a Sentinel), standalone (the default,
one pod) and external (a URL, no Redis in the chart)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts.chartlib import HELM_SKIP_REASON, component_of, env_of, find, objects, one, pod_spec, workloads

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)
SENTINEL = {"redis": {"mode": "sentinel"}}


def _containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(one(objs, "StatefulSet", "redis"))["containers"]}


def test_sentinel_mode_runs_a_master_two_replicas_and_three_sentinels_that_never_share_a_node() -> None:
    objs = objects(SENTINEL)
    sts = one(objs, "StatefulSet", "redis")
    assert sts["spec"]["replicas"] == 3
    c = _containers(objs)
    assert set(c) == {"redis", "sentinel"}
    redis_args, sentinel_args = c["redis"]["args"][0], c["sentinel"]["args"][0]
    for flag in ("--appendonly yes", "--min-replicas-to-write 1", "--min-replicas-max-lag 10",
                 "--maxmemory-policy noeviction"):
        assert flag in redis_args, flag
    assert "sentinel monitor %s %s 6379 2" in sentinel_args and "m=fleet" in sentinel_args
    assert "sentinel down-after-milliseconds %s 5000" in sentinel_args
    assert "--sentinel" in sentinel_args
    for args in (redis_args, sentinel_args):  # each asks the Sentinels who leads before it starts
        assert "sentinel get-master-addr-by-name fleet" in args and "pf-powerfleet-redis-0." in args
    term = pod_spec(sts)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    soft = pod_spec(one(objects({"redis": {"mode": "sentinel", "sentinel": {"antiAffinity": "soft"}}}),
                        "StatefulSet", "redis"))["affinity"]["podAntiAffinity"]
    assert list(soft) == ["preferredDuringSchedulingIgnoredDuringExecution"]


def test_sentinel_mode_never_lets_a_drain_take_two_redis_pods_and_opens_the_sentinel_port() -> None:
    objs = objects(SENTINEL)
    pdb = one(objs, "PodDisruptionBudget", "redis")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    headless = next(s for s in find(objs, "Service", "redis") if s["spec"].get("clusterIP") == "None")
    assert {p["port"] for p in headless["spec"]["ports"]} == {6379, 26379}
    np_ = one(objs, "NetworkPolicy", "redis")
    assert np_["spec"]["ingress"][0]["ports"] == [{"port": 6379, "protocol": "TCP"}, {"port": 26379, "protocol": "TCP"}]


def test_sentinel_mode_passwords_come_from_the_secret_and_the_fleet_gets_the_master_name() -> None:
    objs = objects(SENTINEL)
    for name, c in _containers(objs).items():
        assert "$REDIS_PASSWORD" in c["args"][0], name
        assert env_of(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "pf-powerfleet-redis"
    for w in workloads(objs):
        if component_of(w) != "redis":
            env = env_of(pod_spec(w)["containers"][0])
            assert env["POWERFLEET_BROKER__SENTINEL__MASTER_NAME"]["value"] == "'fleet'"  # a YAML string
            assert env["POWERFLEET_BROKER__URL"]["value"].startswith("sentinel://:$(REDIS_PASSWORD)@pf-powerfleet-redis-0.")


def test_the_default_is_one_standalone_redis() -> None:
    objs = objects()
    assert one(objs, "StatefulSet", "redis")["spec"]["replicas"] == 1
    assert list(_containers(objs)) == ["redis"]
    assert one(objs, "PodDisruptionBudget", "redis")["spec"]["minAvailable"] == 1


def test_external_mode_takes_a_url_and_renders_no_redis() -> None:
    url = "sentinel://redis-a:26379;sentinel://redis-b:26379"
    objs = objects({"redis": {"mode": "external", "external": {"url": url}},
                    "config": {"broker": {"sentinel": {"master_name": "prod"}}}})
    assert not [o for o in objs if component_of(o) == "redis"]
    for w in workloads(objs):
        assert env_of(pod_spec(w)["containers"][0])["POWERFLEET_BROKER__URL"]["value"] == url
    with pytest.raises(helm.HelmValuesError, match="/redis/external/url"):
        objects({"redis": {"mode": "external", "external": {"url": "redis://:secret@r:6379/0"}}})
    with pytest.raises(helm.HelmValuesError, match="oneOf"):
        objects({"redis": {"mode": "external"}})  # neither a URL nor broker.existingSecret
