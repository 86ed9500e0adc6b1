"""The two DynamoGraphDeployments the twin serves, sized to its node count.

``llm-disagg`` is disaggregated (frontend, prefill, decode, planner); ``llm-agg`` is aggregated
(frontend, one worker, planner). Both use the v1alpha1 ``services`` form, with the roles of a
disaggregated graph declared as ``componentType: worker`` + ``subComponentType`` as Dynamo's
own disaggregated examples do. The worker-like components carry the power annotation.
"""

from __future__ import annotations

from typing import Any

from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND, POWER_ANNOTATION
from powerfleet.twin.cluster.topology import TwinSpec

DISAGG, AGG = "llm-disagg", "llm-agg"
IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1"
# Initial caps (W per GPU) written on the pod templates.
INITIAL_CAPS = {"prefill": 600, "decode": 450, "worker": 500}


def _service(ctype: str, replicas: int, *, gpus: int = 0, sub: str | None = None,
             cap_w: int | None = None, args: list[str] | None = None) -> dict[str, Any]:
    svc: dict[str, Any] = {"componentType": ctype, "replicas": replicas}
    if sub:
        svc["subComponentType"] = sub
    if gpus:
        svc["resources"] = {"limits": {"gpu": str(gpus)}, "requests": {"gpu": str(gpus)}}
    if cap_w is not None:
        svc["extraPodMetadata"] = {"annotations": {POWER_ANNOTATION: str(cap_w)}}
    svc["extraPodSpec"] = {"mainContainer": {"image": IMAGE, "args": args or []}}
    return svc


def initial_replicas(spec: TwinSpec) -> dict[str, dict[str, int]]:
    """About 40% of the GPUs in use at start, so a scale-up has somewhere to go (and a budget to hit)."""
    g = spec.total_gpus
    return {
        # Two prefill replicas even on one node: the scenario's rebalance moves one to decode.
        DISAGG: {"frontend": 1, "planner": 1, "prefill": max(2, g // 16), "decode": max(1, g // 16)},
        # At least two workers: with one, every router setting routes the same, and retune has nothing to tune.
        AGG: {"frontend": 1, "planner": 1, "worker": max(2, g // 8)},
    }


# Components whose replicas Dynamo's scaling adapter owns (scalingAdapter.enabled): one in the
# demo, on a component neither the budget nor retune scales.
SCALING_ADAPTERS: tuple[tuple[str, str], ...] = ((AGG, "frontend"),)


def dgd_manifests(spec: TwinSpec, *, scaling_adapters: tuple[tuple[str, str], ...] = SCALING_ADAPTERS) -> list[dict[str, Any]]:
    reps = initial_replicas(spec)
    disagg = {
        "frontend": _service("frontend", 1, args=["python3", "-m", "dynamo.frontend", "--router-mode", "kv"]),
        "planner": _service("planner", 1, args=["python3", "-m", "dynamo.planner"]),
        "prefill": _service("worker", reps[DISAGG]["prefill"], gpus=2, sub="prefill",
                            cap_w=INITIAL_CAPS["prefill"], args=["python3", "-m", "dynamo.vllm", "--is-prefill-worker"]),
        "decode": _service("worker", reps[DISAGG]["decode"], gpus=2, sub="decode",
                           cap_w=INITIAL_CAPS["decode"], args=["python3", "-m", "dynamo.vllm"]),
    }
    agg = {
        "frontend": _service("frontend", 1, args=["python3", "-m", "dynamo.frontend", "--router-mode", "kv"]),
        "planner": _service("planner", 1, args=["python3", "-m", "dynamo.planner"]),
        "worker": _service("worker", reps[AGG]["worker"], gpus=1, cap_w=INITIAL_CAPS["worker"],
                           args=["python3", "-m", "dynamo.vllm"]),
    }
    for dgd, comp in scaling_adapters:
        {DISAGG: disagg, AGG: agg}[dgd][comp]["scalingAdapter"] = {"enabled": True}
    return [_dgd(DISAGG, spec.namespace, disagg), _dgd(AGG, spec.namespace, agg)]


def _dgd(name: str, namespace: str, services: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": DGD_API_VERSION,
        "kind": DGD_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {"powerfleet.io/power-aware": "true",
                                                                      "powerfleet.io/retune": "true"}},
        "spec": {"services": services},
    }
