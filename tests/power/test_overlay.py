"""The overlay per node (power/overlay.py) and the cap an agent enforces with it: fresh, late, back."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from powerfleet.clock import FakeClock
from powerfleet.power.guard import Guard, GpuReading
from powerfleet.power.overlay import Overlay, agent_cap, by_node

NODE_OF = {"a0": "node-a", "a1": "node-a", "b0": "node-b", "b1": "node-b"}


def _decision():  # type: ignore[no-untyped-def]
    clock = FakeClock(t=50.0)
    guard = Guard("rack", 2000.0, clock=clock)
    readings = [GpuReading(g, "low" if g.startswith("a") else "high", 700.0, 200.0, 700.0, 480.0, clock.now())
                for g in NODE_OF]
    return guard.tick(readings)  # 1920 W > 0.9 L: the low-priority GPUs (node-a) are throttled


def test_a_decision_becomes_one_overlay_per_node_with_every_safe_cap() -> None:
    d = _decision()
    assert d.mode == "throttle_low"
    out = by_node(d, NODE_OF, "rack", 1.0, revision=7, issued_at=50.0)
    assert set(out) == {"node-a", "node-b"}
    assert set(out["node-a"].caps) == {"a0", "a1"} and out["node-b"].caps == {}
    assert out["node-b"].safe == {"b0": 500.0, "b1": 500.0}  # 2000 W x 700 / 2800
    assert out["node-a"].revision == 7 and out["node-a"].ttl_s() == pytest.approx(1.5)
    # the model round-trips as JSON (the task message)
    assert Overlay.model_validate_json(out["node-a"].model_dump_json()) == out["node-a"]


def test_the_agent_enforces_the_lower_cap_while_fresh_and_the_safe_cap_once_overlays_stop() -> None:
    ov = by_node(_decision(), NODE_OF, "rack", 1.0, revision=1, issued_at=50.0)["node-a"]
    throttle = ov.caps["a0"]
    assert agent_cap("a0", 700.0, ov, received_at=10.0, now=10.9).cap_w == throttle
    assert agent_cap("a0", 400.0, ov, received_at=10.0, now=10.9).why == "annotation"  # the lower wins
    # the next overlay is missed: safe cap within one period of the last one's due time
    late = agent_cap("a0", 700.0, ov, received_at=10.0, now=11.6)
    assert late.why == "fallback" and late.cap_w == ov.safe["a0"] == 500.0
    assert agent_cap("a0", 300.0, ov, received_at=10.0, now=99.0).cap_w == 300.0  # never above the annotation
    # a fresh overlay again: back to the throttle
    assert agent_cap("a0", 700.0, ov, received_at=99.0, now=99.2).why == "throttle"
    # a GPU of another group (no overlay names it) keeps its annotation
    assert agent_cap("zz", 650.0, ov, received_at=None, now=99.0).cap_w == 650.0
    assert agent_cap("zz", 650.0, None, received_at=None, now=99.0).why == "annotation"


@pytest.mark.parametrize("bad, needle", [
    ({"node": "Bad Node"}, "node name"),
    ({"safe": {}}, "safe"),
    ({"caps": {"x": 300.0}}, "without a safe cap"),
    ({"safe": {"a0": -5.0}}, "positive"),
    ({"period_s": 0}, "period_s"),
    ({"extra": 1}, "extra"),
])
def test_a_bad_overlay_is_refused_naming_the_field(bad, needle) -> None:
    base = {"node": "node-a", "group": "rack", "caps": {}, "safe": {"a0": 500.0}, "period_s": 1.0, "revision": 0,
            "issued_at": 0.0}
    with pytest.raises(ValidationError, match=needle):
        Overlay.model_validate({**base, **bad})
