"""Ports a command is asked to listen on: checked before anything starts, refused in one line."""

from __future__ import annotations

import socket

from powerfleet.cli.errors import fail


def require_free_port(address: str, port: int, option: str) -> None:
    """Exit 2 naming ``option`` when ``port`` is out of range or already bound on ``address``."""
    if not 1 <= port <= 65535:
        fail(f"{option}: {port} is not a port (1-65535)")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            fail(f"{option}: cannot listen on {address}:{port} ({exc.strerror or exc})")
