"""`powerfleet agent`: run the node agent worker, or `agent once` for one (dry) pass."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

import typer

from powerfleet.cli.context import export_config_path, fleet_app, fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json, read_text_input
from powerfleet.cli.processes import LOGLEVEL_HELP, check_loglevel
from powerfleet.config.fleet import is_node_name

ONCE_SCHEMA = "powerfleet.agent.once/v1"  # docs/json-contracts.md

app = typer.Typer(help="The GPU node agent: `agent --node N` runs it; `agent once` does one pass.",
                  invoke_without_command=True, add_completion=False)


def _check_node(node: str) -> None:
    if not is_node_name(node):
        fail(f"--node: {node!r} is not a valid Kubernetes node name")


@app.callback()
def agent(
    ctx: typer.Context,
    node: Optional[str] = typer.Option(None, "--node", help="The GPU node this agent owns; it consumes node.<NODE>."),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l", help=LOGLEVEL_HELP, callback=check_loglevel),
    metrics_port: Optional[int] = typer.Option(
        None, "--metrics-port", help="Serve /metrics and /readyz here (default agent.probe_port, else metrics.port; 0 disables)."),
) -> None:
    """Run the node agent: a worker pinned to its own queue node.<NODE> that enforces pod power caps.

    The agent serves /readyz (200 while the last good pass is under three intervals old) and
    /metrics on one port; see docs/agent.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    if node is None:
        fail("--node: required (the Kubernetes node this agent runs on)")
    _check_node(node)
    config = fleet_config(ctx)
    from powerfleet.agent.build import endpoint
    from powerfleet.cli.ports import require_free_port

    address, port = endpoint(config, metrics_port)
    if metrics_port is not None or port:
        option = "--metrics-port" if metrics_port is not None else ("agent.probe_port" if config.agent.probe_port else "metrics.port")
        if metrics_port != 0:
            require_free_port(address, port, option)
    export_config_path(ctx)
    worker_app = fleet_app(config)
    from powerfleet.agent.worker import run_agent_worker
    from powerfleet.metrics.signals import install_outcome_metrics
    from powerfleet.workers.logging import install_broker_retry_filter

    from powerfleet.agent.lock import LockHeld

    install_outcome_metrics()
    install_broker_retry_filter()
    try:
        run_agent_worker(worker_app, config, node, loglevel, probe=(address, port))
    except LockHeld as exc:  # one agent per node: the second one refuses in one line
        fail(str(exc), EXIT_FAILURE)


MAX_INPUT_BYTES = 16 * 1024 * 1024  # a node's PodList or GPU list is far smaller


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _read_json(path: Path, option: str) -> Any:
    """A regular file or a pipe of at most MAX_INPUT_BYTES (a pipe read within textinput's timeout),
    strict JSON (no NaN/Infinity), nesting bounded; every problem is one line and exit 2 (a device
    would never end)."""
    if str(path) != "-":
        try:
            st = os.stat(path)
        except OSError as exc:
            fail(f"{option}: cannot read {path} ({exc.strerror or exc})")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):  # a FIFO: <(kubectl get pods -o json)
            fail(f"{option}: {path} is not a regular file or a pipe")
        if st.st_size > MAX_INPUT_BYTES:
            fail(f"{option}: {path} is larger than {MAX_INPUT_BYTES} bytes")
    text = read_text_input(path, option)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        fail(f"{option}: {path} is nested too deeply")
    except ValueError as exc:
        fail(f"{option}: {path} is not JSON ({exc})")


