"""Every CLI command, given hostile input, fails in one line with exit 1 or 2: never a traceback.

The table below names at least one hostile invocation per command; a command added to the
CLI without an entry here fails ``test_every_command_is_covered``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer

from powerfleet.broker.embedded import free_loopback_port
from tests.envs import subprocess_env

BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00" + bytes(range(256)) * 4
LATIN1 = "caf\u00e9: [1, 2]\nname: r\u00e9sum\u00e9\n".encode("latin-1")
BROKEN_YAML = "a: [1, 2\n  b: }\n\t- x: :\n"
DUP_KEYS = "apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeployment\nkind: Other\n"
# Valid JSON (and YAML), nested far deeper than Python's parsers recurse.
DEEP = "[" * 50000 + "]" * 50000
DEEP_OBJECT = '{"a": ' * 50000 + "1" + "}" * 50000


def _command_paths() -> set[str]:
    from powerfleet.cli.main import app

    def walk(cmd, path):  # type: ignore[no-untyped-def]
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield " ".join(path)
            return
        if path and getattr(cmd, "invoke_without_command", False):
            yield " ".join(path)
        for name, sub in subs.items():
            yield from walk(sub, [*path, name])

    return set(walk(typer.main.get_command(app), []))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    out = {"binary": d / "binary.bin", "latin1": d / "latin1.yaml", "yaml": d / "broken.yaml",
           "dup": d / "dup.yaml", "dir": d, "missing": d / "no-such-file", "deep": d / "deep.json",
           "deep_object": d / "deep-object.json", "zero": Path("/dev/zero"), "unwritable": d / "file" / "sub"}
    out["no_pods"] = d / "no-pods.json"
    out["no_pods"].write_text('{"items": []}')
    out["huge_gpus"] = d / "huge-gpus.json"
    out["huge_gpus"].write_text('[{"index": 0, "uuid": "GPU-0", "min_w": 100, "max_w": 1e308, "default_w": 700, '
                                '"current_w": 700, "pids": []}]')
    out["gpus"] = d / "gpus.json"
    out["gpus"].write_text('[{"index": 0, "uuid": "GPU-0", "min_w": 200, "max_w": 700, "default_w": 700, '
                           '"current_w": 700, "pids": []}]')
    out["pods_no_uid"] = d / "pods-no-uid.json"
    out["pods_no_uid"].write_text('{"items": [{"metadata": {"name": "p", "namespace": "default"}, '
                                  '"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}]}')
    out["deep"].write_text(DEEP)
    out["deep_object"].write_text(DEEP_OBJECT)
    (d / "file").write_text("a file, so no directory can be made under it")
    out["binary"].write_bytes(BINARY)
    out["latin1"].write_bytes(LATIN1)
    out["yaml"].write_text(BROKEN_YAML)
    out["dup"].write_text(DUP_KEYS)
    return out


@pytest.fixture(scope="module")
def not_redis() -> str:
    """A broker URL where something answers, but not Redis (an SSH banner): InvalidResponse."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(1024)
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    server.close()


@pytest.fixture(scope="module")
def busy_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


Case = tuple  # (command, argv[, extra environment or None[, stdin bytes, or None for a closed stdin]])


