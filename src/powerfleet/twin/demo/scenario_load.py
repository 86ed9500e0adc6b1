"""Reading a scenario file: bounded, YAML's safe subset, validated whole before anything starts.

``load(source)`` takes a shipped scenario's name (``default``, ``oversubscribe``, the worked
examples: ``scenarios/<name>.yaml`` in this package) or a path, and returns the validated
``Scenario``, or raises ``ScenarioError`` whose message is one line naming the key path
(``events.2.limit_w: Input should be greater than or equal to 1``). A FIFO, a device, a
directory or a file over 1 MiB is refused without being read; a trace path and a deployment's
``manifest_file`` are resolved against the scenario file's directory and must be regular files.

``python -m powerfleet.twin.demo.scenario_load --schema`` prints the JSON Schema shipped as
``scenarios/schema.json``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from powerfleet.twin.demo.scenario_files import MAX_DEPTH, ScenarioError, _depth, read_bounded
from powerfleet.twin.demo.scenario_model import TRACES, Scenario

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
SCHEMA_PATH = SCENARIO_DIR / "schema.json"


def shipped() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve(source: str) -> Path:
    """The file for ``source``: a shipped scenario's name, else a path."""
    if "/" not in source and not source.endswith((".yaml", ".yml", ".json")):
        path = SCENARIO_DIR / f"{source}.yaml"
        if not path.is_file():
            raise ScenarioError(f"{source!r} is neither a shipped scenario ({', '.join(shipped())}) nor a file path")
        return path
    return Path(source)


def parse(text: str, what: str = "scenario", *, duration_s: float | None = None, base: Path | None = None) -> Scenario:
    """``base``: the directory a ``manifest_file`` is relative to (the scenario file's; None: the working one)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{what}: not YAML{where}: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"{what}: nested too deeply") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{what}: the top level must be a mapping, got {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise ScenarioError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    if duration_s is not None:
        data = {**data, "duration_s": duration_s}
    try:
        return Scenario.model_validate(data, context={"base": base})
    except ValidationError as exc:
        raise ScenarioError(f"{what}: {first_error(exc)}") from None


def first_error(exc: ValidationError) -> str:
    """The first error as ``key.path: message`` on one line (and how many more there are)."""
    errors = exc.errors(include_url=False)
    e = errors[0]
    loc = ".".join(str(p) for p in e["loc"] if not _is_union_tag(p))
    msg = str(e["msg"]).removeprefix("Value error, ").replace("\n", " ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    # A cross-key rule (the model's own validator) names its key path in its message.
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


def _is_union_tag(part: Any) -> bool:
    # pydantic names the union member it tried (an event's kind, "int", "function-after[...]"): not a key.
    from powerfleet.twin.demo.scenario_model import EVENT_KINDS

    return isinstance(part, str) and (part in ("int", "float", "str") or part in EVENT_KINDS or "[" in part)


def load(source: str, *, duration_s: float | None = None) -> tuple[Scenario, Path]:
    """The validated scenario and its file; every trace path it names checked to be a regular file."""
    path = resolve(source)
    scenario = parse(read_bounded(path, "scenario"), f"scenario {path.name}", duration_s=duration_s,
                     base=path.parent)
    for name, tr in scenario.traffic.items():
        if tr.trace not in TRACES:
            trace = trace_path(path, tr.trace)
            try:
                st = os.stat(trace)
            except OSError as exc:
                raise ScenarioError(f"scenario {path.name}: traffic.{name}.trace: {trace}: "
                                    f"{exc.strerror or exc}") from None
            if not stat.S_ISREG(st.st_mode):
                raise ScenarioError(f"scenario {path.name}: traffic.{name}.trace: {trace}: not a regular file")
    return scenario, path


def trace_path(scenario_file: Path, trace: str) -> Path:
    p = Path(trace)
    return p if p.is_absolute() else scenario_file.parent / p


def schema() -> dict[str, Any]:
    out = Scenario.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["$id"] = "https://powerfleet.dev/schemas/twin-scenario-v1.json"
    return out


def schema_text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":  # pragma: no cover - the generator of scenarios/schema.json
    if sys.argv[1:] == ["--schema"]:
        sys.stdout.write(schema_text())
    else:
        sys.exit("usage: python -m powerfleet.twin.demo.scenario_load --schema")