@app.command()
def once(
    ctx: typer.Context,
    node: str = typer.Option(..., "--node", help="The node whose pass to run."),
    proc_root: Optional[Path] = typer.Option(None, "--proc-root", help="Where /proc is (default agent.proc_root)."),
    pods: Optional[Path] = typer.Option(None, "--pods", help="A PodList JSON (`kubectl get pods -o json`) instead of the cluster."),
    gpus: Optional[Path] = typer.Option(None, "--gpus", help='JSON list of {"index","uuid","min_w","max_w","default_w","current_w","pids"} instead of NVML.'),
    allocations: Optional[Path] = typer.Option(None, "--allocations", help="The kubelet's PodResources List answer as JSON (as grpcurl prints it): decide with its GPU allocations."),
    safe_default_watts: Optional[int] = typer.Option(None, "--safe-default-watts", min=1, max=100_000,
                                                     help="Cap for invalid/conflicting annotations (default agent.safe_default_watts)."),
    namespace: Optional[list[str]] = typer.Option(None, "--namespace", "-n", help="Only pods of this namespace (repeatable)."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Directory of managed_gpus.json (default agent.state_dir/NODE)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what the agent would do; touch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the pass as JSON."),
) -> None:
    """One pass for NODE: per GPU, its pods, the decision and the cap. Exit 1 if the pass was skipped."""
    _check_node(node)
    config = fleet_config(ctx)
    from powerfleet.agent.metrics import AgentMetrics
    from powerfleet.agent.offline import pods_from_podlist
    from powerfleet.agent.reconcile import NodeAgent
    from powerfleet.agent.build import connect_cluster, node_pod_lister, node_state_dir, open_backend
    from powerfleet.agent.simulated import SimulatedGpus, parse_devices
    from powerfleet.agent.state import StateStore
    from powerfleet.clock import SystemClock
    from prometheus_client import CollectorRegistry

    namespaces = list(namespace or config.agent.namespaces)
    if namespace:
        _check_namespaces(config, namespace)
    # Both files are read and checked before anything else, so bad input fails first (exit 2).
    listed = devices = None
    if pods is not None:
        try:
            listed = pods_from_podlist(_read_json(pods, "--pods"), node, namespaces)
        except ValueError as exc:
            fail(f"--pods: {pods}: {exc}")
    if gpus is not None:
        try:
            devices = parse_devices(_read_json(gpus, "--gpus"))
        except ValueError as exc:
            fail(f"--gpus: {gpus}: {exc}")
    allocated = None
    if allocations is not None:
        from powerfleet.agent.offline import allocations_from_json

        try:
            allocated = allocations_from_json(_read_json(allocations, "--allocations"))
        except ValueError as exc:
            fail(f"--allocations: {allocations}: {exc}")
    if listed is not None:
        list_pods = lambda: listed  # noqa: E731 - the file is read once, up front
    else:
        cluster, why = connect_cluster(config)
        list_pods = node_pod_lister(cluster, node, namespaces, why)
    record_dir = state_dir or node_state_dir(config.agent.state_dir, node)
    if not dry_run:
        # A real pass sets caps and must record what it manages: a directory it cannot write would
        # apply a cap and lose the record (the next agent could not give it back). Checked first.
        from powerfleet.cli.up import prepare_log_dir

        prepare_log_dir(Path(record_dir), "--state-dir" if state_dir else "agent.state_dir")
    open_gpus = (lambda: SimulatedGpus(devices)) if devices is not None else open_backend(config, node)
    agent = NodeAgent(node, open_gpus=open_gpus, list_pods=list_pods,
                      proc_root=proc_root or config.agent.proc_root,
                      state=StateStore(record_dir), clock=SystemClock(),
                      safe_default_watts=safe_default_watts or config.agent.safe_default_watts,
                      safe_default_fraction=config.agent.safe_default_fraction, complete_view=not namespaces,
                      metrics=AgentMetrics(CollectorRegistry()),
                      allocations=None if allocated is None else (lambda: allocated))
    lock = None if dry_run else _take_once_lock(config, node)
    try:
        if not dry_run:
            agent.start()
        report = agent.run_pass("once", dry_run=dry_run)
        if not dry_run:
            agent.close()  # a one-off pass leaves its caps in place
    finally:
        if lock is not None:
            lock.release()
    if as_json:
        print_json({"schema": ONCE_SCHEMA, **report.model_dump(mode="json", exclude={"trigger", "at", "duration_s"})})
    else:
        _print_human(report)
    if report.skipped:
        raise typer.Exit(EXIT_FAILURE)


def _check_namespaces(config: Any, namespaces: list[str]) -> None:
    """--namespace goes through the same check as agent.namespaces (a Kubernetes namespace name)."""
    from pydantic import ValidationError

    try:
        type(config.agent).model_validate({**config.agent.model_dump(), "namespaces": namespaces})
    except ValidationError as exc:
        fail(f"--namespace: {exc.errors()[0]['msg'].removeprefix('Value error, ')}")


def _take_once_lock(config: Any, node: str) -> Any:
    """A real `agent once` takes the node's lock, so it never runs beside a live agent. Without a
    configured broker there is nothing to check (a node with no fleet)."""
    if config.broker.url is None:
        return None
    import redis

    from powerfleet.agent.lock import LockHeld, NodeLock
    from powerfleet.agent.presence import heartbeat_ttl_s

    client = redis.Redis.from_url(config.broker.url, socket_timeout=5, socket_connect_timeout=5)
    lock = NodeLock(client, node, heartbeat_ttl_s(config.beat.reconcile_interval_s))
    try:
        lock.acquire()
    except LockHeld as exc:
        fail(f"{exc}; use --dry-run beside a running agent", EXIT_FAILURE)
    except (redis.RedisError, OSError) as exc:
        fail(f"cannot take the node lock (broker: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
             "use --dry-run, or retry when the broker answers", EXIT_FAILURE)
    return lock


@app.command("drain")
def drain(
    ctx: typer.Context,
    node: Optional[str] = typer.Option(None, "--node", help="The node whose caps go back to their defaults."),
    all_nodes: bool = typer.Option(False, "--all", help="Every node with a live agent (with --undo: every drained node)."),
    undo: bool = typer.Option(False, "--undo", help="End the drain: the agent enforces caps again."),
    ttl_s: Optional[float] = typer.Option(None, "--ttl", min=1.0, max=366 * 86400.0,
                                          help="End the drain by itself after this many seconds (default: "
                                          "agent.drain_ttl_s, 7 days; at most agent.drain_max_ttl_s)."),
    force: bool = typer.Option(False, "--force", help="Drain a node that has had no agent within "
                               "agent.drain_retention_s (a name no agent ever used)."),
    timeout_s: float = typer.Option(60.0, "--timeout", min=0.0, max=3600.0,
                                    help="Seconds to wait for the agents' answers (0: do not wait)."),
    as_json: bool = typer.Option(False, "--json", help="Print the agents' answers as JSON."),
) -> None:
    """Put every GPU the node's agent manages back to its default limit, and keep it there.

    A stop, crash or rollout of the agent leaves the caps in force; a drain is the explicit way
    back to the defaults (the chart's uninstall hook runs `drain --all`). Exit 1 if an agent did
    not answer in time (the request stays, and the agent acts on it when it runs) or a restore
    failed.
    """
    import uuid

    import redis

    from powerfleet.agent.drain import drain_ttl, drained_nodes, request_drain, undo_drain, wait_for_answers
    from powerfleet.agent.presence import live_agents
    from powerfleet.cli.context import check_broker_reachable, require_broker

    if (node is None) == (not all_nodes):
        fail("--node or --all: exactly one of them")
    if node is not None:
        _check_node(node)
    config = fleet_config(ctx)
    try:
        ttl_s = drain_ttl(ttl_s, config.agent.drain_ttl_s, config.agent.drain_max_ttl_s)
    except ValueError as exc:
        fail(str(exc))
    url = require_broker(config)
    check_broker_reachable(url)
    r = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    if node is not None and not undo and not force:
        _refuse_unknown_node(r, node, config.agent.drain_retention_s)
    if undo:
        nodes = [node] if node is not None else sorted(n for n in drained_nodes(r) if is_node_name(n))
        undone = {n: "undone" if undo_drain(r, n) else "was not drained" for n in nodes}
        if node is not None:
            print_json({"node": node, "drain": undone[node]}) if as_json else typer.echo(f"{node}: drain {undone[node]}")
        else:
            print_json({"nodes": undone}) if as_json else typer.echo(
                "; ".join(f"{n}: drain {v}" for n, v in undone.items()) or "no node was drained")
        return
    nodes = [node] if node is not None else sorted(n for n in live_agents(r) if is_node_name(n))
    requests = {n: uuid.uuid4().hex[:12] for n in nodes}
    for n, request in requests.items():
        request_drain(r, n, request, ttl_s)
    answers = wait_for_answers(r, requests, timeout_s)
    failed = any(a is None or a.get("left") for a in answers.values())
    if node is not None:
        _print_drain(node, requests[node], answers[node], timeout_s, as_json)
    elif as_json:
        print_json({"nodes": {n: ({"answered": True, **a} if a is not None else {"request": requests[n], "answered": False})
                              for n, a in answers.items()}})
    elif not nodes:
        typer.echo("no live agent: nothing to drain")
    else:
        for n in nodes:
            _print_drain(n, requests[n], answers[n], timeout_s, False)
    if failed:
        raise typer.Exit(EXIT_FAILURE)


def _refuse_unknown_node(r: Any, node: str, retention_s: float) -> None:
    import time

    from powerfleet.agent.drain import unknown_node
    from powerfleet.agent.presence import heartbeat_key, last_seen

    why = unknown_node(node, bool(r.exists(heartbeat_key(node))), last_seen(r, node), time.time(), retention_s)
    if why is not None:
        fail(f"agent drain: {why}; nothing requested")


def _print_drain(node: str, request: str, ack: dict[str, Any] | None, timeout_s: float, as_json: bool) -> None:
    if ack is None:
        msg = f"{node}: drain requested; no agent answered within {timeout_s:g} s (it acts on it when it runs)"
        print_json({"node": node, "request": request, "answered": False}) if as_json else typer.echo(msg)
    elif as_json:
        print_json({"node": node, "answered": True, **ack})
    else:
        typer.echo(f"{node}: drained; restored {', '.join(ack.get('restored') or []) or 'nothing'}"
                   + (f"; still capped (restore failed): {', '.join(ack['left'])}" if ack.get("left") else ""))


def _print_human(report: Any) -> None:
    mode = "dry run" if report.dry_run else "pass"
    if report.skipped:
        typer.echo(f"{report.node}: {mode} skipped, nothing changed: {report.skipped}")
        return
    typer.echo(f"{report.node}: {mode}, {len(report.gpus)} GPU(s)")
    for g in report.gpus:
        if g.error:
            typer.echo(f"  GPU {g.index}: error: {g.error}")
            continue
        cap = "-" if g.cap_w is None else f"{g.cap_w} W"
        clamp = f" (clamped to {g.clamped})" if g.clamped else ""
        typer.echo(f"  GPU {g.index} {g.uuid}: {g.decision:<12} requested {g.requested_w if g.requested_w is not None else '-'}"
                   f" -> cap {cap}{clamp} [{g.action}] pods={','.join(g.pods) or '-'}")