def _cases(f: dict[str, Path], busy: int, not_redis: str = "redis://127.0.0.1:1/0") -> list[Case]:
    cases: list[Case] = [
        ("status", ["status"], {"POWERFLEET_BROKER__URL": not_redis}),
        ("trigger", ["trigger", "powerfleet.fleet.echo"], {"POWERFLEET_BROKER__URL": not_redis}),
    ]
    bad_files = ("binary", "latin1", "yaml", "dir", "missing")
    for kind in bad_files:
        cases += [
            ("validate dgd-update", ["validate", "dgd-update", "--old", str(f[kind]), "--new", str(f["dup"])]),
            ("sim replay", ["sim", "replay", "--trace", str(f[kind]), "--workers", "2"]),
            ("retune sweep", ["retune", "sweep", "--trace", str(f[kind]), "--workers", "2", "--objective", "ttft"]),
            ("budget plan", ["budget", "plan", "--input", str(f[kind])]),
            ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--gpus", str(f[kind]),
                            "--pods", str(f[kind])]),
            ("status", ["--config", str(f[kind]), "status"]),
            ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", f"@{f[kind]}"]),
            ("power guard", ["--config", str(f[kind]), "power", "guard"]),
        ]
    guarded = {"POWERFLEET_BUDGET__GROUPS": "{rack-a: {limit_w: 1000, oversubscription: 1.3}}",
               "POWERFLEET_POWER__GUARD_RUNNER": "process"}
    cases += [
        ("power guard", ["power", "guard", "--group", "rack-\u00e9\t" * 40], guarded),
        ("power guard", ["power", "guard", "--json"], guarded),
        ("power guard", ["power", "guard", "--once"], {**guarded, "POWERFLEET_BROKER__URL": not_redis}),
        ("power guard", ["power", "guard", "--metrics-port", str(busy)], guarded),
    ]
    # Nested too deeply for Python's parsers, and /dev/zero (read forever without a limit).
    for kind in ("deep", "zero"):
        cases += [
            ("status", ["--config", str(f[kind]), "status"]),
            ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", f"@{f[kind]}"]),
            ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--pods", str(f[kind])]),
        ]
    cases += [
        ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--gpus", str(f["deep_object"])]),
        ("budget plan", ["budget", "plan", "--input", str(f["deep"])]),
        ("validate dgd-update", ["validate", "dgd-update", "--old", str(f["deep"]), "--new", str(f["dup"])]),
    ]
    trace = str(Path(__file__).resolve().parents[1] / "sim" / "data")
    cases += [
        ("validate dgd-update", ["validate", "dgd-update", "--old", str(f["dup"]), "--new", str(f["dup"])]),
        ("retune sweep", ["retune", "sweep", "--trace", str(f["binary"]), "--workers", "2", "--objective", "ttft",
                          "--grid", str(f["binary"])]),
        ("retune sweep", ["retune", "sweep", "--trace", trace, "--workers", "2", "--objective", "ttft",
                          "--grid", str(f["yaml"])]),
        ("retune sweep", ["retune", "sweep", "--trace", trace, "--workers", "2", "--objective", "goodput"]),
        ("sim replay", ["sim", "replay", "--trace", trace, "--workers", "100000000"]),
        ("power whatif", ["power", "whatif", "--trace", str(f["binary"]), "--workers", "2", "--gpus-per-worker", "4",
                          "--cap-w", "700", "--limit-w", "5000"]),
        ("power whatif", ["power", "whatif", "--trace", trace, "--workers", "2", "--gpus-per-worker", "4",
                          "--cap-w", "700", "--limit-w", "500", "--telemetry-loss", "nan:1"]),
        ("sim replay", ["sim", "replay", "--trace", trace, "--workers", "2", "--policy", "{bad"]),
        ("worker", ["worker", "-Q", "node.bad name"]),
        ("worker", ["worker", "--metrics-port", "70000"]),
        ("worker", ["worker", "--metrics-port", str(busy)]),
        ("beat", ["beat", "--metrics-port", str(busy)]),
        ("beat", ["beat", "--metrics-port", "-1"]),
        ("flower", ["flower", "--port", "70000"]),
        ("flower", ["flower", "--port", str(busy)]),
        ("flower", ["flower", "--address", "0.0.0.0"]),
        ("agent", ["agent", "--node", "bad node/../x"]),
        ("agent", ["agent"]),
        ("agent drain", ["agent", "drain", "--node", "bad node"]),
        ("agent drain", ["agent", "drain", "--node", "n1"]),  # no broker configured
        ("up", ["--config", str(f["binary"]), "up"]),
        ("up", ["--config", str(f["yaml"]), "up"]),
        ("demo", ["demo", "--duration", "1"]),
        ("demo", ["demo", "--nodes", "65"]),
        ("twin", ["twin", "--nodes", "0"]),
        ("twin", ["twin", "--traces", str(f["missing"]), "--duration", "1"]),
        ("retune status", ["--config", str(f["latin1"]), "retune", "status"]),
        ("retune reset-window", ["retune", "reset-window", "--dgd", "bad name/.."]),
        ("retune reset-window", ["retune", "reset-window", "--dgd", "llama"]),
        ("trigger", ["trigger", "powerfleet.agent.reconcile", "--args", '{"node": "a b"}']),
        ("status", ["status", "--timeout", "-3"]),
        ("status", ["status", "--timeout", "1e308"]),
        ("sim replay", ["sim", "replay", "--trace", trace, "--workers", "2", "--profile", str(f["deep"])]),
        # A profile or grid of /dev/zero goes through the one bounded reader (it used to read forever).
        ("sim replay", ["sim", "replay", "--trace", trace, "--workers", "2", "--profile", str(f["zero"])]),
        ("retune sweep", ["retune", "sweep", "--trace", trace, "--workers", "2", "--objective", "ttft",
                          "--grid", str(f["zero"])]),
        ("worker", ["worker", "--loglevel", "BOGUS"]),
        ("beat", ["beat", "--loglevel", "BOGUS"]),
        ("up", ["up", "--log-dir", str(f["unwritable"])]),
        # A configured broker that is not Redis: one line before any process starts.
        ("up", ["up", "--log-dir", str(f["dir"] / "up-logs")], {"POWERFLEET_BROKER__URL": not_redis}),
        ("demo", ["demo", "--duration", "30", "--nodes", "1", "--report", str(f["unwritable"])]),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", '{"payload": 1, "payload": 2}']),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--timeout", "1e308"]),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", '{"a": ' * 5000 + "1" + "}" * 5000]),
        ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--gpus", str(f["huge_gpus"]),
                        "--pods", str(f["no_pods"])]),
        ("retune status", ["retune", "status"], {"POWERFLEET_RETUNE__DEPLOYMENTS": "['../x']"}),
        # A pod without a uid matches no process (its GPU would read as released); a namespace with a slash.
        ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--gpus", str(f["gpus"]),
                        "--pods", str(f["pods_no_uid"])]),
        ("agent once", ["agent", "once", "--node", "n1", "--dry-run", "--gpus", str(f["gpus"]),
                        "--pods", str(f["no_pods"]), "--namespace", "a/b"]),
        ("budget plan", ["budget", "plan", "--input", "-"], None, None),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", "-"], None, None),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", "-"], None, b'{"payload": "caf\xe9"}'),
        ("trigger", ["trigger", "powerfleet.fleet.echo", "--args", "-"], None, b"[" * 50000),
    ]
    return cases


