"""Every parser of outside input, with its contract, for hypothesis (tests) and bench/fuzz.py.

Each target takes bytes and either returns (a valid answer) or raises the parser's own
documented error; anything else (an IndexError, a RecursionError, an answer that breaks the
parser's promise) is a bug. The same targets run briefly in the suite
(tests/unit/test_fuzz_parsers.py) and for longer, with atheris where it installs, in bench/fuzz.py.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Callable

UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def annotation(data: bytes) -> None:
    from powerfleet.cluster.errors import PowerInputError
    from powerfleet.cluster.power import parse_power_annotation

    raw = _text(data)
    try:
        cap = parse_power_annotation(raw)
    except PowerInputError as exc:
        assert "\n" not in exc.message.strip() or "\n" in raw
        return
    assert isinstance(cap.watts, int) and cap.watts > 0
    assert cap.raw == raw  # kept verbatim: settlement compares pods to it exactly


def cgroup(data: bytes) -> None:
    from powerfleet.agent.cgroup import pod_uid_from_cgroup

    uid = pod_uid_from_cgroup(_text(data))
    assert uid is None or UID.match(uid), uid


def _in_file(data: bytes, suffix: str, read: Callable[[str], None]) -> None:
    # The trace reader and the config loader read paths: give them the bytes as a file.
    fd, path = tempfile.mkstemp(suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        read(path)
    finally:
        os.unlink(path)


def trace(data: bytes) -> None:
    from powerfleet.sim.trace import TraceError, read_trace

    def read(path: str) -> None:
        try:
            t = read_trace(path)
        except TraceError:
            return
        for req in t.requests:
            assert req.input_length >= 0 and req.output_length >= 0

    _in_file(data, ".jsonl", read)


def agent_state(data: bytes) -> None:
    from powerfleet.agent.state import parse_state

    loaded = parse_state(_text(data))
    assert loaded.conclusive or (not loaded.uuids and loaded.problem)
    if loaded.conclusive:  # what was accepted writes back and reads the same
        assert parse_state(loaded.record.dump()).record == loaded.record


def retune_state(data: bytes) -> None:
    from powerfleet.retune.state import StateCorrupt, dump_state, parse_state

    try:
        state = parse_state(_text(data))
    except StateCorrupt:
        return
    if state is not None:  # what was accepted writes back and reads the same
        assert parse_state(dump_state(state)) == state


def dgd(data: bytes) -> None:
    from powerfleet.cluster.dgd import parse_dgd
    from powerfleet.cluster.errors import DGDInputError
    from powerfleet.cluster.manifests import ManifestError, load_documents

    try:
        docs = load_documents(_text(data))
    except ManifestError:
        return
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        try:
            parse_dgd(doc)
        except DGDInputError:
            pass


def config(data: bytes) -> None:
    from powerfleet.config import ConfigError, load_config

    def read(path: str) -> None:
        try:
            load_config(path, environ={})
        except ConfigError as exc:
            assert "\n" not in str(exc), str(exc)

    _in_file(data, ".yaml", read)


def broker_url(data: bytes) -> None:
    from powerfleet.config.broker_urls import BrokerUrlError, check_broker_url, redact

    text = _text(data)
    try:
        check_broker_url(text)
    except BrokerUrlError as exc:
        assert "\n" not in str(exc), str(exc)
    redact(text)  # never raises: it goes into log lines


TARGETS: dict[str, Callable[[bytes], None]] = {
    "annotation": annotation, "cgroup": cgroup, "trace": trace, "agent_state": agent_state,
    "retune_state": retune_state, "dgd": dgd, "config": config, "broker_url": broker_url,
}

# Seeds that steer random bytes toward each parser's grammar.
SEEDS: dict[str, list[bytes]] = {
    "annotation": [b"300", b" 450 ", b"0", b"-1", b"1e3", b"700W", b"99999999999999999999"],
    "cgroup": [b"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4111_8222_333344445555.slice/cri-containerd-abc.scope\n",
               b"12:memory:/kubepods/besteffort/pod1b2c3d4e-0000-4111-8222-333344445555/abc\n", b"0::/user.slice\n"],
    "trace": [b'{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n',
              b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", b"{}\n"],
    "agent_state": [b'{"managed_uuids": ["GPU-1"]}', b"", b"[]", b'{"managed_uuids": [1]}',
                    b'{"version": 2, "managed_uuids": ["GPU-1"], "intent_uuids": ["GPU-2"], "revision": 9, '
                    b'"targets": {"GPU-1": 300000}, "owners": {"GPU-1": [{"uid": "u", "namespace": "n", "name": "p"}]}}'],
    "retune_state": [b'{"schema": "x"}', b"NaN", b"{}", b"[1e999]"],
    "dgd": [b"apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeployment\nmetadata: {name: d}\nspec: {services: {}}\n",
            b"a: 1\na: 2\n", b"- [\n"],
    "config": [b"beat: {reconcile_interval_s: 0}\n", b"nodes: [a, a]\n", b"\x00\xff"],
    "broker_url": [b"sentinel://:pw@h:26379/0;sentinel://h2:26380", b"sentinel://h:99999", b"redis://:p@h:6379/0",
                   b"sentinel://[::1]:26379", b"sentinel://h:1;"],
}
