"""The task API's trust boundary (issue 29): which tasks and fields a person may send, and strict types.

Each task declares through ``fleet_task(manual=...)`` whether a person may send it and which of
its fields a person may set; ``check_send(task_api=True)`` (trigger, Flower) refuses the rest in
one line. Argument models are decoded strictly wherever a message is decoded (the sender and the
task's own ``run``, which is what a worker calls): no bool as a number, no string as a number.
"""

from __future__ import annotations

import pytest

from powerfleet.config import load_config
from powerfleet.tasks.base import TaskInputError, decode_args, manual_fields_of
from powerfleet.tasks.budget import EvaluateArgs, ProposeArgs, ProposeLoadArgs
from powerfleet.tasks.retune import WindowArgs
from powerfleet.workers.app import SEND_ERRORS, NotManual, create_app
from powerfleet.workers.manual import check_manual_send

INTERNAL = {"powerfleet.agent.throttle", "powerfleet.power.guard", "powerfleet.sweep.shard",
            "powerfleet.retune.harvest", "powerfleet.budget.evaluate_batch"}


@pytest.fixture(scope="module")
def app():
    return create_app(load_config(environ={}), "redis://127.0.0.1:1/0")


def _send(app, name, kwargs):
    return check_manual_send(app, name, None, kwargs, {}, now=1_800_000_000.0, node_expires_s=15,
                             is_live=lambda node: True)


def test_every_task_declares_who_may_send_it(app) -> None:
    declared = {n: manual_fields_of(t) for n, t in app.tasks.items() if n.startswith("powerfleet.")}
    assert {n for n, f in declared.items() if f is None} == INTERNAL, declared
    assert declared["powerfleet.budget.evaluate"] == {"deployment"}
    assert declared["powerfleet.retune.window"] == {"dgd", "window"}
    assert declared["powerfleet.budget.propose"] == set(ProposeArgs.model_fields)


OVERLAY = {"node": "a", "group": "rack-a", "caps": {"GPU-1": 1.0}, "safe": {"GPU-1": 1.0}, "period_s": 3600,
           "revision": 10**18, "issued_at": 0.0}


@pytest.mark.parametrize(("name", "kwargs", "says"), [
    # The forged overlay of issue 29 (1 W caps for an hour, a revision from the future).
    ("powerfleet.agent.throttle", OVERLAY, "powerfleet.agent.throttle: an internal task"),
    ("powerfleet.power.guard", {"group": "rack-a"}, "powerfleet.power.guard: an internal task"),
    ("powerfleet.sweep.shard", {"sid": "s"}, "powerfleet.sweep.shard: an internal task"),
    ("powerfleet.retune.harvest", {"sid": "s"}, "powerfleet.retune.harvest: an internal task"),
    # The tick's generation is the fleet's (the allowance it names is read from Redis, but a
    # person gets none: scale-ups blocked). The forged group limit of issue 29 no longer exists
    # in the message at all (test_a_forged_group_limit_is_no_argument below).
    ("powerfleet.budget.evaluate", {"deployment": "a/b", "generation": 10**15},
     "powerfleet.budget.evaluate: generation: set only by the fleet"),
    ("powerfleet.budget.evaluate_batch", {"deployments": ["a/b"], "generation": 1},
     "powerfleet.budget.evaluate_batch: an internal task"),
    ("powerfleet.retune.window", {"dgd": "d", "window": 0, "leader": "me", "term": 99},
     "powerfleet.retune.window: leader: set only by the fleet"),
])
def test_an_internal_task_or_field_is_refused_in_one_line(app, name, kwargs, says) -> None:
    with pytest.raises(NotManual) as got:
        _send(app, name, kwargs)
    assert str(got.value).startswith(says) and "\n" not in str(got.value), str(got.value)


def test_the_manual_part_of_a_task_is_still_sendable(app) -> None:
    assert _send(app, "powerfleet.budget.evaluate", {"deployment": "a/b"}) == {"queue": "control"}
    assert _send(app, "powerfleet.retune.window", {"dgd": "d", "window": 0}) == {"queue": "control"}
    # The fleet's own sender still sets the tick's fields.
    app.check_send("powerfleet.budget.evaluate", None, {"deployment": "a/b", "generation": 5})


@pytest.mark.parametrize("field", ["group", "group_limit_w", "group_gpu_capacity", "from_tick"])
def test_a_forged_group_limit_is_no_argument(app, field) -> None:
    # 16 decode replicas on a 32-GPU rack came from these fields (issue 29): refused by whoever sends.
    with pytest.raises(TaskInputError, match=f"{field}: unknown argument"):
        app.check_send("powerfleet.budget.evaluate", None, {"deployment": "a/b", field: 10**9})
    with pytest.raises(TaskInputError, match=f"{field}: unknown argument"):
        app.tasks["powerfleet.budget.evaluate"](deployment="a/b", **{field: 10**9})


@pytest.mark.parametrize(("name", "kwargs", "says"), [
    ("powerfleet.budget.propose", {"deployment": "a/b", "replicas": {"worker": True}},
     "replicas.worker: Input should be a valid integer"),
    ("powerfleet.budget.propose", {"deployment": "a/b", "replicas": {"worker": "4"}},
     "replicas.worker: Input should be a valid integer"),
    ("powerfleet.budget.propose", {"deployment": "a/b", "replicas": {"worker": 4.0}},
     "replicas.worker: Input should be a valid integer"),
    ("powerfleet.retune.window", {"dgd": "d", "window": "5"}, "window: Input should be a valid integer"),
    ("powerfleet.retune.tick", {"now": "1"}, "now: Input should be a valid number"),
    ("powerfleet.retune.tick", {"now": True}, "now: Input should be a valid number"),
    ("powerfleet.budget.propose_load", {"deployment": "a/b", "load": {"decode": "3"},
                                        "target_per_replica": {"decode": 1}}, "load.decode: Input should be a valid number"),
    ("powerfleet.fleet.echo", {"payload": 1, "extra": 1}, "extra: unknown argument"),
])
def test_a_value_of_another_type_is_refused_not_coerced(app, name, kwargs, says) -> None:
    with pytest.raises(TaskInputError) as got:
        _send(app, name, kwargs)
    assert says in str(got.value), str(got.value)
    # The task's own run (what a worker calls with a message's kwargs) decodes the same way.
    with pytest.raises(TaskInputError) as ran:
        app.tasks[name](**kwargs)
    assert says in str(ran.value), str(ran.value)


def test_strict_decoding_keeps_what_json_means() -> None:
    # An integer is a number; a JSON array is what a list field takes.
    assert decode_args("t", EvaluateArgs, (), {"deployment": "a/b"}).generation is None
    load = {"deployment": "a/b", "load": {"decode": 3}, "target_per_replica": {"decode": 1.5}}
    assert decode_args("t", ProposeLoadArgs, (), load).target_per_replica == {"decode": 1.5}
    assert decode_args("t", WindowArgs, (), {"dgd": "d", "window": 3}).window == 3
    with pytest.raises(TaskInputError, match="not JSON"):
        decode_args("t", WindowArgs, (), {"dgd": "d", "window": float("nan")})


def test_every_refusal_is_one_of_the_send_errors(app) -> None:
    assert issubclass(NotManual, SEND_ERRORS)
