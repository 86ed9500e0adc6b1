"""`powerfleet demo`: the whole fleet against the digital twin, a scripted scenario, a live view, a report.

What runs: the twin in this process (API server, operator, GPU nodes, frontends, traffic);
an embedded Redis; beat, a control worker, two sweep workers, one agent per twin node and
Flower as child processes configured (through POWERFLEET_* variables) to use the twin's
kubeconfig, GPU files, proc roots and trace directory. The scenario (powerfleet.twin.demo.scenario)
starts once every worker answers a ping; checks and the report come at the end.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from powerfleet.cli import control_plane_opt
from powerfleet.cli.context import fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json
from powerfleet.cli.demo_env import agent_env, config_env, fleet_env, planner_group_budgets, twin_fleet_env
from powerfleet.twin.cluster.topology import MAX_NODES, MIN_NODES

__all__ = ["agent_env", "config_env", "demo", "fleet_env", "planner_group_budgets", "twin_fleet_env"]


def demo(
    ctx: typer.Context,
    duration: Optional[float] = typer.Option(None, "--duration", min=30.0, max=86400.0,
                                             help="Seconds the scenario runs once the fleet is up "
                                                  "(default: the scenario's duration_s, 180 s for the default)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=MIN_NODES, max=MAX_NODES,
                                        help="Twin GPU nodes (8 GPUs each) for the default scenario's two racks "
                                             "(default 4); other scenarios' files give their topology."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for traffic thinning, telemetry noise and GPU ids."),
    report: Path = typer.Option(Path("demo-report"), "--report", help="Directory for summary.json, plots, index.html."),
    window: int = typer.Option(0, "--window", min=0, max=600,
                               help="Retune window in seconds (0: 10 for runs under 120 s, else 20)."),
    flower_port: int = typer.Option(0, "--flower-port", min=0, max=65535, help="Flower port (0: a free one)."),
    plain: bool = typer.Option(False, "--plain", help="Plain log lines even on a terminal."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout at the end."),
    scenario: str = typer.Option("default", "--scenario",
                                 help="A shipped scenario (default, limit-below-minimums, tenant-pending, "
                                      "agent-dies-mid-rebalance; oversubscribe: one rack at 1.3x under the power "
                                      "guard, docs/power.md) or a scenario file (YAML, docs/twin.md)."),
    control_plane: str = control_plane_opt.option(),
) -> None:
    """The main job on embedded defaults: the fleet keeps a twin GPU cluster in budget and its routers tuned.

    Prints a live view, writes a report to --report, and exits 0 only when every check held
    (1 naming the failed checks; 2 for bad options).
    """
    from powerfleet.broker.embedded import BrokerUnavailable, free_loopback_port
    from powerfleet.twin.fidelity import demo_operator_settings
    from powerfleet.twin.runtime import Twin, TwinOptions
    from powerfleet.workers.launcher import Launcher

    plan = load_scenario(scenario, duration, nodes)  # validated before anything starts
    server_for = control_plane_opt.resolve(control_plane)
    duration = float(plan[0].duration_s)
    window_s = window or (10 if duration < 120 else 20)
    if window_s < 10:
        fail("--window: the retune window must be at least 10 s")
    from powerfleet.cli.up import prepare_log_dir

    prepare_log_dir(report, "--report")  # before the demo runs, not after it
    work = Path(tempfile.mkdtemp(prefix="powerfleet-demo-"))
    options = scenario_options(TwinOptions(root=work / "twin", window_s=window_s,
                                           operator=demo_operator_settings(duration)), plan[0], plan[1], seed)
    spec = options.spec
    nodes = spec.nodes
    metrics, ports = metrics_ports(fleet_config(ctx).metrics.port, spec.node_names)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    twin = Twin(options, server=server_for(work))
    try:
        twin.start()
    except OSError as exc:
        twin.stop()
        fail(f"demo: the twin cannot start in {work}: {exc.strerror or exc}", EXIT_FAILURE)
    launcher = Launcher(log_dir=work / "logs")
    try:
        port = flower_port or free_loopback_port()
        env = fleet_env(twin, window_s, port, plan[0])
        if "power_guard" in plan[0].checks:  # the live guard on its oversubscribed rack (docs/power.md)
            from powerfleet.twin.demo.oversubscribe import fleet_values, plan_of

            # its own process keeps the guard's periods unless power.guard_runner is set (the A/B in docs/power.md)
            runner = os.environ.get("POWERFLEET_POWER__GUARD_RUNNER", "process")
            env.update(config_env(fleet_values(twin, 1.0, plan_of(plan[0]), runner=runner)))
        os.environ.pop("POWERFLEET_BROKER__URL", None)  # the demo always uses its own private Redis
        os.environ.update(env)
        config = fleet_config(ctx)
        launcher.env.update(env)
        try:
            url = launcher.start_embedded_broker()
        except BrokerUnavailable as exc:
            fail(str(exc), EXIT_FAILURE)
        flower_url = f"http://127.0.0.1:{port}"
        typer.echo(f"demo: twin of {nodes} nodes, {spec.total_gpus} GPUs in {twin.root}; kubeconfig {twin.kubeconfig}; "
                   f"logs {work / 'logs'}; Flower {flower_url}", err=True)
        from powerfleet.cli.guard_cmd import runs_guard_process

        if runs_guard_process(config):  # the guard's own process gets a metrics port too
            ports["guard"] = metrics.env("guard")
        _spawn_fleet(launcher, twin, work, ports, config)
        if metrics.assigned:
            typer.echo("demo: metrics " + ", ".join(f"{name} :{port}" for name, port in metrics.assigned.items()),
                       err=True)
        from powerfleet.cli.demo_run import DemoRun

        run = DemoRun(twin=twin, launcher=launcher, config=config, broker_url=url, flower_url=flower_url,
                      duration_s=duration, window_s=window_s, plain=plain, stop=stop, work=work,
                      meta={"nodes": nodes, "seed": seed, "duration_s": duration, "window_s": window_s,
                            "control_plane": control_plane,
                            "scenario": plan[0].name, "scenario_file": str(plan[1])},
                      plan=plan[0], ports=ports)
        outcome = run.run()
    finally:
        launcher.stop()
        twin.stop()
    index = run.write_report(report.resolve())
    if as_json:
        print_json(run.summary)
    typer.echo(f"demo report: {index}", err=True)
    failed = [name for name, ok in run.summary["checks"].items() if not ok]
    if outcome:
        fail(f"demo: {outcome}; report {index}", EXIT_FAILURE)
    if failed:
        fail(f"demo: checks failed: {', '.join(failed)} (details in {report / 'summary.json'})", EXIT_FAILURE)
    typer.echo("demo finished: every check held", err=True)


def load_scenario(source: str, duration: float | None, nodes: int | None) -> tuple[Any, Path]:
    """The validated scenario (exit 2 with one line naming the key path when it is not), resized
    to ``--nodes`` for the default scenario."""
    from powerfleet.twin.demo.scenario_load import ScenarioError, load
    from powerfleet.twin.demo.scenario_twin import resized

    try:
        plan, path = load(source, duration_s=duration)
        if nodes is not None:
            if plan.name != "default":
                fail(f"--nodes: the scenario {plan.name} gives its own topology (edit its file instead)")
            plan = resized(plan, nodes)
    except (ScenarioError, ValueError) as exc:
        fail(f"--scenario: {str(exc).splitlines()[0]}")
    return plan, path


def scenario_options(options: Any, plan: Any, path: Path, seed: int) -> Any:
    """The twin's options for a scenario file: its topology, DGDs, tenants, limits and traffic."""
    from powerfleet.twin.demo.scenario_twin import twin_parts

    try:
        parts = twin_parts(plan, path, seed=seed)
    except (ValueError, OSError) as exc:
        fail(f"--scenario: {str(exc).splitlines()[0]}")
    return replace(options, spec=parts.spec, manifests=parts.manifests, tenant_pods=parts.tenant_pods,
                   tenant_load=parts.tenant_load, rack_limit_w=parts.rack_limit_w, traffic=parts.traffic)


