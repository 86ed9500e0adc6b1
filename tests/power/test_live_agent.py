"""End to end with real parts: redis-server, a real `powerfleet agent` worker on simulated GPUs, the
loopback Kubernetes API server. The guard's period (tasks/power.py's ``run_guard``, the task's body)
reads the node's reports from Redis and sends its overlay through the broker; the agent lowers the
low-priority GPU's cap; once the overlays stop, the agent moves both GPUs to their safe caps; when the
guard is back it resumes from them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.config import load_config
from powerfleet.power.live import GroupView
from powerfleet.power.telemetry import REPORT_KEY, RedisTelemetry, publish_telemetry
from powerfleet.tasks.power import LOCK_KEY, draw_history, run_guard
from powerfleet.testing.waiting import wait_for
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import FleetCelery, create_app
from powerfleet.workers.launcher import Child, Launcher
from tests.agent.conftest import device
from tests.integration.conftest import broker_url, redis_server, wait_worker  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

NODE = "gpu-node-a"
# The guard period. Its overlays live 1.5 periods: at 1 s a loaded agent took the overlay after it had
# expired (issue 37 named both tests as likely to flake), so the period is long enough for a loaded
# machine and the waits below are derived from it.
PERIOD_S = 4.0
WAIT_S = 20 + 3 * PERIOD_S
LOW, HIGH = "aaaaaaaa-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b"


def pod(name: str, uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "llm", "uid": uid, "annotations": {POWER_ANNOTATION: "700"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "m"}]}, "status": {"phase": "Running"}}


@dataclass
class Node:
    app: FleetCelery
    gpus: SimulatedGpus
    agent: Child
    r: redis.Redis

    def limits(self) -> list[float]:
        return [d.current_w or 0 for d in self.gpus.devices()]


class StaticTopology:
    def view(self, group: str) -> GroupView:
        return GroupView(nodes=frozenset({NODE}), priority={LOW: "low", HIGH: "high"})


@pytest.fixture
def node(tmp_path: Path, broker_url: str) -> Iterator[Node]:  # noqa: F811
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.apply(pod("low-0", LOW))
        api.apply(pod("high-0", HIGH))
        env = {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig), "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"),
               "POWERFLEET_AGENT__NAMESPACES": "[llm]", "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc"),
               "POWERFLEET_BUDGET__GROUPS": "{rack-a: {limit_w: 1000, oversubscription: 1.4}}",
               # the ceiling off: at 1.4x the default 1.25 would hold the low GPU at 550 W throughout
               # (test_cap_ceiling.py); these figures are the throttle's and the fallback's
               "POWERFLEET_POWER__GUARD_PERIOD_S": str(PERIOD_S), "POWERFLEET_POWER__CAP_CEILING": "null"}
        write_proc_entry(tmp_path / "proc", 101, LOW)
        write_proc_entry(tmp_path / "proc", 102, HIGH)
        gpus = SimulatedGpus.shared(tmp_path / "sim" / f"{NODE}.json",
                                    [device(0, pids=[101]), device(1, pids=[102])])
        with Launcher(log_dir=tmp_path / "logs", env=dict(env)) as launcher:
            agent = launcher.spawn(NODE, "agent", "--node", NODE, "--metrics-port", "0")
            app = create_app(load_config(environ=env))
            wait_worker(app, f"agent@{NODE}")
            yield Node(app, gpus, agent, redis.Redis.from_url(broker_url))
            launcher.stop_child(agent)


def publish(node: Node, draw_w: float, at: float) -> None:
    """The agent's report as the agents publish it (docs/budget.md's hash; the publisher is in flight)."""
    publish_telemetry(node.r, NODE, {
        f"GPU-000{i}": {"pod_uid": uid, "requested_w": 700, "min_w": 200, "max_w": 700, "draw_w": draw_w, "at": at}
        for i, uid in enumerate((LOW, HIGH))}, ttl_s=45)


def test_the_guards_overlay_lowers_a_cap_and_stopped_overlays_move_the_node_to_its_safe_caps(node: Node) -> None:
    wait_for(lambda: node.limits() == [700, 700], "the agent's first pass (the annotation caps)")
    assert node.app.fleet_config.budget.oversubscribed() == {"rack-a": 1000}
    # 2 x 480 W = 960 W: above t1 (950 W), below t2.
    now = node.r.time()[0]
    publish(node, draw_w=480.0, at=float(now))
    result = run_guard(node.app, "rack-a", 1000, StaticTopology(), RedisTelemetry(node.r), node.r, float(now))
    assert result.ran and result.mode == "throttle_low" and result.overlays == [NODE]
    assert result.throttle == {"GPU-0000": pytest.approx(595.0)}  # low priority: 700 W x 0.85
    assert draw_history(node.r, "rack-a") == [(float(now), 960.0)]  # what admission reads
    # the run released its lock (the next period's run, due one period later, finds it free); a run
    # that finds another holding it does nothing
    assert node.r.get(LOCK_KEY.format(group="rack-a")) is None
    node.r.set(LOCK_KEY.format(group="rack-a"), "another run", px=60_000)
    assert not run_guard(node.app, "rack-a", 1000, StaticTopology(), RedisTelemetry(node.r), node.r, float(now)).ran
    node.r.delete(LOCK_KEY.format(group="rack-a"))

    wait_for(lambda: node.limits() == [595, 700], "the overlay to lower the low-priority GPU's cap", timeout_s=WAIT_S)
    # No further overlay: 1.5 periods after the last one the agent falls back, without a tick (60 s away),
    # to each GPU's share of the limit, 1000 W x 700 / 1400 = 500 W.
    wait_for(lambda: node.limits() == [500, 500], "the fallback to the safe caps", timeout_s=WAIT_S)
    # The guard is back (its last run lies more than 1.5 periods behind it): it resumes from the safe
    # caps the agents hold and releases stepwise (800 W < 0.90 x 1000 W: +50 W each), high priority first.
    # The agent publishes its own report after the fallback's pass: the test's report must come after it
    # (a loaded agent's publish landing later replaced it, and the guard read 2 x 500 W: throttle_all).
    wait_for(lambda: [json.loads(v).get("target_w") for v in node.r.hgetall(REPORT_KEY.format(node=NODE)).values()]
             == [500, 500], "the agent's report of its fallback pass", timeout_s=WAIT_S)
    now = node.r.time()[0] + 1
    publish(node, draw_w=400.0, at=float(now))
    back = run_guard(node.app, "rack-a", 1000, StaticTopology(), RedisTelemetry(node.r), node.r, float(now))
    assert back.mode == "release" and back.throttle == {"GPU-0000": 550.0, "GPU-0001": 550.0}
    wait_for(lambda: node.limits() == [550, 550], "the caps to follow the guard again", timeout_s=WAIT_S)
    log = node.agent.log.read_text()
    assert "group rack-a: no overlay from the power guard" in log and "Traceback" not in log, log


def test_a_forged_throttle_sent_raw_to_the_broker_changes_nothing(node: Node) -> None:
    # issue 29 item 2: caps of 1 W, period 3600 s, revision 10^18, straight onto the node's queue
    from powerfleet.power.authority import in_force

    wait_for(lambda: node.limits() == [700, 700], "the agent's first pass (the annotation caps)")
    forged = {"node": NODE, "group": "rack-a", "caps": {"GPU-0000": 1.0, "GPU-0001": 1.0},
              "safe": {"GPU-0000": 1.0, "GPU-0001": 1.0}, "period_s": 3600.0, "revision": 10**18, "issued_at": 0.0}
    result = node.app.send_task("powerfleet.agent.throttle", kwargs=forged).get(timeout=30)
    assert result["kept"] is False and result["refused"] == "period", result
    result = node.app.send_task("powerfleet.agent.throttle", kwargs={**forged, "period_s": PERIOD_S}).get(timeout=30)
    assert result["refused"] == "no_record", result  # no guard period is current: nothing to apply
    assert node.limits() == [700, 700]
    # a real guard period: its record is what the agent applies, whatever a message says
    now = float(node.r.time()[0])
    publish(node, draw_w=480.0, at=now)
    run = run_guard(node.app, "rack-a", 1000, StaticTopology(), RedisTelemetry(node.r), node.r, now)
    assert run.throttle == {"GPU-0000": pytest.approx(595.0)}, run
    wait_for(lambda: node.limits() == [595, 700], "the guard's own overlay", timeout_s=WAIT_S)
    record = in_force(node.r, {"rack-a"})
    assert [(o["node"], o["throttled"], o["gpus"]) for o in record] == [(NODE, 1, 2)], record
    assert record[0]["source"].startswith("guard epoch ") and 0 < record[0]["expires_in_s"] <= 1.5 * PERIOD_S, record
    epoch, revision = record[0]["source"].split()[-1], record[0]["revision"]
    for bad, reason in (({"revision": 10**18, "epoch": epoch}, "future_revision"),
                        ({"revision": revision, "epoch": "beef"}, "foreign_epoch")):
        result = node.app.send_task("powerfleet.agent.throttle",
                                    kwargs={**forged, "period_s": PERIOD_S, **bad}).get(timeout=30)
        assert result["refused"] in (reason, "no_record"), result  # no_record: the record expired meanwhile
    # the guard's next period is still taken: the forged revision poisoned nothing
    now = float(node.r.time()[0]) + 1
    publish(node, draw_w=300.0, at=now)
    back = run_guard(node.app, "rack-a", 1000, StaticTopology(), RedisTelemetry(node.r), node.r, now)
    assert back.mode == "release", back
    wait_for(lambda: node.limits()[0] > 595, "the guard's release to reach the agent", timeout_s=WAIT_S)
    assert 1 not in node.limits() and "refused powerfleet.agent.throttle" in node.agent.log.read_text()