CLOSED = object()


def _run(case: Case) -> subprocess.CompletedProcess[str]:
    args = case[1]
    env = subprocess_env()
    # A broker that is not there: a command that got past input checking fails on it, in one line.
    env["POWERFLEET_BROKER__URL"] = f"redis://127.0.0.1:{free_loopback_port()}/0"
    env["COLUMNS"] = "200"
    env.update(case[2] if len(case) > 2 and case[2] else {})
    argv = [sys.executable, "-m", "powerfleet.cli", *args]
    stdin: object = subprocess.DEVNULL
    if len(case) > 3:
        stdin = CLOSED if case[3] is None else case[3]
    if stdin is CLOSED:  # the shell's `0<&-`: the command starts with no file descriptor 0
        argv = ["sh", "-c", 'exec "$@" 0<&-', "sh", *argv]
        stdin = None
    out = subprocess.run(argv, env=env, capture_output=True, timeout=120,
                         **({"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}))
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(errors="replace"),
                                       out.stderr.decode(errors="replace"))


def test_every_command_is_covered(files, busy_port) -> None:
    covered = {case[0] for case in _cases(files, busy_port)}
    assert _command_paths() <= covered, sorted(_command_paths() - covered)


def test_hostile_input_fails_in_one_line_without_a_traceback(files, busy_port, not_redis) -> None:
    cases = _cases(files, busy_port, not_redis)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_run, cases))
    problems = []
    for case, out in zip(cases, results):
        err = out.stderr.strip()
        # `budget plan` answers each bad input line with an error on stdout, by its contract.
        said = len(err.splitlines()) == 1 or (not err and "error" in out.stdout)
        if out.returncode not in (1, 2) or "Traceback" in out.stderr + out.stdout or not said:
            shown = " ".join(a if len(a) < 80 else a[:40] + "..." for a in case[1])
            problems.append(f"{shown}: exit {out.returncode}: {err[-600:]}")
    assert not problems, "\n".join(problems)


def test_agent_once_refuses_a_state_dir_it_cannot_write_before_setting_a_cap(tmp_path) -> None:
    """It used to set the cap, lose the record of the GPU it now manages, and exit 0."""
    import json

    from powerfleet.agent.simulated import write_proc_entry
    from powerfleet.cluster.dgd import POWER_ANNOTATION
    from tests.integration.conftest import run_cli

    uid = "3f2b9c1e-1111-4a2b-9c3d-123456789abc"
    write_proc_entry(tmp_path / "proc", 11, uid)
    (tmp_path / "gpus.json").write_text(json.dumps([{"index": 0, "uuid": "GPU-0", "min_w": 200, "max_w": 700,
                                                      "default_w": 700, "current_w": 700, "pids": [11]}]))
    (tmp_path / "pods.json").write_text(json.dumps({"items": [{
        "metadata": {"name": "p", "namespace": "default", "uid": uid, "annotations": {POWER_ANNOTATION: "400"}},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}]}))
    (tmp_path / "file").write_text("a file, so no directory can be made under it")
    base = ["agent", "once", "--node", "n1", "--gpus", str(tmp_path / "gpus.json"), "--pods", str(tmp_path / "pods.json"),
            "--proc-root", str(tmp_path / "proc"), "--json"]
    good = run_cli(*base, "--state-dir", str(tmp_path / "state"))  # no broker configured: no lock to take
    assert good.returncode == 0 and json.loads(good.stdout)["gpus"][0]["cap_w"] == 400, good.stdout + good.stderr
    out = run_cli(*base, "--state-dir", str(tmp_path / "file" / "state"))
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert out.stderr.strip().splitlines() == [
        f"powerfleet: error: --state-dir: cannot write to {tmp_path / 'file' / 'state'} (Not a directory)"]


def test_input_nested_too_deeply_names_the_option_that_gave_it(files) -> None:
    from tests.integration.conftest import run_cli

    trace = str(Path(__file__).resolve().parents[1] / "sim" / "data")
    deep = str(files["deep"])
    for args, option in ((["validate", "dgd-update", "--old", deep, "--new", str(files["dup"])], "--old"),
                         (["sim", "replay", "--trace", trace, "--workers", "2", "--profile", deep], "--profile")):
        out = run_cli(*args)
        assert out.returncode == 2 and out.stderr == f"powerfleet: error: {option}: {deep} is nested too deeply to parse\n", \
            out.stderr[-500:]
