"""Strict state parsing (fuzzed), settings resolution and premise codes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import parse_dgd
from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.context import Deployment
from powerfleet.retune.leadership import Fenced, leader_lease_name
from powerfleet.retune.premises import Frontend, Snapshot, check, prefill_replicas, worker_replicas
from powerfleet.retune.settings import SettingsError, dgd_overrides, resolve
from powerfleet.retune.state import DecisionRecord, RetuneState, StateCorrupt, dump_state, parse_state
from powerfleet.sim.policy import RouterPolicy
from powerfleet.testing.retune_world import dgd_object
from powerfleet.twin.cluster.manifests import dgd_manifests
from powerfleet.twin.cluster.topology import TwinSpec
from tests.retune.conftest import make_ports, retune_config

POLICY = RouterPolicy().model_dump()


def full_state() -> RetuneState:
    rec = DecisionRecord(window=3, outcome="apply", mode="active", params=POLICY, improvement_pct=4.5, reason="r",
                         term=2, generation="g", at=1.5, replicas=4, replicas_verified=True)
    return RetuneState(term=2, generation="g", initial={"fe-0": POLICY}, desired=POLICY, desired_window=3,
                       last_window=3, advisory=rec, history=[rec], updated=9.0)


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, path + (i,))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append(path)
    return out


def test_round_trip() -> None:
    s = full_state()
    assert parse_state(dump_state(s)) == s


NUMBER_PATHS = _paths(json.loads(dump_state(full_state())))


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(NUMBER_PATHS), bad=st.sampled_from([True, False, "1", "NaN", None, [1], {"a": 1}]))
def test_every_number_rejects_bools_strings_and_other_types(path: tuple[Any, ...], bad: Any) -> None:
    obj = json.loads(dump_state(full_state()))
    node = obj
    for p in path[:-1]:
        node = node[p]
    if bad is None and path[-1] in ("improvement_pct", "desired_window", "last_window", "probe_score",
                                    "best_score", "replicas"):
        return  # these are optional: null is a valid value
    node[path[-1]] = bad
    with pytest.raises(StateCorrupt):
        parse_state(json.dumps(obj))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_corrupt(token: str) -> None:
    text = dump_state(full_state()).replace('"updated": 9.0', f'"updated": {token}')
    with pytest.raises(StateCorrupt):
        parse_state(text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_is_a_state_or_corrupt_never_a_crash(text: str) -> None:
    try:
        state = parse_state(text)
    except StateCorrupt:
        return
    # What it accepted is a real state: it dumps and parses back to the same value.
    assert state is None or parse_state(dump_state(state)) == state, text


def test_a_policy_missing_parameters_is_corrupt() -> None:
    obj = json.loads(dump_state(full_state()))
    del obj["initial"]["fe-0"]["temperature"]
    with pytest.raises(StateCorrupt, match="eight router parameters"):
        parse_state(json.dumps(obj))


def test_history_is_bounded_and_deep_copied() -> None:
    s = RetuneState()
    rec = full_state().history[0]
    for _ in range(5):
        s = s.with_decision(rec, keep=3)
    assert len(s.history) == 3 and s.history[0] is not rec and s.history[0].params is not rec.params


def test_settings_layers_and_errors() -> None:
    cfg = RetuneConfig(deployments=["a"], per_deployment={"a": {"objective": "throughput"}}, trace_dir="/t")
    assert resolve(cfg, "a").objective.value == "throughput"
    over = dgd_overrides({"powerfleet.nvidia.com/retune": '{"mode": "advisory", "max_shards": 4}'})
    s = resolve(cfg, "a", over)
    assert (s.mode, s.max_shards, s.enabled) == ("advisory", 4, True)
    assert resolve(cfg, "a").generation != resolve(cfg, "a", over).generation
    assert not resolve(cfg, "b").enabled
    bad = [({"grid": {"temperature": {"choices": [-1]}}}, "temperature"),
           ({"grid": {"bogus": {"choices": [1]}}}, "bogus"),
           ({"objective": "goodput"}, "needs an sla"),
           ({"time_budget_s": 10, "shard_timeout_s": 20}, "must exceed shard_timeout_s"),
           ({"time_budget_s": 400}, "shorter than the window interval")]
    for over_cfg, msg in bad:
        with pytest.raises(SettingsError, match=msg):
            resolve(RetuneConfig(deployments=["a"], per_deployment={"a": over_cfg}), "a")
    with pytest.raises(SettingsError, match="annotation"):
        dgd_overrides({"powerfleet.nvidia.com/retune": '{"max_shards": 0}'})


def _snap(obj: dict[str, Any], **kw: Any) -> Snapshot:
    base = dict(dgd_obj=obj, dgd=parse_dgd(obj), frontends=[Frontend("fe-0", "http://x")], frontends_without_url=[],
                frontend_policies={"fe-0": POLICY}, frontend_errors={}, sweep_consumers={"sweep@w": True},
                load_scaling=False)
    base.update(kw)
    return Snapshot(**base)


def test_premises_each_have_their_code(tmp_path) -> None:
    cfg = RetuneConfig(deployments=["llama"], trace_dir=str(tmp_path))
    s = resolve(cfg, "llama")
    ok = dgd_object("llama")
    assert check(s, _snap(ok)) == []
    unsettled = dgd_object("llama")
    unsettled["status"]["components"]["worker"]["readyReplicas"] = 1
    override = dgd_object("llama", worker_env=[{"name": "DYN_ROUTER_MODE", "value": "random"}])
    cases = {
        "dgd-missing": dict(dgd_obj=None, dgd=None),
        "no-frontend": dict(frontends=[], frontends_without_url=["fe-0"]),
        "frontend-unreachable": dict(frontend_errors={"fe-0": "timeout"}),
        "credit-zero-frontend": dict(frontend_policies={"fe-0": {**POLICY, "overlap_score_credit": 0.0}}),
        "load-scaling-on": dict(load_scaling=True),
        "no-sweep-consumer": dict(sweep_consumers={}),
        "sweep-cannot-read": dict(sweep_consumers={"sweep@w": False}),
    }
    for code, kw in cases.items():
        assert code in {p.code for p in check(s, _snap(ok, **kw))}, code
    assert "dgd-unsettled" in {p.code for p in check(s, _snap(unsettled))}
    assert "worker-router-override" in {p.code for p in check(s, _snap(override))}
    gone = resolve(RetuneConfig(deployments=["llama"], trace_dir=str(tmp_path / "missing")), "llama")
    assert "trace-dir-unreadable" in {p.code for p in check(gone, _snap(ok))}
    zero_grid = resolve(RetuneConfig(deployments=["llama"], trace_dir=str(tmp_path),
                                     grid={"overlap_score_credit": {"choices": [0.0]}}), "llama")
    credit0 = _snap(ok, frontend_policies={"fe-0": {**POLICY, "overlap_score_credit": 0.0}})
    assert "credit-zero-frontend" not in {p.code for p in check(zero_grid, credit0)}
    # A 0 that retune decided itself (the frontend started with a positive credit) never blocks
    # the next window; a frontend that started at 0 does.
    started_positive = {"fe-0": {**POLICY, "overlap_score_credit": 0.5}}
    assert "credit-zero-frontend" not in {p.code for p in check(s, credit0, initial=started_positive)}
    started_zero = {"fe-0": {**POLICY, "overlap_score_credit": 0.0}}
    assert "credit-zero-frontend" in {p.code for p in check(s, credit0, initial=started_zero)}


@settings(max_examples=200, deadline=None)
@given(raw=st.text(max_size=80) | st.dictionaries(st.sampled_from(["mode", "max_shards", "grid", "enabled", "x"]),
                                                  st.one_of(st.integers(-3, 300), st.text(max_size=4), st.booleans(),
                                                            st.none())).map(json.dumps))
def test_the_dgd_annotation_parses_or_is_one_settings_error(raw: str) -> None:
    try:
        over = dgd_overrides({"powerfleet.nvidia.com/retune": raw})
    except SettingsError as exc:
        assert "\n" not in str(exc)
        return
    assert over is not None


def test_a_write_below_the_saved_states_term_is_refused_even_by_a_lower_reclaimed_lease(world, kube, redis_url) -> None:
    """StateStore.update's own term check: the Lease was deleted and re-claimed at term 1 while
    the saved state carries term 5; a write under term 1 must not pass, though the Lease check does."""
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(1_800_000_000.0, 1.0))
    dep = Deployment.open(cfg, ports, "llama")
    t, _, _ = dep.leadership.claim()
    assert t is not None and t.term == 1
    high = dep.leadership.raise_term(t, 5)
    dep.store.update(high, lambda s: s.model_copy(update={"last_window": 7}))
    kube.delete_lease("default", leader_lease_name("llama"))
    low, _, acquired = dep.leadership.claim()
    assert acquired and low is not None and low.term == 1
    dep.leadership.check(low)  # the Lease itself names this holder at term 1
    with pytest.raises(Fenced, match="saved state carries term 5"):
        dep.store.update(low, lambda s: s.model_copy(update={"last_window": 99}))
    assert dep.store.read()[0].last_window == 7 and dep.store.read()[0].term == 5


def test_a_disaggregated_deployment_is_replayed_as_its_pools_and_other_shapes_are_refused(tmp_path) -> None:
    """The twin's llm-disagg shape (prefill and decode workers, subComponentType) passes the
    shape premise and is replayed as its two pools; a shape the model does not cover is refused."""
    s = resolve(RetuneConfig(deployments=["llm-disagg"], trace_dir=str(tmp_path)), "llm-disagg")
    disagg = next(m for m in dgd_manifests(TwinSpec()) if m["metadata"]["name"] == "llm-disagg")
    assert "disaggregated" not in {p.code for p in check(s, _snap(disagg))}
    parsed = parse_dgd(disagg)
    reps = {n: c["replicas"] for n, c in disagg["spec"]["services"].items()}
    assert prefill_replicas(parsed) == reps["prefill"] and worker_replicas(parsed) == reps["decode"]
    agg = dgd_object("llama")
    assert prefill_replicas(parse_dgd(agg)) is None and worker_replicas(parse_dgd(agg)) == 4
    assert "disaggregated" not in {p.code for p in check(s, _snap(agg))}
    lone = copy.deepcopy(disagg)
    del lone["spec"]["services"]["prefill"]
    failed = {p.code: str(p) for p in check(s, _snap(lone))}
    assert "a decode pool without a prefill pool" in failed["disaggregated"]
    mixed = copy.deepcopy(disagg)
    mixed["spec"]["services"]["extra"] = {**disagg["spec"]["services"]["decode"]}
    del mixed["spec"]["services"]["extra"]["subComponentType"]
    failed = {p.code: str(p) for p in check(s, _snap(mixed))}
    assert "aggregated workers beside the prefill and decode pools" in failed["disaggregated"]
    empty = copy.deepcopy(disagg)
    empty["spec"]["services"]["prefill"]["replicas"] = 0
    assert "prefill pool has no replicas" in " ".join(str(p) for p in check(s, _snap(empty)))
    # a profile file without the KV size: the transfer cannot be modelled, said before any sweep
    prof = tmp_path / "no-kv.json"
    prof.write_text(json.dumps({"name": "no-kv", "kv_capacity_tokens": 100000,
                                "prefill": {"tokens": [0, 1000], "ms": [1, 100]},
                                "decode": {"batch": [1], "kv_tokens": [0, 100000], "ms": [[10, 20]]}}))
    blind = resolve(RetuneConfig(deployments=["llm-disagg"], trace_dir=str(tmp_path), engine_profile=str(prof)),
                    "llm-disagg")
    failed = {p.code: str(p) for p in check(blind, _snap(disagg))}
    assert "kv_bytes_per_token" in failed["disaggregated"]
    assert "disaggregated" not in {p.code for p in check(blind, _snap(agg))}  # aggregated workers need none