"""A DGD deleted and recreated under its name while a sweep of the old object is in flight
(issue 33 item 1): real Redis, real control and sweep worker processes, the loopback API
server and frontends.

The control worker is paused (SIGSTOP on its process group) while the leader's steps run
here under its identity: the window step launches the old object's sweep, the real sweep
worker computes its shards and queues the harvest on the paused control queue, the DGD is
recreated, and the leader's tick moves the state to the new UID. Resumed, the control worker
harvests the old sweep: it must drop it, never decide it into the new object's state nor
PATCH the new object's routers. No timing decides the order.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from powerfleet.clock import SystemClock
from powerfleet.retune import control, live
from powerfleet.retune.fanin import FanIn, sweep_id
from powerfleet.retune.settings import resolve
from powerfleet.testing.retune_world import dgd_object, start_of, traffic_lines, write_segments
from tests.retune.conftest import make_ports
from tests.retune.test_live_e2e import K, fleet, state_of, tick  # noqa: F401  (fleet: this module's own)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
DGD_API = ("nvidia.com/v1alpha1", "DynamoGraphDeployment")
LEADER = "ctl@retune"


def test_a_sweep_of_a_deleted_dgd_never_lands_on_the_dgd_recreated_under_its_name(fleet: dict[str, Any],
                                                                                  redis_url: str) -> None:
    world, app, kube, r = fleet["world"], fleet["app"], fleet["kube"], fleet["r"]
    cfg = fleet["config"].retune
    llama = world.frontends["llama"]
    k = K + 1
    tick(app, start_of(k - 1) + 1)  # enabled during window k - 1: k is the first launched
    first = tick(app, start_of(k) + 1)
    term = next(d["term"] for d in first["deployments"] if d["deployment"] == "llama")
    write_segments(world.trace_dir, "llama", sorted(llama), traffic_lines(60, start_of(k)))
    old_uid = state_of(kube, "llama").dgd_uid
    fan = FanIn(r)
    sid = sweep_id("llama", k, resolve(cfg, "llama").generation, term)
    ctl = fleet["ctl"].proc.pid
    os.killpg(ctl, signal.SIGSTOP)
    try:
        publish = lambda name, kw, opts: app.send_task(name, kwargs=kw, **opts)  # noqa: E731
        leader = make_ports(redis_url, kube, LEADER, SystemClock(), send=publish)
        out = live.launch_window(cfg, leader, "llama", k, leader=LEADER, term=term,
                                 generation=resolve(cfg, "llama").generation)
        assert out["status"] == "launched", out
        rec = fan.sweep(sid)
        assert rec is not None and rec.dgd_uid == old_uid and all(sh.dgd_uid == old_uid for sh in rec.shards), rec
        wait_for(lambda: fan.complete(rec), "the real sweep worker to finish the old object's shards", 120)
        world.api.delete(*DGD_API, "llama")
        world.api.apply(dgd_object("llama", frontends=len(llama)))  # a new object: a new uid
        quiet = make_ports(redis_url, kube, LEADER, SystemClock())  # its harvest message is not sent
        row = control.tick_deployment(cfg, quiet, "llama", start_of(k + 1) + 11)
        assert row["status"] == "leader", row
        new = state_of(kube, "llama")
        assert new.dgd_uid and new.dgd_uid != old_uid and new.history == [] and new.dgd_since is not None, new
        writes = {p: sum(1 for w in fe.writes if w.policy_sent) for p, fe in llama.items()}
        before = {p: fe.policy.model_dump() for p, fe in llama.items()}
    finally:
        os.killpg(ctl, signal.SIGCONT)  # the harvest queued by the last shard runs now
    done = wait_for(lambda: (lambda s: s if s is not None and s.status != "running" else None)(fan.sweep(sid)),
                    "the old object's sweep to end", 120)
    assert (done.status, "recreated" in done.reason) == ("dropped", True), done
    after = state_of(kube, "llama")
    assert after.dgd_uid == new.dgd_uid and not any(h.outcome == "apply" for h in after.history), after.history
    assert after.desired is None, after
    assert {p: sum(1 for w in fe.writes if w.policy_sent) for p, fe in llama.items()} == writes
    assert {p: fe.policy.model_dump() for p, fe in llama.items()} == before
