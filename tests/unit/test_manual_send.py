"""Sends by hand (trigger, Flower's task API): options, destinations and payloads, checked before publishing."""

from __future__ import annotations

import io
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.config import load_config
from powerfleet.textinput import InputError, read_text
from powerfleet.workers.app import SEND_ERRORS, create_app
from powerfleet.workers.manual import MAX_DELAY_S, OPTIONS, NoLiveAgent, SendRefused, check_manual_send

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def app():
    return create_app(load_config(environ={}), "redis://127.0.0.1:1/0")


def _check(app, name="powerfleet.fleet.echo", kwargs=None, options=None, live=("a",)):
    return check_manual_send(app, name, None, kwargs or {}, options or {}, now=NOW, node_expires_s=15,
                             is_live=lambda node: node in live)


def test_a_node_order_goes_to_its_own_live_agent_and_expires(app) -> None:
    assert _check(app, "powerfleet.agent.reconcile", {"node": "a"}) == {"queue": "node.a", "expires": 15}
    assert _check(app, "powerfleet.agent.reconcile", {"node": "a"}, {"expires": 600})["expires"] == 15
    with pytest.raises(NoLiveAgent, match="no live agent serves node 'ghost'"):
        _check(app, "powerfleet.agent.reconcile", {"node": "ghost"})
    with pytest.raises(SendRefused, match="not this order's node queue"):
        _check(app, "powerfleet.agent.reconcile", {"node": "a"}, {"queue": "node.b"})


def test_dates_become_relative_seconds(app) -> None:
    got = _check(app, options={"eta": "2027-01-15 08:00:10.000000", "expires": "2027-01-15T08:01:00+00:00"})
    assert got == {"queue": "control", "countdown": pytest.approx(10.0), "expires": pytest.approx(60.0)}
    with pytest.raises(SendRefused, match="is in the past"):
        _check(app, options={"expires": "2000-01-01 00:00:00.000000"})
    with pytest.raises(SendRefused, match="not both"):
        _check(app, options={"eta": "2027-01-15 08:00:10.000000", "countdown": 1})


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*OPTIONS, "routing_key", "exchange", "priority"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                                 st.text(max_size=30), st.sampled_from(["json", "pickle", "control", "sweep",
                                                                         "node.a", "node.../x", "2027-01-15 08:00:00"])),
                       max_size=4))
def test_any_options_are_refused_in_one_line_or_published_bounded(app, options) -> None:
    try:
        out = _check(app, options=options)
    except SEND_ERRORS as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert set(out) <= {"queue", "countdown", "expires"}
    assert out["queue"] in ("control", "sweep")
    for key in ("countdown", "expires"):
        if key in out:
            assert isinstance(out[key], float) and math.isfinite(out[key]) and 0 <= out[key] <= MAX_DELAY_S


def test_payload_over_the_limit_is_refused(app) -> None:
    with pytest.raises(SendRefused, match="over the task API's limit of 1048576 bytes"):
        _check(app, kwargs={"payload": "x" * (1024 * 1024)})


def test_reader_is_bounded_and_refuses_closed_or_binary_stdin(tmp_path, monkeypatch) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"a" * 2049)
    with pytest.raises(InputError, match="larger than 2048 bytes"):
        read_text(big, limit=2048)
    assert read_text(big, limit=4096) == "a" * 2049
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(InputError, match="stdin is closed"):
        read_text("-")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"a": "caf\xe9"}')))
    with pytest.raises(InputError, match="stdin is not UTF-8 text"):
        read_text("-")


def test_skipped_results_and_ticks_lead_with_a_summary_flower_can_search() -> None:
    from powerfleet.workers.app import TICK_FAMILIES
    from powerfleet.workers.outcomes import summarised

    skipped = summarised("powerfleet.agent.reconcile", {"node": "a", "ran": True, "skipped": "pod list failed: 503"},
                         TICK_FAMILIES)
    assert list(skipped)[0] == "summary" and skipped["summary"] == "skipped: pod list failed: 503"
    assert skipped["skipped"] == "pod list failed: 503"  # the result's own fields stay as they were
    window = summarised("powerfleet.retune.window", {"status": "abandoned", "reason": "cut failed"}, TICK_FAMILIES)
    assert window["summary"] == "skipped: abandoned: cut failed"
    assert summarised("powerfleet.budget.tick", {"at": 1.0}, TICK_FAMILIES) == {"summary": "fleet-tick budget", "at": 1.0}
    ok = {"node": "a", "ran": True, "skipped": None}
    assert summarised("powerfleet.agent.reconcile", ok, TICK_FAMILIES) is ok
    assert summarised("powerfleet.retune.window", {"status": "not-leader"}, TICK_FAMILIES) == {"status": "not-leader"}


@pytest.mark.parametrize("allow", [False, True])
def test_flower_worker_control_is_patched_off_unless_allowed(allow: bool) -> None:
    import subprocess

    # In a fresh interpreter: the patch changes Flower's handler classes for the whole process.
    code = ("from powerfleet.cli.flower_api import install_task_api_checks, CONTROL_HANDLERS\n"
            "from flower.api import control, tasks, BaseApiHandler\n"
            f"install_task_api_checks(allow_worker_control={allow})\n"
            "handlers = [getattr(control, n) for n in CONTROL_HANDLERS] + [tasks.TaskAbort]\n"
            "print(sorted({h.prepare is BaseApiHandler.prepare for h in handlers}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("[True]" if allow else "[False]")


def test_a_load_proposal_no_role_could_follow_is_refused_where_it_is_sent(app) -> None:
    from powerfleet.tasks.base import TaskInputError

    ok = {"deployment": "default/a", "load": {"decode": 30.0}, "target_per_replica": {"decode": 10.0}}
    app.check_send("powerfleet.budget.propose_load", None, ok)
    for load, target in ((1e300, 1e-300), (10.0, 0.0)):
        bad = {**ok, "load": {"decode": load}, "target_per_replica": {"decode": target}}
        with pytest.raises(TaskInputError) as got:
            app.check_send("powerfleet.budget.propose_load", None, bad)
        assert "\n" not in str(got.value) and "target_per_replica" in str(got.value)
