"""The live guard's pure parts: one period per group from the agents' reports (power/live.py), the
report parser (power/telemetry.py), the cached group view (power/topology.py), and its config and
beat entry."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import LABEL_DGD_NAME
from powerfleet.cluster.objects import NodeInfo, PodInfo
from powerfleet.config import FleetConfig
from powerfleet.config.fleet import ConfigError, load_config
from powerfleet.power.guard import GuardSettings
from powerfleet.power.live import GroupView, GuardMemory, guard_period
from powerfleet.power.telemetry import GpuTelemetry, parse_telemetry
from powerfleet.power.topology import ClusterTopology
from powerfleet.workers.app import beat_schedule

S = GuardSettings(period_s=1.0, cap_ceiling=None)  # the modes' figures (test_cap_ceiling.py: the default ceiling)
VIEW = GroupView(nodes=frozenset({"node-a", "node-b"}), priority={"pod-a": "low", "pod-b": "high"})


def tel(node: str, gpu: str, draw: float | None, at: float, pod: str, enforced: float = 700.0) -> GpuTelemetry:
    return GpuTelemetry(gpu=gpu, node=node, pod_uid=pod, cap_w=700.0, min_w=200.0, max_w=700.0, draw_w=draw, at=at,
                        enforced_w=enforced, pod_uids=(pod,))


def reports(draw: float, at: float) -> dict[str, list[GpuTelemetry]]:
    return {"node-a": [tel("node-a", "a0", draw, at, "pod-a"), tel("node-a", "a1", draw, at, "pod-a")],
            "node-b": [tel("node-b", "b0", draw, at, "pod-b"), tel("node-b", "b1", draw, at, "pod-b")]}


def test_a_group_over_its_thresholds_gets_one_overlay_per_node_low_priority_throttled_first() -> None:
    # 4 x 700 W requested under a 2,000 W limit (1.4x); 4 x 490 W = 1,960 W drawn: above t1, below t2
    p = guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 100.0), GuardMemory(), now=100.0)
    assert p.decision is not None and p.decision.mode == "throttle_low"
    assert set(p.overlays) == {"node-a", "node-b"}
    assert set(p.overlays["node-a"].caps) == {"a0", "a1"} and p.overlays["node-b"].caps == {}
    assert p.overlays["node-a"].caps["a0"] == pytest.approx(700 * 0.85)
    assert p.overlays["node-b"].safe == {"b0": 500.0, "b1": 500.0}  # every GPU's safe cap, with every overlay
    assert p.memory.revision == 100_000 and p.overlays["node-a"].revision == 100_000  # ms of the guard's clock
    # the memory survives its JSON trip, and the next period continues from it (lower again)
    memory = GuardMemory.from_json(json.loads(json.dumps(p.memory.to_json())))
    assert memory == p.memory
    nxt = guard_period(S, "rack", 2000.0, VIEW, reports(590.0, 101.0), memory, now=101.0)
    assert nxt.decision is not None and nxt.decision.mode == "throttle_all"
    assert nxt.overlays["node-a"].caps["a0"] < p.overlays["node-a"].caps["a0"] and nxt.over_limit
    assert nxt.memory.revision == 101_000
    # a memory lost (Redis restarted empty) still gives a newer revision than the agents hold
    assert guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 102.0), GuardMemory(), now=102.0).memory.revision > \
        nxt.memory.revision
    # two periods within one millisecond still count up
    assert guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 101.0), nxt.memory, now=101.0).memory.revision == \
        101_001


def test_a_silent_node_is_counted_at_its_last_enforced_limit_and_stale_telemetry_too() -> None:
    first = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 100.0), GuardMemory(), now=100.0)
    silent = {"node-b": reports(300.0, 102.0)["node-b"]}  # node-a's hash is gone (agent or node down)
    p = guard_period(S, "rack", 2000.0, VIEW, silent, first.memory, now=102.0)
    assert p.decision is not None and set(p.decision.stale) == {"a0", "a1"}
    # its GPUs last reported 700 W enforced: a dead agent leaves NVML there, not at the 500 W safe cap
    assert p.decision.measured_w == pytest.approx(2 * 700.0 + 2 * 300.0)
    assert p.faults == {"a0": "silent", "a1": "silent"}
    assert p.overlays["node-a"].caps == {"a0": 500.0, "a1": 500.0}  # held at the safe cap, still told
    # a report older than two periods is stale as well
    old = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 97.9), first.memory, now=100.0)
    assert old.decision is not None and len(old.decision.stale) == 4


def test_a_gpu_is_forgotten_only_when_its_node_reports_it_idle_or_leaves_the_group() -> None:
    first = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 100.0), GuardMemory(), now=100.0)
    gone = reports(300.0, 101.0)
    gone["node-a"] = gone["node-a"][:1]  # a report without a1: the inventory still has it, lost
    p = guard_period(S, "rack", 2000.0, VIEW, gone, first.memory, now=101.0)
    assert set(p.memory.gpus) == {"a0", "a1", "b0", "b1"} and p.faults == {"a1": "silent"}
    assert p.decision is not None and p.decision.measured_w == pytest.approx(3 * 300.0 + 700.0)
    idle = GpuTelemetry(gpu="a1", node="node-a", pod_uid="", cap_w=0, min_w=0, max_w=0, draw_w=70.0, at=101.0,
                        idle=True)
    gone["node-a"].append(idle)
    p = guard_period(S, "rack", 2000.0, VIEW, gone, first.memory, now=101.0)
    assert set(p.memory.gpus) == {"a0", "b0", "b1"}
    left = guard_period(S, "rack", 2000.0, GroupView(nodes=frozenset({"node-b"})), reports(300.0, 101.0),
                        first.memory, now=101.0)
    assert set(left.memory.gpus) == {"b0", "b1"} and set(left.overlays) == {"node-b"}


def test_a_group_whose_minimums_exceed_its_limit_is_refused_in_one_line_and_sent_nothing() -> None:
    p = guard_period(S, "rack", 700.0, VIEW, reports(300.0, 100.0), GuardMemory(), now=100.0)
    assert p.decision is None and p.overlays == {}
    assert p.refused == ("group 'rack': oversubscription refused: its 4 GPUs' minimum caps sum to 800 W, "
                         "above its limit of 700 W")


def test_a_guard_back_after_its_agents_fell_back_resumes_from_the_safe_caps_and_releases_stepwise() -> None:
    first = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 100.0), GuardMemory(), now=100.0)
    assert first.overlays["node-b"].caps == {}  # 1,200 W: nothing throttled
    # a period later: still its own overlays in force, it carries on from them (b unthrottled)
    on_time = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 101.0), first.memory, now=101.0)
    assert on_time.overlays["node-b"].caps == {}
    # 1.6 periods later the agents are at their safe caps (500 W): +50 W each, not back to 700 W
    late = guard_period(S, "rack", 2000.0, VIEW, reports(300.0, 101.6), first.memory, now=101.6)
    assert late.decision is not None and late.decision.mode == "release"
    assert late.overlays["node-b"].caps == {"b0": 550.0, "b1": 550.0}
    assert late.overlays["node-a"].caps == {"a0": 550.0, "a1": 550.0}


def test_unreadable_memory_starts_afresh() -> None:
    assert GuardMemory.from_json({"revision": "x"}) == GuardMemory()
    assert GuardMemory.from_json(None) == GuardMemory()
    # found beside the record parser's fuzz failure: int(Infinity) is an OverflowError
    assert GuardMemory.from_json({"revision": float("inf"), "gpus": {}, "throttle": {}, "mode": "hold"}) == GuardMemory()


_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4))
_MEMORY_KEYS = st.sampled_from(["revision", "epoch", "mode", "throttle", "gpus", "issued_at", "tracks", "node",
                                "priority", "cap_w", "min_w", "max_w", "at", "draw_w", "since", "lo_w", "hi_w",
                                "peers", "g0"])


@settings(max_examples=300, deadline=None)
@given(st.recursive(_JSON_LEAF, lambda inner: st.dictionaries(_MEMORY_KEYS, inner, max_size=6) | st.lists(inner, max_size=3),
                    max_leaves=25))
def test_stored_memory_of_any_shape_is_read_or_started_afresh_never_raised(data) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(GuardMemory.from_json(data), GuardMemory)


def test_reports_are_read_conservatively_and_anything_malformed_is_no_reading() -> None:
    full = parse_telemetry("n", "GPU-1", json.dumps({"pod_uid": "p", "requested_w": 600, "enforced_w": 500,
                                                     "draw_w": 412.5, "min_w": 200, "max_w": 700, "at": 5.0}))
    assert full == GpuTelemetry("GPU-1", "n", "p", 600.0, 200.0, 700.0, 412.5, 5.0, enforced_w=500.0, pod_uids=("p",))
    # the format the budget ledger documents today: the enforced limit stands for the request, the
    # minimum is taken as the cap itself (the group's floor counted high: refused rather than guessed)
    short = parse_telemetry("n", "GPU-1", json.dumps({"pod_uid": "p", "enforced_w": 500, "draw_w": 1, "at": 5}))
    assert short is not None and (short.cap_w, short.min_w, short.max_w) == (500.0, 500.0, 500.0)
    # an idle GPU as the agent publishes it (no pod, no requested cap): outside the guarded set
    idle = {"pod_uid": "", "pods": [], "requested_w": None, "target_w": None, "enforced_w": 700, "draw_w": 70.0,
            "min_w": 200, "max_w": 700, "at": 5.0}
    got = parse_telemetry("n", "GPU-1", json.dumps(idle))
    assert got is not None and got.idle
    # no draw (NVML could not read it): kept, with no draw, for the guard to count as lost
    blind = parse_telemetry("n", "GPU-1", json.dumps({**idle, "pod_uid": "p", "requested_w": 700, "draw_w": None}))
    assert blind is not None and blind.draw_w is None and not blind.idle and blind.enforced_w == 700.0
    # every pod sharing the GPU is read (the lowest priority among them applies)
    shared = parse_telemetry("n", "GPU-1", json.dumps({**idle, "pods": [{"uid": "q"}, {"uid": "p"}],
                                                       "requested_w": 600}))
    assert shared is not None and shared.pod_uids == ("p", "q")
    assert parse_telemetry("n", "GPU-1", json.dumps({**idle, "pod_uid": "p"})) is not None
    # a pod without a cap (the agent releases its GPU to the default limit and applies no overlay to
    # it), or a GPU whose cap the agent holds: a fixed load, never counted as throttleable
    for decision, fields in (("release", {"requested_w": 700, "enforced_w": 700}), ("hold", {"enforced_w": 450})):
        fixed = parse_telemetry("n", "GPU-1", json.dumps({**idle, "pod_uid": "p", "decision": decision, **fields}))
        assert fixed is not None and fixed.cap_w == fixed.min_w == fixed.max_w == fields["enforced_w"]
    capped = parse_telemetry("n", "GPU-1", json.dumps({**idle, "pod_uid": "p", "decision": "single",
                                                        "requested_w": 500, "target_w": 500}))
    assert capped is not None and (capped.cap_w, capped.min_w, capped.max_w) == (500.0, 200.0, 700.0)
    for bad in ('{"draw_w": 1, "pod_uid": "p", "requested_w": 5}', '{"enforced_w": 5, "pod_uid": "p"}', "[]", "nope", json.dumps({"pod_uid": "p", "enforced_w": 500, "draw_w": 1, "at": 5, "min_w": 600, "max_w": 550}),
                "[" * 100_000):
        assert parse_telemetry("n", "GPU-1", bad) is None
    nan = parse_telemetry("n", "GPU-1", '{"enforced_w": 5, "pod_uid": "p", "draw_w": NaN, "at": 5}')
    assert nan is not None and nan.draw_w is None  # a draw that is no number: unreadable, not a reading of 0


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200),
                 st.dictionaries(st.sampled_from(["pod_uid", "requested_w", "target_w", "enforced_w", "draw_w",
                                                  "min_w", "max_w", "at"]),
                                 st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                                 ).map(lambda d: json.dumps(d))))
def test_the_report_parser_never_raises_and_returns_only_sane_readings(raw) -> None:  # type: ignore[no-untyped-def]
    t = parse_telemetry("n", "GPU-1", raw)
    if t is not None and not t.idle:
        assert 0 < t.cap_w and 0 < t.min_w <= t.max_w and (t.draw_w is None or t.draw_w >= 0) and t.at >= 0
    elif t is not None:
        assert not t.pod_uids and t.at >= 0


class FakeCluster:
    def __init__(self) -> None:
        self.lists = 0
        self.fail = False

    def list_nodes(self, *, label_selector: str | None = None) -> list[NodeInfo]:
        self.lists += 1
        if self.fail:
            raise RuntimeError("api server down")
        assert label_selector == "powerfleet.io/rack=rack-a"
        return [NodeInfo(name="node-a", labels={"powerfleet.io/rack": "rack-a"})]

    def list_pods(self, namespace=None, *, label_selector=None, node_name=None):  # type: ignore[no-untyped-def]
        return [PodInfo(name="p1", namespace="llm", uid="u1", node_name=node_name, labels={LABEL_DGD_NAME: "chat"}),
                PodInfo(name="p2", namespace="llm", uid="u2", node_name=node_name, labels={LABEL_DGD_NAME: "batch"}),
                PodInfo(name="p3", namespace="llm", uid="u3", node_name=node_name)]


def test_the_group_view_is_listed_once_per_refresh_and_kept_through_an_api_outage() -> None:
    cluster, clock = FakeCluster(), FakeClock(mono=10.0)
    topo = ClusterTopology(cluster, "powerfleet.io/rack", {"llm/chat": "high", "llm/batch": "low"}, 30.0, clock)
    view = topo.view("rack-a")
    assert view.nodes == {"node-a"} and dict(view.priority) == {"u1": "high", "u2": "low"}
    clock.advance(29.0)
    assert topo.view("rack-a") is view and cluster.lists == 1
    clock.advance(2.0)
    cluster.fail = True
    assert topo.view("rack-a") is view and cluster.lists == 2
    topo.view("rack-a")
    assert cluster.lists == 2  # retried after the refresh interval, not every period


def test_groups_take_watts_or_an_object_with_a_ratio_and_only_oversubscribed_ones_get_a_guard(tmp_path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("budget:\n  groups:\n    rack-a: 9000\n    rack-b: {limit_w: 8000, oversubscription: 1.3}\n"
                    "    rack-c: {limit_w: 7000}\n  deployments:\n    llm/chat: {power_limit_w: 4000, priority: low}\n"
                    "power:\n  guard_period_s: 2\n  guard_runner: beat\n")
    cfg = load_config(path, environ={})
    assert cfg.budget.groups == {"rack-a": 9000, "rack-b": 8000, "rack-c": 7000}  # what the ledger reads
    assert cfg.budget.oversubscribed() == {"rack-b": 8000} and cfg.budget.oversubscription_of("rack-a") == 1.0
    assert cfg.budget.deployments["llm/chat"].priority == "low"
    entries = {k: v for k, v in beat_schedule(cfg).items() if "power-guard" in k}
    assert entries == {"powerfleet-power-guard-rack-b": {"task": "powerfleet.power.guard", "schedule": 2.0,
                                                         "kwargs": {"group": "rack-b"}, "options": {"expires": 2.0}}}
    assert not any("power-guard" in k for k in beat_schedule(FleetConfig()))
    assert FleetConfig.model_validate(cfg.model_dump()) == cfg  # a dump validates again
    path.write_text("budget:\n  groups:\n    rack-b: {limit_w: 8000, oversubscription: 0.5}\n")
    with pytest.raises(ConfigError, match="groups.rack-b.oversubscription: Input should be greater than or equal"):
        load_config(path, environ={})
    path.write_text("budget:\n  groups:\n    rack-b: {limit: 8000}\n")
    with pytest.raises(ConfigError, match="groups.rack-b.limit_w: Field required"):
        load_config(path, environ={})


def test_each_period_sets_the_groups_metrics_and_counts_throttles_by_priority_and_excursions() -> None:
    from prometheus_client import REGISTRY

    from powerfleet.power import metrics

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before_low = value("powerfleet_power_throttle_events_total", group="rack-m", priority="low")
    before_exc = value("powerfleet_power_excursion_periods_total", group="rack-m")
    p = guard_period(S, "rack-m", 2000.0, VIEW, reports(490.0, 100.0), GuardMemory(), now=100.0)
    metrics.observe("rack-m", 2000.0, p)
    assert value("powerfleet_power_guard_mode", group="rack-m", mode="throttle_low") == 1
    assert value("powerfleet_power_guard_mode", group="rack-m", mode="hold") == 0
    assert value("powerfleet_power_throttle_events_total", group="rack-m", priority="low") == before_low + 2
    assert value("powerfleet_power_group_measured_watts", group="rack-m") == 1960.0
    assert value("powerfleet_power_excursion_periods_total", group="rack-m") == before_exc  # 1960 W <= 2000 W
    over = guard_period(S, "rack-m", 2000.0, VIEW, reports(600.0, 101.0), p.memory, now=101.0)
    metrics.observe("rack-m", 2000.0, over)
    assert value("powerfleet_power_excursion_periods_total", group="rack-m") == before_exc + 1
    # throttling all, low priority is cut first; here that is enough and high priority keeps its caps
    assert value("powerfleet_power_throttle_events_total", group="rack-m", priority="low") == before_low + 4
    assert over.decision is not None and set(over.decision.throttle) == {"a0", "a1"}, over.decision
    lost = guard_period(S, "rack-m", 2000.0, VIEW, {"node-b": reports(0.0, 102.0)["node-b"]}, over.memory, 102.0)
    metrics.observe("rack-m", 2000.0, lost)
    assert value("powerfleet_power_lost_gpus", group="rack-m", fault="silent") == 2
    assert value("powerfleet_power_lost_gpus", group="rack-m", fault="zero") == 2
    metrics.observe("rack-m", 700.0, guard_period(S, "rack-m", 700.0, VIEW, reports(1.0, 101.0), p.memory, 101.0))
    assert value("powerfleet_power_group_refused", group="rack-m") == 1


def test_the_guard_task_refuses_a_group_that_is_not_oversubscribed_in_one_line() -> None:
    from powerfleet.tasks.base import TaskInputError
    from powerfleet.workers.app import create_app

    cfg = FleetConfig.model_validate({"broker": {"url": "redis://127.0.0.1:1/0"},
                                      "budget": {"groups": {"rack-a": 9000}}})
    app = create_app(cfg)
    with pytest.raises(TaskInputError, match=r"^powerfleet.power.guard: group: 'rack-a' is not an oversubscribed group"):
        app.tasks["powerfleet.power.guard"](group="rack-a")
    with pytest.raises(TaskInputError, match="group: String should have at least 1 character"):
        app.check_send("powerfleet.power.guard", None, {"group": ""})
