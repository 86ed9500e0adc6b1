"""The demo's self-checks (pure), its live view's plain mode, and the report files."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from powerfleet.twin.demo import checks as C
from powerfleet.twin.serving.frontends import WindowTtft
from powerfleet.twin.gpus.nodes import GpuSample
from powerfleet.twin.demo.report import summary, write_report
from powerfleet.twin.runtime import Sample
from powerfleet.twin.demo.view import PlainView, ViewState, clock, make_view, tick_news


def _sample(t: float, cap: float, want: float | None, rack_w: float = 1000.0) -> Sample:
    g = GpuSample("n0", 0, "GPU-x", cap, min(cap, 300.0), "pod-a" if want else None, "decode", False)
    return Sample(t, rack_w, {"rack-a": rack_w}, [g], {"n0/0": want}, {"d": 3})


def test_power_check_names_the_worst_excess() -> None:
    ok = C.power_within_budget([_sample(0, 500, 500)], {"rack-a": 2000}, 2000)
    assert ok.ok and "1 samples" in ok.detail
    bad = C.power_within_budget([_sample(0, 500, 500, 2100), _sample(1, 500, 500, 2500)], {"rack-a": 3000}, 2000)
    assert not bad.ok and "fleet 500 W over budget at t=1" in bad.detail
    assert not C.power_within_budget([], {}, 1).ok


def test_caps_check_allows_one_lag_and_no_more() -> None:
    # A pod asks 400 W from t=10; the agent gets there at t=14: within a 5 s lag.
    series = [_sample(t, 700 if t < 14 else 400, 400) for t in range(10, 20)]
    assert C.caps_match_annotations(series, 5).ok
    slow = [_sample(t, 700 if t < 17 else 400, 400) for t in range(10, 20)]
    res = C.caps_match_annotations(slow, 5)
    assert not res.ok and "n0/0 at 700 W while its pod pod-a asks 400 W for 6 s" in res.detail
    # Before ``since`` (the fleet still starting) nothing is judged.
    assert C.caps_match_annotations(slow, 5, since=13).ok
    assert not C.caps_match_annotations([_sample(0, 700, None)], 5).ok  # nothing ever annotated


def test_windows_check_needs_an_outcome_for_each_and_one_decision() -> None:
    launched = [("a", 1), ("a", 2), ("b", 1)]
    decided = ("apply", "keep")
    full = {("a", 1): "apply", ("a", 2): "abandoned", ("b", 1): "keep"}
    res = C.windows_decided(launched, full, decided=decided)
    assert res.ok and "1 abandoned, 1 apply, 1 keep" in res.detail
    lost = C.windows_decided(launched, {("a", 1): "apply"}, decided=decided)
    assert not lost.ok and "a#2, b#1" in lost.detail
    assert C.windows_decided(launched, {("a", 1): "apply"}, still_running=[("a", 2), ("b", 1)], decided=decided).ok
    assert not C.windows_decided(launched, {w: "abandoned" for w in launched}, decided=decided).ok
    assert not C.windows_decided([], {}, decided=decided).ok


def test_task_failures_are_found_in_worker_logs() -> None:
    clean = [("control", "Task powerfleet.budget.tick[1] succeeded in 0.1s: {}")]
    assert C.no_task_failures(clean).ok
    res = C.no_task_failures(clean + [("sweep-1", "Task powerfleet.retune.shard[2] raised unexpected: KeyError('x')")])
    assert not res.ok and "sweep-1" in res.detail and "KeyError" in res.detail


def test_plain_view_prints_status_lines_and_each_decision_once() -> None:
    out = io.StringIO()
    view = PlainView(out, every_s=5)
    state = ViewState(elapsed_s=1, fleet_w=900, fleet_budget_w=2000, rack_w={"rack-a": 900},
                      rack_budget_w={"rack-a": 2000}, queues={"control": 2, "sweep": 0}, decisions=["cap set"])
    view.update(state)
    state.elapsed_s = 2
    view.update(state)
    text = out.getvalue()
    assert text.count("cap set") == 1 and text.count("power fleet 900/2000 W") == 1 and "control=2" in text
    assert isinstance(make_view(is_tty=lambda: False), PlainView)


def test_report_writes_summary_images_and_html(tmp_path: Path) -> None:
    samples = [_sample(float(t), 700 if t < 3 else 400, 400, 1000 + 10 * t) for t in range(10)]
    windows = [WindowTtft("llm-agg", k, 0.0, 10, 2, 900.0 - k, 1000.0, {"temperature": 0.0}) for k in range(3)]
    checks = [C.Check("power_within_budget", True, "fine"), C.Check("retune_applied", False, "absent")]
    data = summary(samples=samples, windows=windows, checks=checks, rack_budget_w={"rack-a": 2000},
                   fleet_budget_w=2000, extra={"nodes": 1, "steps": {"retune_applied": "failed: absent"}})
    index = write_report(tmp_path / "r", data, samples, windows, {"rack-a": 2000})
    saved = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert saved["checks"] == {"power_within_budget": True, "retune_applied": False}
    assert saved["power"]["rack_w"]["rack-a"]["max"] == 1090 and saved["retune_windows"][0]["ttft_ms_default"] == 1000
    html = index.read_text()
    assert "FAILED" in html and "absent" in html
    for name in ("power.png", "caps.png", "ttft.png"):
        with Image.open(tmp_path / "r" / name) as img:
            img.verify()
        assert f'src="{name}"' in html


def test_plain_output_prints_no_no_op_tick_lines_and_counts_them() -> None:
    assert tick_news("reconcile", "agent.reconcile -> node.a", None, 10) is None
    assert tick_news("retune", "no closed window to launch", None, 10) is None
    assert tick_news("budget", "budget.evaluate -> d/a", "budget.evaluate -> d/a", 10) is None
    assert tick_news("budget", "budget.evaluate -> d/a", None, 10) == "budget tick: budget.evaluate -> d/a"
    news = tick_news("retune", "launched llm-agg window 180000000", None, 10)
    # A window is shown as the clock times it covers, not as an epoch index.
    assert news == f"retune: sweep launched for llm-agg window {clock(1_800_000_000)}-{clock(1_800_000_010)}"
    out = io.StringIO()
    state = ViewState(elapsed_s=1, now=1_800_000_000, fleet_w=900, fleet_budget_w=2000, rack_w={"rack-a": 900},
                      rack_budget_w={"rack-a": 2000}, quiet_ticks={"reconcile": 7, "retune": 3})
    PlainView(out, every_s=5).update(state)
    text = out.getvalue()
    assert "tick:" not in text and "ticks without change: reconcile 7, retune 3" in text
    assert text.startswith(f"  {clock(1_800_000_000)}  power fleet 900/2000 W | rack-a 900/2000 W")


def test_report_timeline_has_run_events_and_cap_changes_by_deployment_and_role(tmp_path: Path) -> None:
    def sample(t: float, decode_cap: float) -> Sample:
        gpus = [GpuSample("n0", i, f"GPU-{i}", decode_cap, 300.0, f"llm-agg-decode-{i}", "decode", True) for i in (0, 1)]
        gpus.append(GpuSample("n0", 2, "GPU-2", 700.0, 60.0, None, None, False))
        return Sample(t, 660.0, {"rack-a": 660.0}, gpus, {}, {"llm-agg": 3})

    samples = [sample(100.0 + t, 700 if t < 3 else 450) for t in range(6)]
    data = summary(samples=samples, windows=[], checks=[], rack_budget_w={"rack-a": 2000}, fleet_budget_w=2000,
                   extra={"dropped_requests": {"llm-agg": {"requests": 4, "cause": "no frontend pod of the deployment "
                                                                                   "was running"}}},
                   events=[(101.0, "retune llm-agg window 10:00:00-10:00:10: apply - gain 3.2 %")])
    assert [e["event"] for e in data["timeline"]] == [
        "retune llm-agg window 10:00:00-10:00:10: apply - gain 3.2 %",
        "caps llm-agg/decode: 700 W on 2 GPUs -> 450 W on 2 GPUs"]
    assert data["timeline"][1]["t_s"] == 3.0 and data["timeline"][1]["at"] == clock(103.0)
    index = write_report(tmp_path / "r", data, samples, [], {"rack-a": 2000})
    html = index.read_text()
    assert "<h2>Timeline</h2>" in html and "caps llm-agg/decode: 700 W on 2 GPUs -&gt; 450 W on 2 GPUs" in html
    assert "no frontend pod of the deployment was running" in html


def test_index_html_renders_in_a_headless_browser(tmp_path: Path) -> None:
    """Chromium from Debian's `chromium` package; skipped where it is not installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium (apt-get install chromium)")
    samples = [_sample(float(t), 400, 400, 1000 + 10 * t) for t in range(5)]
    data = summary(samples=samples, windows=[], checks=[C.Check("power_within_budget", True, "fine")],
                   rack_budget_w={"rack-a": 2000}, fleet_budget_w=2000, extra={"nodes": 1})
    index = write_report(tmp_path / "r", data, samples, [], {"rack-a": 2000})
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1000,1600", f"--screenshot={shot}", index.as_uri()],
                   capture_output=True, timeout=120, check=True)
    with Image.open(shot) as img:
        assert img.size == (1000, 1600)
        # The page drew something beyond a blank background: the plots are many-coloured.
        assert len(img.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 50


def test_rich_view_renders_every_panel() -> None:
    from rich.console import Console

    from powerfleet.twin.demo.view import render

    console = Console(file=io.StringIO(), width=120, color_system=None)
    state = ViewState(elapsed_s=12, duration_s=180, flower_url="http://127.0.0.1:5555", fleet_w=900,
                      fleet_budget_w=2000, rack_w={"rack-a": 900}, rack_budget_w={"rack-a": 2000},
                      caps={"twin-gpu-00": [700, 380]}, queues={"control": 1}, decisions=["retune apply"],
                      steps={"cap_change": "ok", "retune_applied": "failed: absent"})
    console.print(render(state))
    text = console.file.getvalue()
    for part in ("12 s of 180 s", "http://127.0.0.1:5555", "900 / 2,000 W", "700 380", "retune apply",
                 "failed: absent", "control"):
        assert part in text, part


def test_demo_gives_each_process_its_own_metrics_port() -> None:
    from powerfleet.cli.demo_cmd import metrics_ports

    _, ports = metrics_ports(9100, ["n0", "n1"])
    got = {name: env["POWERFLEET_METRICS__PORT"] for name, env in ports.items()}
    assert got == {"control": "9100", "sweep-1": "9101", "sweep-2": "9102", "agent-n0": "9103", "agent-n1": "9104",
                   "beat": "9105"}
    _, off = metrics_ports(0, ["n0"])
    assert all(env == {} for env in off.values())


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["reconcile", "budget", "retune"]), st.text(max_size=80), st.none() | st.text(max_size=20))
def test_tick_news_is_one_line_or_nothing(family: str, detail: str, before: str | None) -> None:
    news = tick_news(family, detail, before, 10)
    assert news is None or (isinstance(news, str) and news and "\n" not in news)
    if family == "reconcile":
        assert news is None
