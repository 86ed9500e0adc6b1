"""An operator verb for a deployment retune does not know, and a harvest of a sweep that is not there,
answer "unknown" with a reason (issue 29, defect 9): no Lease is taken for a typo, the CLI exits 1,
and Flower's list shows the result as skipped."""

from __future__ import annotations

from powerfleet.clock import FakeClock
from powerfleet.retune import control, harvest
from powerfleet.testing.retune_world import start_of
from powerfleet.workers.app import TICK_FAMILIES
from powerfleet.workers.outcomes import summarised
from tests.retune.conftest import make_ports, retune_config

K = 29_000_200


def test_a_verb_for_an_unknown_deployment_is_unknown_and_takes_no_lease(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(start_of(K) + 1, 1.0))
    ports.r.flushdb()
    for verb in (control.reset_window, control.promote, control.rollback, control.apply_now):
        out = verb(cfg, ports, "nosuch")
        assert out["status"] == "unknown" and "'nosuch' is not a retuned deployment" in out["reason"], out
    leases = kube.coordination.list_namespaced_lease(cfg.namespace).items
    assert not [x.metadata.name for x in leases if "nosuch" in x.metadata.name], [x.metadata.name for x in leases]
    assert control.reset_window(cfg, ports, "llama")["status"] in ("reset", "unchanged")  # a known one still runs
    shown = summarised("powerfleet.retune.reset_window", control.reset_window(cfg, ports, "nosuch"), TICK_FAMILIES)
    assert shown["summary"].startswith("skipped: unknown: 'nosuch' is not a retuned deployment"), shown


def test_a_harvest_of_an_unknown_sweep_says_so(world, kube, redis_url) -> None:
    cfg = retune_config(world, [])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(start_of(K) + 1, 1.0))
    out = harvest.harvest(cfg, ports, "nosuch")
    assert out["status"] == "unknown" and "no sweep 'nosuch'" in out["reason"], out
    assert summarised("powerfleet.retune.harvest", out, TICK_FAMILIES)["summary"].startswith("skipped: unknown"), out
