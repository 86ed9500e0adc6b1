"""Which component of a DGD plays which role, read as the fleet reads it (cluster/power.py's one role
resolver): ``prefill``/``decode`` of a disaggregated pair or the aggregated ``worker``, and the
``frontend``/``planner`` by component type. The twin's traffic, power and window models and a
scenario's events know a deployment's pods by role, so a component may be named as its operator
likes (``VllmDecodeWorker``); the twin's own two DGDs name each component by its role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, ComponentType, parse_dgd
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.power import resolve_power_config

_TYPED = (ComponentType.FRONTEND, ComponentType.PLANNER)


def roles(obj: Mapping[str, Any]) -> dict[str, str]:
    """Role -> component name. Raises ValueError (one line, ``manifest.<path>: ...``)."""
    try:
        dgd = parse_dgd(obj)
        config = resolve_power_config(dgd)
    except DGDInputError as exc:
        raise ValueError(f"manifest.{exc}") from None
    out = {role.value: rp.component for role, rp in config.roles.items()}
    for c in dgd.components:
        if c.type in _TYPED and c.type is not None and c.type.value not in out:
            out[c.type.value] = c.name
    for role, rp in config.roles.items():
        if rp.node_count > 1:
            raise ValueError(f"manifest: component {rp.component} ({role.value}) spans {rp.node_count} nodes a "
                             "replica; the twin runs each replica on one node")
    return out


def component_roles(obj: Mapping[str, Any]) -> dict[str, str]:
    """Component name -> role for a DGD as the API serves it; {} where the fleet could not read it
    (its pods are then known by their component names)."""
    try:
        return {c: r for r, c in roles(obj).items()}
    except ValueError:
        return {}


def pod_role(pod: Mapping[str, Any], by_component: Mapping[tuple[str, str], str]) -> str:
    """A pod's role: its component's, by (DGD, component) from ``by_component``, else the component's name
    (a tenant's pod, with no component label, counts as a ``worker``)."""
    labels = pod["metadata"].get("labels") or {}
    comp = str(labels.get(LABEL_COMPONENT, "worker"))
    return by_component.get((str(labels.get(LABEL_DGD_NAME, "")), comp), comp)
