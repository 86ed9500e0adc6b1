"""The Dockerfile, checked statically (no Docker engine here): its stages, a non-root runtime user
that matches the chart, no secrets copied, `powerfleet` as the entry point, and `make image`."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ALLOWED_SOURCES = {"pyproject.toml", "README.md", "src", "tests"}
SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|API_?KEY|PRIVATE)", re.I)


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) from a Dockerfile; continuation lines joined, comments dropped."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            stages.append(Stage(name=name, base=parts[0]))
        elif not stages:
            if op == "ARG":
                key, _, default = rest.partition("=")
                args[key] = default
        else:
            stages[-1].instructions.append((op, rest))
    return args, stages


def _load() -> tuple[dict[str, str], dict[str, Stage]]:
    args, stages = parse_dockerfile((REPO / "Dockerfile").read_text())
    return args, {s.name: s for s in stages}


def test_stages_are_build_runtime_and_test_from_one_base() -> None:
    args, stages = _load()
    assert list(stages) == ["build", "runtime", "test"]
    assert stages["build"].base == stages["runtime"].base == "${PYTHON_IMAGE}"
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", args["PYTHON_IMAGE"]), args["PYTHON_IMAGE"]
    assert stages["test"].base == "runtime", "the tests run against the exact runtime layers"


def test_runtime_runs_as_the_non_root_user_the_chart_expects() -> None:
    _, stages = _load()
    runtime = stages["runtime"]
    user = runtime.all("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric uid lets runAsNonRoot verify it"
    values = yaml.safe_load((REPO / "charts" / "powerfleet" / "values.yaml").read_text())
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    assert int(gid) == values["podSecurityContext"]["runAsGroup"]
    # The test stage drops back to that user before running the tests.
    assert stages["test"].all("USER")[-1] == user


def test_entry_point_is_powerfleet() -> None:
    _, stages = _load()
    (entry,) = stages["runtime"].all("ENTRYPOINT")
    assert json.loads(entry) == ["powerfleet"]
    assert not stages["test"].all("ENTRYPOINT")


def test_the_test_stage_runs_the_unit_tests() -> None:
    _, stages = _load()
    runs = " ".join(stages["test"].all("RUN"))
    assert re.search(r"python -m pytest .*tests/unit", runs), runs
    assert "[test]" in runs, "installs the package's own test extras"
    runtime_text = " ".join(a for _, a in stages["runtime"].instructions)
    assert "pytest" not in runtime_text and "tests" not in runtime_text


def test_only_the_sources_are_copied_and_no_secret_is_baked_in() -> None:
    _, stages = _load()
    for stage in stages.values():
        assert not stage.all("ADD"), "ADD can fetch URLs and unpack archives: use COPY"
        for copy in stage.all("COPY"):
            words = shlex.split(copy)
            if any(w.startswith("--from=") for w in words):
                continue
            sources = [w for w in words if not w.startswith("--")][:-1]
            assert sources and set(s.rstrip("/").removeprefix("./") for s in sources) <= ALLOWED_SOURCES, copy
        for op in ("ENV", "ARG"):
            for decl in stage.all(op):
                for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", decl) or [decl.split("=")[0]]:
                    assert not SECRET_NAME.search(name), f"{stage.name}: {op} {name}"


def test_dockerignore_admits_only_the_copied_sources() -> None:
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**", "exclude everything, then re-admit the sources"
    admitted = {ln[1:].split("/")[0] for ln in lines if ln.startswith("!")}
    assert admitted == ALLOWED_SOURCES
    for secretish in ("**/.env", "**/*.pem", "**/*.key"):
        assert secretish in lines


def test_make_image_tests_before_it_tags_the_runtime() -> None:
    make = (REPO / "Makefile").read_text()
    target = make[make.index("\nimage:"):].split("\n\n")[0]
    test_at = target.index("--target test")
    runtime_at = target.index("--target runtime")
    assert test_at < runtime_at
