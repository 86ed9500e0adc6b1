"""Keep the `config` part of charts/powerfleet/values.schema.json equal to FleetConfig's schema.

The chart's `config` value is the FleetConfig itself, so its JSON schema is generated from the
pydantic model (definitions named ``config.<Model>``); everything else in the file is written by
hand. A test fails when the two drift; regenerate with

    .venv/bin/python -m tests.charts.values_schema
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from powerfleet.config.fleet import FleetConfig

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "charts" / "powerfleet" / "values.schema.json"
PREFIX = "config."


def _strip_titles(node: Any) -> Any:
    # Titles are pydantic's field names restated; they only bloat the file.
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def config_definitions() -> dict[str, Any]:
    """FleetConfig and every model it nests, as draft-07 definitions under the ``config.`` prefix."""
    schema = FleetConfig.model_json_schema(ref_template="#/definitions/" + PREFIX + "{model}")
    nested = schema.pop("$defs", {})
    defs = {PREFIX + name: _strip_titles(body) for name, body in nested.items()}
    defs[PREFIX + "FleetConfig"] = _strip_titles(schema)
    return defs


def regenerated(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` with its ``config.*`` definitions replaced by freshly generated ones."""
    kept = {k: v for k, v in current.get("definitions", {}).items() if not k.startswith(PREFIX)}
    out = dict(current)
    out["definitions"] = {**kept, **dict(sorted(config_definitions().items()))}
    return out


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    current = json.loads(SCHEMA_PATH.read_text())
    SCHEMA_PATH.write_text(dumps(regenerated(current)))
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
