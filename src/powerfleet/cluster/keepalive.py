"""API clients for long watches: no retries behind a call, and TCP keepalive on every socket.

A watch can be silent for its whole 5-10 min when nothing it selects changes, so its read
deadline cannot notice a peer that is gone (a node or load balancer failure leaves a half-open
connection); the kernel's probes do, within idle + interval x probes = 60 s, and the read then
fails and the watcher relists. Used by the agent's pod view (agent/build.py) and the control
worker's ledger view (gpu_pod_cache.py).
"""

from __future__ import annotations

import socket

import urllib3
from kubernetes import client
from kubernetes import config as kube_config

KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 30, 10, 3


def keepalive_socket_options() -> list[tuple[int, int, int]]:
    """urllib3's own socket options plus TCP keepalive (idle 30 s, then 3 probes 10 s apart)."""
    options = [*urllib3.connection.HTTPConnection.default_socket_options, (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):  # Linux has all three; others keep the kernel's defaults
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def watch_api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from ``kubeconfig`` (None: the in-cluster service account) for a watcher:
    urllib3 ``retries=0`` (each call's deadline is its own) and keepalive sockets."""
    cfg = client.Configuration()
    if kubeconfig:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        kube_config.load_incluster_config(client_configuration=cfg)
    cfg.retries = 0
    cfg.socket_options = keepalive_socket_options()
    return client.ApiClient(cfg)
