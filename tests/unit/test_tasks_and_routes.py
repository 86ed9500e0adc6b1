"""Task argument decoding, routing table and app settings (no broker needed)."""

import pytest

from powerfleet.cli.context import redact
from powerfleet.config import load_config
from powerfleet.queues import RoutingError, family_of, is_fleet_queue, route_task, worker_prefetch
from powerfleet.tasks.base import TaskInputError, decode_args
from powerfleet.tasks.retune import WindowArgs
from powerfleet.workers.app import beat_schedule, create_app


def test_decode_args_accepts_valid_keywords() -> None:
    assert decode_args("t", WindowArgs, (), {"dgd": "llama", "window": 3}) == WindowArgs(dgd="llama", window=3)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1,), {}, "t: takes keyword arguments only"),
        ((), {"dgd": "x"}, "t: window: Field required"),
        ((), {"dgd": "x", "window": "soon"}, "t: window: Input should be a valid integer"),
        ((), {"dgd": "x", "window": 1, "extra": 2}, "t: extra: unknown argument"),
        ((), {"dgd": "", "window": 1}, "t: dgd: String should have at least 1 character"),
    ],
)
def test_decode_args_rejects_bad_input_with_the_field(args, kwargs, message) -> None:
    with pytest.raises(TaskInputError) as err:
        decode_args("t", WindowArgs, args, kwargs)
    assert str(err.value).startswith(message)


def test_routes() -> None:
    assert family_of("powerfleet.agent.reconcile") == "node"
    assert route_task("powerfleet.agent.reconcile", (), {"node": "n1"}, {}) == {"queue": "node.n1"}
    assert route_task("powerfleet.sweep.shard", (), {}, {}) == {"queue": "sweep"}
    assert route_task("powerfleet.budget.evaluate", (), {}, {}) == {"queue": "control"}
    assert route_task("celery.chord_unlock", (), {}, {}) is None
    with pytest.raises(RoutingError, match="needs a 'node' keyword argument"):
        route_task("powerfleet.agent.reconcile", (), {}, {})


@pytest.mark.parametrize("bad", ["Bad Node", "gpu_01", "a/../b", "-gpu", "x" * 254, "gpu-1\n"])
def test_queue_names_are_built_only_from_valid_node_names(bad: str) -> None:
    # A node name becomes a queue, a Redis key and a consumer binding: nothing else may.
    with pytest.raises(RoutingError, match="is not a valid Kubernetes node name"):
        route_task("powerfleet.agent.reconcile", (), {"node": bad}, {})
    assert not is_fleet_queue(f"node.{bad}")


def test_fleet_queues_are_control_sweep_and_valid_node_queues() -> None:
    assert all(is_fleet_queue(q) for q in ("control", "sweep", "node.gpu-7", "node.a.b-c"))
    assert not any(is_fleet_queue(q) for q in ("node.", "celery", "Control", "nodes.gpu-7", "node"))


def test_app_is_json_only_with_late_acks_and_limits_from_config() -> None:
    cfg = load_config(environ={"POWERFLEET_LIMITS__NODE__SOFT_S": "11", "POWERFLEET_LIMITS__NODE__HARD_S": "12",
                               "POWERFLEET_NODES": "[gpu-1]"})
    app = create_app(cfg, "redis://127.0.0.1:1/0")
    assert app.conf.accept_content == ["json"] and app.conf.task_serializer == "json"
    assert worker_prefetch(["control", "sweep"], app.conf.worker_prefetch_multiplier) == 1
    assert worker_prefetch(["control"], 4) == 4
    agent = app.tasks["powerfleet.agent.reconcile"]
    assert (agent.soft_time_limit, agent.time_limit, agent.acks_late) == (11, 12, True)
    assert app.tasks["powerfleet.retune.window"].acks_late is True
    assert app.tasks["powerfleet.budget.tick"].acks_late is False  # a lost tick is replaced by the next
    assert {q.name for q in app.conf.task_queues} == {"control", "sweep", "node.gpu-1"}


def test_beat_schedule_uses_configured_intervals() -> None:
    cfg = load_config(environ={"POWERFLEET_BEAT__BUDGET_INTERVAL_S": "42"})
    sched = beat_schedule(cfg)
    assert sched["powerfleet-budget-tick"]["schedule"] == 42
    assert sched["powerfleet-budget-tick"]["task"] == "powerfleet.budget.tick"
    assert sched["powerfleet-reconcile-tick"]["schedule"] == 15
    assert sched["powerfleet-retune-tick"]["options"]["expires"] == 10


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://u:pw@h/0", "redis://u:***@h/0"),
    ],
)
def test_redact_hides_passwords(url, shown) -> None:
    assert redact(url) == shown


def test_queue_names_sit_on_the_bottom_floor_and_tasks_and_the_agent_import_them_downward() -> None:
    import subprocess
    import sys

    code = ("import sys\n"
            "import powerfleet.queues\n"
            "print(sorted(m for m in sys.modules if m.startswith('powerfleet.')))\n"
            "import powerfleet.agent.worker, powerfleet.tasks.agent, powerfleet.tasks.budget\n"
            "import powerfleet.tasks.fleet, powerfleet.tasks.retune\n"
            "print(sorted(m for m in sys.modules if m.startswith(('powerfleet.workers', 'powerfleet.cli'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    floor, above = (eval(line) for line in out.stdout.split("\n")[:2])  # noqa: S307 - our own print
    assert "powerfleet.queues" in floor and all(m == "powerfleet.queues" or m.startswith("powerfleet.config.") or
                                                m == "powerfleet.config" for m in floor), floor
    assert above == [], above