def metrics_ports(base: int, nodes: list[str]) -> tuple[Any, dict[str, dict[str, str]]]:
    """Each demo process's own POWERFLEET_METRICS__PORT, spread from ``metrics.port`` as `up` does."""
    from powerfleet.cli.up import MetricsPorts

    metrics = MetricsPorts(base)
    names = ["control", "sweep-1", "sweep-2", *(f"agent-{n}" for n in nodes), "beat"]
    return metrics, {name: metrics.env(name) for name in names}


def _spawn_fleet(launcher: Any, twin: Any, work: Path, ports: dict[str, dict[str, str]], config: Any) -> None:
    """``ports``: each process's own POWERFLEET_METRICS__PORT (as `up` spreads them), or nothing."""
    from powerfleet.cli.guard_cmd import GUARD_ARGV, runs_guard_process

    launcher.spawn("control", "worker", "--queues", "control", "--name", "control@demo", env=ports["control"])
    for i in (1, 2):
        launcher.spawn(f"sweep-{i}", "worker", "--queues", "sweep", "--name", f"sweep{i}@demo", env=ports[f"sweep-{i}"])
    for node in twin.spec.node_names:  # each agent has its own node's proc root and state dir
        launcher.spawn(f"agent-{node}", "agent", "--node", node,
                       env={**agent_env(twin, node, work), **ports[f"agent-{node}"]})
    launcher.spawn("beat", "beat", env=ports["beat"])
    if runs_guard_process(config):  # power.guard_runner: process (docs/power.md)
        launcher.spawn("guard", *GUARD_ARGV, env=ports.get("guard", {}))
    launcher.spawn("flower", "flower")
