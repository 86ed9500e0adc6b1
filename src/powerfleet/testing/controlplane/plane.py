"""A real Kubernetes control plane for the tests (docs/twin.md, "Real control plane"): etcd and
kube-apiserver started as envtest starts them, and on request kube-scheduler, kube-controller-manager
and kwok. The binaries come from ``controlplane/build.sh``; nothing here builds or downloads."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .certs import Pki, make_pki
from .procs import Proc, free_port

REPO = Path(__file__).resolve().parents[4]
BUILD_SCRIPT = REPO / "controlplane" / "build.sh"
START_TIMEOUT_S = 60.0  # envtest allows 20 s; two shared cores under load need more
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "helm")


def built_bin_dir() -> Path | None:
    """The cache directory holding every program (``build.sh --dir``, or ``PF_CONTROL_PLANE_BIN``),
    or None when it is incomplete. Not a ``POWERFLEET_*`` name: those are the fleet's configuration,
    and an unknown one stops every command."""
    if os.environ.get("PF_CONTROL_PLANE_BIN"):
        given = Path(os.environ["PF_CONTROL_PLANE_BIN"])
        return given if all((given / p).is_file() for p in PROGRAMS) else None
    if shutil.which("bash") is None or not BUILD_SCRIPT.exists():
        return None
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--dir"], capture_output=True, text=True, check=False)
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def kubeconfig_text(server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
                    token: str | None = None, user: str = "admin", namespace: str = "default") -> str:
    creds: dict[str, str] = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "cp",
        "clusters": [{"name": "cp", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "cp", "context": {"cluster": "cp", "user": user, "namespace": namespace}}],
    })


@dataclass
class ControlPlane:
    bin_dir: Path
    root: Path
    pki: Pki = field(init=False)
    url: str = field(init=False, default="")
    kubeconfig: Path = field(init=False)
    procs: dict[str, Proc] = field(init=False, default_factory=dict)
    start_seconds: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.root / "pki")
        self.kubeconfig = self.root / "admin.kubeconfig"

    # -- lifecycle --

    def _proc(self, name: str, *args: str) -> Proc:
        proc = Proc(name, [str(self.bin_dir / name), *args], self.root / "logs" / f"{name}.log")
        self.procs[name] = proc
        return proc.start()

    def start(self) -> ControlPlane:
        """etcd, then kube-apiserver with envtest's flags; returns once /readyz answers 200."""
        t0 = time.monotonic()
        try:
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        self.start_seconds["etcd+kube-apiserver"] = time.monotonic() - t0
        return self

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._proc("etcd", "--name=cp", f"--data-dir={self.root / 'etcd'}",
                          f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
                          f"--listen-peer-urls=http://127.0.0.1:{peer}",
                          f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                          f"--initial-cluster=cp=http://127.0.0.1:{peer}", "--unsafe-no-fsync=true",
                          "--log-level=warn")

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self.start_seconds["etcd"] = proc.wait_ready(healthy, START_TIMEOUT_S)

    def _start_apiserver(self) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        p = self.pki
        proc = self._proc(
            "kube-apiserver", f"--etcd-servers={self.etcd_url}", f"--secure-port={port}",
            "--bind-address=127.0.0.1", "--endpoint-reconciler-type=none", f"--cert-dir={self.root / 'certs'}",
            f"--tls-cert-file={p.serving_crt}", f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_crt}", "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount", "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}/", f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}")
        self.kubeconfig.write_text(kubeconfig_text(self.url, p.ca_crt, cert=p.admin_crt, key=p.admin_key))
        self.start_seconds["kube-apiserver"] = proc.wait_ready(lambda: self.get_raw("/readyz")[0] == 200,
                                                               START_TIMEOUT_S)

    def start_scheduler(self) -> None:
        self._start_component("kube-scheduler", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false")

    def start_controller_manager(self) -> None:
        p = self.pki
        self._start_component(
            "kube-controller-manager", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            f"--service-account-private-key-file={p.sa_key}", f"--root-ca-file={p.ca_crt}",
            f"--cluster-signing-cert-file={p.ca_crt}", f"--cluster-signing-key-file={p.ca_key}",
            "--controllers=*,-node-ipam-controller",
            "--concurrent-deployment-syncs=5", "--node-monitor-grace-period=120s")

    def _start_component(self, name: str, *args: str) -> None:
        if name in self.procs and self.procs[name].alive():
            return
        port = free_port()
        proc = self._proc(name, *args, "--bind-address=127.0.0.1", f"--secure-port={port}",
                          f"--authentication-kubeconfig={self.kubeconfig}",
                          f"--authorization-kubeconfig={self.kubeconfig}")
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

        def healthy() -> bool:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=ctx) as resp:
                return resp.status == 200

        self.start_seconds[name] = proc.wait_ready(healthy, START_TIMEOUT_S)

    def start_kwok(self, stages: Path) -> None:
        if "kwok" in self.procs and self.procs["kwok"].alive():
            return
        port = free_port()
        proc = self._proc("kwok", f"--kubeconfig={self.kubeconfig}", f"--config={stages}",
                          "--manage-all-nodes=false",
                          "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                          "--node-lease-duration-seconds=40", "--cidr=10.0.1.0/24", "--node-ip=127.0.0.1",
                          f"--server-address=127.0.0.1:{port}")

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return resp.status == 200

        self.start_seconds["kwok"] = proc.wait_ready(healthy, START_TIMEOUT_S)

    def stop(self) -> None:
        """Stops every program, the API server's clients first and etcd last; nothing is left running."""
        for name in ("kwok", "kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()

    def running(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.alive()]

    # -- clients --

    def get_raw(self, path: str) -> tuple[int, bytes]:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5, context=ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def token_kubeconfig(self, path: Path, token: str, *, user: str, namespace: str = "default") -> Path:
        path.write_text(kubeconfig_text(self.url, self.pki.ca_crt, token=token, user=user, namespace=namespace))
        return path
