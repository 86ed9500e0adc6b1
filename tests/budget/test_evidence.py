"""How a role's pods are charged from the agents' enforcement reports (budget/evidence.py,
issue 18 item 8): properties over random pods and reports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.evidence import Evidence, GpuReport, role_charge
from powerfleet.cluster.objects import PodInfo

NODES = ("n0", "n1", "n2")
CAP, MAX = 300, 700


@st.composite
def worlds(draw):
    gpus = draw(st.integers(1, 3))
    pods = [PodInfo(name=f"p{i}", namespace="d", uid=f"u{i}", node_name=draw(st.sampled_from(NODES)),
                    phase=draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded"])),
                    terminating=draw(st.booleans()))
            for i in range(draw(st.integers(0, 4)))]
    reporting = draw(st.sets(st.sampled_from(NODES)))
    reports: dict[str, list[GpuReport]] = {n: [] for n in reporting}
    for n in reporting:
        for j in range(draw(st.integers(0, 5))):
            uid = draw(st.sampled_from([f"u{i}" for i in range(5)] + [""]))
            reports[n].append(GpuReport(f"GPU-{n}-{j}", uid, draw(st.integers(100, 800)), 0.0,
                                        at=draw(st.floats(900.0, 1000.0))))
    mode = draw(st.sampled_from(["auto", "required", "off"]))
    return pods, Evidence(reports, now=1000.0, fresh_s=45.0, max_settable_w=MAX, mode=mode), gpus


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_evidence_never_charges_less_than_the_caps_and_stale_always_holds(world):
    pods, ev, gpus = world
    got = role_charge(pods, ev, CAP, gpus)
    assert got.surplus_w >= 0  # never below the requested caps (a throttled GPU is not credited)
    running = [p for p in pods if p.phase == "Running"]
    bound = sum(gpus * (MAX - CAP) + sum(max(0, r.enforced_w - CAP) for rs in ev.reports.values() for r in rs)
                for _ in running)
    assert got.surplus_w <= bound
    if ev.mode == "off" or not running:
        assert got == role_charge([], ev, CAP, gpus) and got.surplus_w == 0 and got.stale is None
    # a stale pod is always charged the maximum settable limit, and says so
    assert (got.stale is not None) == (got.basis == "max_settable")
    if got.stale is not None:
        assert got.surplus_w >= gpus * (MAX - CAP)
    if ev.mode == "required" and running and not ev.reports:
        assert got.basis == "max_settable"
