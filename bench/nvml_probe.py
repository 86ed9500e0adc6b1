"""A read-only NVML probe for a GPU node: per GPU, what the agent reads, and each call's outcome.

It never sets anything: the binding is wrapped in a proxy that refuses every function whose
name contains ``Set`` (or that resets or clears), so no code path here can change a limit.
Run it on a GPU node (docs/agent.md, "On a real GPU") and keep the JSON with the driver and
nvidia-ml-py versions it prints:

    python bench/nvml_probe.py [--out probe.json]
    python bench/nvml_probe.py --simulated devices.json     # the simulated driver (tests, here)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pynvml  # noqa: E402

from powerfleet.agent.nvml import describe, error_kind  # noqa: E402

FORBIDDEN = ("Set", "Reset", "Clear")

# (field, call) per GPU; each is recorded with its outcome, none stops the others.
READS = (
    ("uuid", "nvmlDeviceGetUUID"),
    ("name", "nvmlDeviceGetName"),
    ("constraints_mw", "nvmlDeviceGetPowerManagementLimitConstraints"),
    ("default_mw", "nvmlDeviceGetPowerManagementDefaultLimit"),
    ("limit_mw", "nvmlDeviceGetPowerManagementLimit"),
    ("enforced_mw", "nvmlDeviceGetEnforcedPowerLimit"),
    ("draw_mw", "nvmlDeviceGetPowerUsage"),
    ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption"),
    ("compute_processes", "nvmlDeviceGetComputeRunningProcesses"),
    ("compute_processes_v2", "nvmlDeviceGetComputeRunningProcesses_v2"),
    ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses"),
    ("graphics_processes_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ("mps_processes", "nvmlDeviceGetMPSComputeRunningProcesses"),
)


class ReadOnly:
    """The binding, minus every call that could change the device."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def __getattr__(self, name: str) -> Any:
        if any(word in name for word in FORBIDDEN):
            raise AttributeError(f"{name}: the probe is read-only")
        return getattr(self._nvml, name)


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("ascii", "replace").strip("\x00 ")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "pid"):
        return {"pid": int(value.pid), "used_memory": getattr(value, "usedGpuMemory", None)}
    return value


def call(nvml: Any, fn: str, *args: Any) -> dict[str, Any]:
    if not hasattr(nvml, fn):
        return {"call": fn, "outcome": "absent"}
    try:
        return {"call": fn, "outcome": "ok", "value": _plain(getattr(nvml, fn)(*args))}
    except Exception as exc:  # every failure is data here
        return {"call": fn, "outcome": "error", "kind": error_kind(exc), "error": describe(exc)}


def probe(nvml: Any) -> dict[str, Any]:
    nvml = ReadOnly(nvml)
    from importlib.metadata import PackageNotFoundError, version

    try:
        binding: str | None = version("nvidia-ml-py")
    except PackageNotFoundError:
        binding = None
    out: dict[str, Any] = {"schema": "powerfleet.nvml_probe/v1", "nvidia_ml_py": binding}
    init = call(nvml, "nvmlInit")
    out["init"] = init
    if init["outcome"] != "ok":
        return out
    try:
        out["driver"] = call(nvml, "nvmlSystemGetDriverVersion")
        out["nvml_version"] = call(nvml, "nvmlSystemGetNVMLVersion")
        count = call(nvml, "nvmlDeviceGetCount")
        out["count"] = count
        out["gpus"] = []
        for i in range(int(count.get("value") or 0)):
            handle = call(nvml, "nvmlDeviceGetHandleByIndex", i)
            gpu: dict[str, Any] = {"index": i, "handle": {k: v for k, v in handle.items() if k != "value"}}
            if handle["outcome"] == "ok":
                h = getattr(nvml, "nvmlDeviceGetHandleByIndex")(i)
                for field, fn in READS:
                    gpu[field] = call(nvml, fn, h)
            out["gpus"].append(gpu)
    finally:
        out["shutdown"] = call(nvml, "nvmlShutdown")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulated", type=Path, help="a simulated GPU file ({\"devices\": [...]}) instead of NVML")
    ap.add_argument("--out", type=Path, help="write the JSON here as well as to stdout")
    a = ap.parse_args(argv)
    if a.simulated is not None:
        from powerfleet.agent.simnvml import SimulatedNvml
        from powerfleet.agent.simulated import SimulatedGpus

        nvml: Any = SimulatedNvml(SimulatedGpus.shared(a.simulated))
    else:
        nvml = pynvml
    text = json.dumps(probe(nvml), indent=2, sort_keys=True, default=str)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
