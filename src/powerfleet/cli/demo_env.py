"""What points the demo's fleet processes at the twin: their POWERFLEET_* environment.

Its own module so that the demo command, its run loop and the fleet port the scenario's events
drive (demo_fleet.py) all build the same settings without importing each other in a circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powerfleet.config import FleetConfig
from powerfleet.twin.cluster.manifests import AGG, DISAGG
from powerfleet.twin.gpus.power import IDLE_W
from powerfleet.twin.cluster.topology import GPU_MAX_W, RACK_LABEL


def _known(path: str) -> bool:
    """Whether the fleet config has this dotted key (so the demo never sets one it lacks)."""
    model: Any = FleetConfig
    for part in path.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        model = fields[part].annotation
    return True


def config_env(values: dict[str, str]) -> dict[str, str]:
    return {"POWERFLEET_" + k.upper().replace(".", "__"): v for k, v in values.items() if _known(k)}


def planner_group_budgets(twin: Any) -> dict[str, int]:
    """The rack budgets the planner gets: each rack's budget less the draw of all its GPUs idling.

    The planner budgets the caps of the pods it places; a GPU without a pod draws its idle power,
    which no cap covers. Reserving that for every GPU keeps measured rack power within the
    rack budget whatever the placement.
    """
    # A tenant's GPU (twin/cluster/tenants.py) is not idle: the ledger charges its pod (at its cap, or at
    # the card's maximum settable limit), so no idle reserve is kept for it as well.
    from powerfleet.twin.cluster.operator import pod_gpus

    tenant_gpus: dict[str, int] = {}
    for pod in twin.tenant_pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            rack = twin.spec.rack_of(node)
            tenant_gpus[rack] = tenant_gpus.get(rack, 0) + len(pod_gpus(pod))
    # At least 1 W (a limit the config accepts): a limit below the idle reserve leaves nothing to plan.
    return {rack: max(1, int(w - (twin.spec.rack_gpus(rack) - tenant_gpus.get(rack, 0)) * IDLE_W))
            for rack, w in twin.budgets.items()}


def fleet_env(twin: Any, window_s: int, flower_port: int, scenario: Any = None) -> dict[str, str]:
    env = twin_fleet_env(twin, window_s, scenario)
    env.update(config_env({"flower.port": str(flower_port)}))
    return env


def twin_fleet_env(twin: Any, window_s: int, scenario: Any = None) -> dict[str, str]:
    """Everything that points a fleet at the twin (the demo's and `powerfleet twin`'s settings).

    Short beat intervals and the twin's own retune window, so that something visible happens
    within seconds, and the budgets its deployments need (without them the planner never runs).
    With a scenario (twin/demo/scenario_model.py), its deployments, their budget and retune settings
    and its racks' limits.
    """
    nodes = twin.spec.node_names
    fleet_max = twin.spec.total_gpus * GPU_MAX_W
    values = {
        "nodes": "[" + ", ".join(nodes) + "]",
        "beat.reconcile_interval_s": "3",
        "beat.budget_interval_s": "4",
        "beat.retune_interval_s": "2",
        "retune.deployments": "[llm-disagg, llm-agg]",
        "retune.window_interval_s": str(window_s),
        "retune.kubeconfig": str(twin.kubeconfig),
        "retune.trace_dir": str(twin.trace_dir),
        "retune.namespace": twin.spec.namespace,
        "retune.time_budget_s": str(round(window_s * 0.8, 1)),
        "retune.shard_timeout_s": str(round(window_s * 0.6, 1)),
        "retune.lease_duration_s": "15",
        "retune.lease_renew_s": "5",
        "retune.max_shards": "2",
        # The demo's windows are short (about 40 requests): the noise guard's production
        # defaults (200 requests, 0.95 paired confidence) would keep every one of them.
        "retune.min_requests": "20",
        "retune.confidence": "0",
        # 24 points, no zero credit: a router retuned to credit 0 would be held there by retune's
        # own premise (a live router at credit 0 stays at 0), ending the demo's retuning.
        "retune.grid": "{overlap_score_credit: {choices: [0.25, 0.5, 1.0]}, "
                       "prefill_load_scale: {choices: [0.5, 1.0, 2.0, 4.0]}, temperature: {choices: [0.0, 0.5]}}",
        "agent.gpu_backend": "simulated",
        "agent.simulated_dir": str(twin.root / "gpus"),
        "agent.kubeconfig": str(twin.kubeconfig),
        "agent.namespaces": f"[{twin.spec.namespace}]",
        "budget.kubeconfig": str(twin.kubeconfig),
        "budget.group_label": RACK_LABEL,
        "budget.groups": "{" + ", ".join(f"{r}: {w}" for r, w in planner_group_budgets(twin).items()) + "}",
        # What the ledger charges a GPU pod with no cap (a tenant without the power annotation): the
        # twin's cards' maximum settable limit, as an operator sets it for theirs.
        "budget.max_settable_gpu_w": str(GPU_MAX_W),
        # The rack budgets bind; each deployment's own ceiling is the whole fleet's GPU power. The
        # twin's planner components write no replicas, so powerfleet is their sole writer.
        "budget.deployments": "{" + ", ".join(f"{twin.spec.namespace}/{d}: {{power_limit_w: {fleet_max}, "
                                              "sole_writer: true}" for d in (DISAGG, AGG)) + "}",
    }
    if scenario is not None:
        from powerfleet.twin.demo.scenario_twin import fleet_values

        values.update(fleet_values(scenario, twin.spec, planner_group_budgets(twin)))
    env = config_env(values)
    env["KUBECONFIG"] = str(twin.kubeconfig)
    return env


def agent_env(twin: Any, node: str, work: Path) -> dict[str, str]:
    return config_env({"agent.proc_root": str(twin.nodes[node].proc_root),
                 "agent.state_dir": str(work / "agent-state" / node)})
