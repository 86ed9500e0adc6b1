"""A TLS broker with a password works end to end, and no secret shows in logs, results or status.

The certificates are made here (cryptography), the broker is Debian's redis-server with its
TLS port, and the fleet runs as real processes: a worker, beat and Flower with basic auth.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import redis

from powerfleet.broker.embedded import find_redis_server, free_loopback_port
from powerfleet.config import load_config
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import run_cli, wait_worker
from tests.waiting import wait_for

BROKER_PASSWORD = "br0ker-S3cret-pw"
FLOWER_PASSWORD = "fl0wer-S3cret-pw"


def _self_signed(dirpath: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = dirpath / "cert.pem", dirpath / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[str]:
    cert, key = _self_signed(tmp_path)
    port = free_loopback_port()
    proc = subprocess.Popen([find_redis_server(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                             "--tls-auth-clients", "no", "--requirepass", BROKER_PASSWORD, "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"rediss://:{BROKER_PASSWORD}@127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    try:
        wait_for(lambda: redis.Redis.from_url(url, socket_connect_timeout=0.5).ping(), "the TLS redis-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tls_broker_with_a_password_runs_the_fleet_and_leaks_no_secret(tls_broker: str, tmp_path: Path) -> None:
    flower_port = free_loopback_port()
    env = {"POWERFLEET_BROKER__URL": tls_broker, "POWERFLEET_NODES": "[]",
           "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_FLOWER__PORT": str(flower_port),
           "POWERFLEET_FLOWER__BASIC_AUTH": f"[ops:{FLOWER_PASSWORD}]"}
    app = create_app(load_config(environ=env))
    logs = tmp_path / "logs"
    with Launcher(log_dir=logs, env=env) as launcher:
        launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@tls")
        launcher.spawn("beat", "beat")
        launcher.spawn("flower", "flower")
        wait_worker(app, "ctl@tls")

        echoed = run_cli("trigger", "powerfleet.fleet.echo", "--args", '{"payload": "over tls"}', env=env)
        assert echoed.returncode == 0, echoed.stderr
        assert json.loads(echoed.stdout)["payload"] == "over tls"
        r = redis.Redis.from_url(tls_broker)
        wait_for(lambda: r.hget("powerfleet:ticks:last", "reconcile"), "beat to tick over TLS")
        status = run_cli("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert "ctl@tls" in json.loads(status.stdout)["workers"]
        with httpx.Client(base_url=f"http://127.0.0.1:{flower_port}", timeout=10) as flower:
            wait_for(lambda: flower.get("/healthcheck").status_code == 200, "Flower over a TLS broker")
            sent = flower.post("/api/task/send-task/powerfleet.fleet.echo", auth=("ops", FLOWER_PASSWORD),
                               json={"kwargs": {"payload": 1}})
            assert sent.status_code == 200, sent.text
            task_id = sent.json()["task-id"]
            wait_for(lambda: flower.get(f"/api/task/result/{task_id}", auth=("ops", FLOWER_PASSWORD))
                     .json()["state"] == "SUCCESS", "the Flower task to finish")

        # Nothing a person or a scraper reads carries a secret: not logs, not results, not status.
        stored = b"".join(r.dump(k) or b"" for k in r.scan_iter(count=1000))
        seen = {"logs": "".join(p.read_text(errors="replace") for p in logs.glob("*.log")),
                "trigger": echoed.stdout + echoed.stderr, "status": status.stdout + status.stderr,
                "redis": stored.decode("latin-1")}
    for where, text in seen.items():
        for secret in (BROKER_PASSWORD, FLOWER_PASSWORD):
            assert secret not in text, f"{secret} found in {where}"
    assert "rediss://" in seen["logs"]  # the URL is logged, redacted
