"""`powerfleet validate dgd-update` through the installed console script."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster.builders import disagg

POWERFLEET = str(Path(sys.executable).with_name("powerfleet"))
CAP = "spec.components[name=decode].podTemplate.metadata.annotations[dynamo.nvidia.com/gpu-power-limit]"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([POWERFLEET, "validate", "dgd-update", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def files(tmp_path):
    def write(name, obj, as_json=False):
        path = tmp_path / name
        path.write_text(json.dumps(obj) if as_json else yaml.safe_dump(obj))
        return str(path)
    return write


def test_allowed_update_exits_0(files):
    old = disagg()
    new = copy.deepcopy(old)
    new["spec"]["components"].reverse()
    new["spec"]["components"][0]["replicas"] = 9
    res = run("--old", files("old.yaml", old), "--new", files("new.json", new, as_json=True))
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_violations_exit_1_one_line_each(files):
    new = disagg(decode_cap="250")
    new["spec"]["components"][2]["multinode"] = {"nodeCount": 4}
    res = run("--old", files("old.yaml", disagg()), "--new", files("new.yaml", new))
    assert res.returncode == 1 and res.stderr == ""
    assert res.stdout.splitlines() == [
        f"{CAP}: '300' -> '250'",
        "spec.components[name=decode].multinode.nodeCount: 2 -> 4",
    ]
    res = run("--old", files("old.yaml", disagg()), "--new", files("new.yaml", new), "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["allowed"] is False and out["version"] == 1
    assert out["violations"][0] == {"path": CAP, "old": "300", "new": "250", "component": "decode"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not: [valid", "is not valid YAML or JSON"),
        ("- just\n- a list\n", "does not hold a DGD object"),
        (yaml.safe_dump({"metadata": {"name": "x"}, "spec": {"components": [{"name": "a", "type": "gpu"}]}}),
         "spec.components[name=a].type: unknown component type 'gpu'"),
    ],
)
def test_unreadable_input_exits_2_without_traceback(tmp_path, files, content, message):
    bad = tmp_path / "bad.yaml"
    if content is not None:
        bad.write_text(content)
    res = run("--old", str(bad), "--new", files("new.yaml", disagg()))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("powerfleet: error: ")
    assert message in res.stderr and "Traceback" not in res.stderr
