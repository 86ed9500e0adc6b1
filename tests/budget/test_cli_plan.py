"""`powerfleet budget plan` through the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

POWERFLEET = str(Path(sys.executable).with_name("powerfleet"))

GOOD = {"budget": {"power_limit_w": 8000, "max_gpus": 16, "min_gpus": -1},
        "roles": {"prefill": {"watts_per_replica": 700, "gpus_per_replica": 2, "min_replicas": 1, "ready": 2,
                              "proposed": 4, "rolling": False},
                  "decode": {"watts_per_replica": 1200, "gpus_per_replica": 4, "min_replicas": 1, "ready": 2,
                             "proposed": 3, "rolling": False}}}


# issue 18's worked case: prefill 700 W per replica, ready 2, proposed 6; decode 2,400 W, ready 1, desired 2
IN_FLIGHT = {"budget": {"power_limit_w": 8000},
             "roles": {"prefill": {"watts_per_replica": 700, "gpus_per_replica": 2, "ready": 2, "proposed": 6},
                       "decode": {"watts_per_replica": 2400, "gpus_per_replica": 4, "ready": 1, "desired": 2}}}


def run(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "in.json"
    path.write_text(text)
    return subprocess.run([POWERFLEET, "budget", "plan", "--input", str(path), *flags],
                          capture_output=True, text=True, timeout=60)


def test_one_object_answers_one_json_line(tmp_path):
    out = run(tmp_path, json.dumps(GOOD, indent=2), "--json")
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    ans = json.loads(line)
    # 4*700 + 3*1200 = 6400 W fits; 4*2 + 3*4 = 20 GPUs does not: clamped to 16
    assert ans["schema"] == "powerfleet.budget.plan/v1" and ans["gpus"] <= 16
    assert ans["reasons"] == ["gpu_budget_clamped"] and ans["settled_w"] <= 8000
    assert set(ans["targets"]) == {"prefill", "decode"}


def test_json_lines_answer_line_by_line_and_exit_2_at_the_end(tmp_path):
    bad_min = {"budget": {"power_limit_w": 100}, "roles": {"w": {"watts_per_replica": 700, "gpus_per_replica": 1}}}
    unknown = {**GOOD, "extra": 1}
    no_proposal = {"budget": {"power_limit_w": 8000}, "roles": {"w": {"watts_per_replica": 700, "gpus_per_replica": 1, "ready": 2}}}
    floor_above = {"budget": {"power_limit_w": 8000, "max_gpus": 10, "min_gpus": 12}, "roles": GOOD["roles"]}
    lines = [json.dumps(x) for x in (GOOD, bad_min, unknown, no_proposal, IN_FLIGHT, floor_above)]
    lines.append('{"budget": 1, "budget": 2}')
    out = run(tmp_path, "\n".join(lines) + "\n", "--json")
    assert out.returncode == 2
    answers = [json.loads(x) for x in out.stdout.splitlines()]
    assert len(answers) == 7 and "targets" in answers[0]
    # decode 1 -> 2 in flight: charged at 2 (4,800 W) and rolling, so prefill's 2 -> 6 is held (never 9,000 W)
    assert answers[4]["targets"] == {"prefill": None, "decode": None} and answers[4]["settled_w"] == 6200
    assert answers[4]["settled_w"] <= 8000 and answers[4]["peak_w"] <= 8000 and answers[4]["peak_gpus"] == 12
    assert answers[5]["error"] == "budget.min_gpus: 12 is above budget.max_gpus (10)"
    assert answers[1]["error"] == "the minimum footprint (700 W) exceeds the power limit (100 W)"
    assert answers[2]["error"] == "extra: unknown key"
    assert answers[3]["targets"] == {"w": None}  # no proposal: leave as is
    assert "duplicate key 'budget'" in answers[6]["error"]


def test_text_output_and_unreadable_input(tmp_path):
    out = run(tmp_path, json.dumps(GOOD))
    assert out.returncode == 0 and out.stdout.startswith("prefill=") and "reasons=gpu_budget_clamped" in out.stdout
    assert " peak_gpus=16 " in out.stdout
    missing = subprocess.run([POWERFLEET, "budget", "plan", "--input", str(tmp_path / "nope.json")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr.startswith("powerfleet: error: --input: cannot read")
    assert "Traceback" not in missing.stderr
