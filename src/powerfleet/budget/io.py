"""The JSON contract of ``powerfleet budget plan`` (docs/budget.md): one input object, or JSON
lines, each answered by one line. Inputs are validated strictly (unknown keys, booleans for
counts, duplicate keys are errors)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from powerfleet.budget.planner import Budget, Plan, PlanError, RoleFacts, plan
from powerfleet.textinput import DuplicateKey, no_duplicate_keys

SCHEMA = "powerfleet.budget.plan/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetIn(_Strict):
    power_limit_w: StrictInt = Field(ge=0)
    max_gpus: StrictInt = Field(-1, ge=-1)
    min_gpus: StrictInt = Field(-1, ge=-1)  # -1 disables the floor
    capacity_gpus: StrictInt = Field(-1, ge=-1)  # the GPUs the nodes can give it (-1: unknown, no ceiling)


class RoleIn(_Strict):
    watts_per_replica: StrictInt = Field(ge=0)
    gpus_per_replica: StrictInt = Field(ge=0)
    min_replicas: StrictInt = Field(1, ge=0)
    ready: StrictInt | None = Field(None, ge=0)
    desired: StrictInt | None = Field(None, ge=0)  # spec replicas (default: ready)
    updated: StrictInt | None = Field(None, ge=0)  # replicas at the current revision (default: ready)
    proposed: StrictInt | None = Field(None, ge=0)
    rolling: StrictBool = False


class PlanInput(_Strict):
    budget: BudgetIn
    roles: dict[str, RoleIn] = Field(min_length=1, max_length=2)

    def run(self) -> Plan:
        facts = {name: RoleFacts(**r.model_dump()) for name, r in self.roles.items()}
        return plan(facts, Budget(**self.budget.model_dump()))


def _one_line_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(input)"
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
    return f"{where}: {msg}"


def answer(raw: str) -> dict[str, Any]:
    """One input (JSON text) -> one answer object: the plan, or {"error": ...}."""
    try:
        data = json.loads(raw, object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as exc:
        return {"schema": SCHEMA, "error": str(exc)}
    except ValueError as exc:
        return {"schema": SCHEMA, "error": f"not JSON: {str(exc).splitlines()[0]}"}
    try:
        result = PlanInput.model_validate(data).run()
    except ValidationError as exc:
        return {"schema": SCHEMA, "error": _one_line_error(exc)}
    except PlanError as exc:
        return {"schema": SCHEMA, "error": str(exc)}
    return {"schema": SCHEMA, **result.to_json()}


def split_inputs(text: str) -> list[str]:
    """One JSON object (possibly spread over lines), or JSON lines (one object each)."""
    stripped = text.strip()
    if not stripped:
        return []
    try:
        json.loads(stripped)
        return [stripped]
    except ValueError:
        return [line for line in text.splitlines() if line.strip()]
