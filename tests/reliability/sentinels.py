"""A replicated Redis on loopback: a master, replicas and three Sentinels, all real
redis-server processes (``redis-server <conf> --sentinel`` starts a Sentinel without the
redis-sentinel package). Small ``down-after-milliseconds`` so a failover takes seconds.

Used by the Sentinel tests and bench/failover.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Self

import redis

from powerfleet.broker.embedded import find_redis_server, free_loopback_port, stop_process
from tests.waiting import wait_for

MASTER_NAME = "fleet"


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _client(port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2, socket_connect_timeout=2)


class SentinelCluster:
    """``replicas`` replicas of one master, watched by ``sentinels`` Sentinels (quorum 2).

    ``min_replicas_to_write``: the master refuses writes (NOREPLICAS) unless that many replicas
    are attached with a lag under ``min_replicas_max_lag`` seconds, as the chart configures it.
    ``sync_delay_s``: Redis's repl-diskless-sync-delay (0 here so replicas sync at once; Redis's
    default of 5 s is the window in which a freshly restarted replica is still empty).
    """

    def __init__(self, base: Path, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 800,
                 min_replicas_to_write: int = 0, min_replicas_max_lag: int = 10, sync_delay_s: int = 0,
                 password: str | None = None) -> None:
        self.dir = base
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis_ports = [free_loopback_port() for _ in range(1 + replicas)]
        self.sentinel_ports = [free_loopback_port() for _ in range(sentinels)]
        self.down_after_ms = down_after_ms
        self.min_replicas = (min_replicas_to_write, min_replicas_max_lag)
        self.sync_delay_s = sync_delay_s  # Redis waits this long before a full sync (its default: 5)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # One password for the Redis nodes and the Sentinels (the chart's choice too).
        self.password = password

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return ";".join(f"sentinel://{auth if i == 0 else ''}127.0.0.1:{p}/0" for i, p in enumerate(self.sentinel_ports))

    def env(self) -> dict[str, str]:
        env = {"POWERFLEET_BROKER__URL": self.url, "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": MASTER_NAME}
        if self.password:
            env["POWERFLEET_BROKER__SENTINEL__PASSWORD"] = self.password
        return env

    def client(self, port: int) -> redis.Redis:
        return _client(port, self.password)

    # -- Redis nodes -------------------------------------------------------------------
    def start_redis(self, port: int, replica_of: int | None) -> None:
        d = self.dir / f"redis-{port}"
        d.mkdir(exist_ok=True)
        argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
                "--maxmemory-policy", "noeviction", "--logfile", str(d / "redis.log"),
                "--repl-diskless-sync-delay", str(self.sync_delay_s),
                "--min-replicas-to-write", str(self.min_replicas[0]),
                "--min-replicas-max-lag", str(self.min_replicas[1])]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        if self.password:  # on the command line: test processes only (the chart writes a file)
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        self.procs[port] = _spawn(argv)
        client = self.client(port)
        try:
            wait_for(client.ping, f"redis-server on port {port} to answer PING", 20)
        finally:
            client.close()

    def start(self) -> Self:
        master = self.redis_ports[0]
        self.start_redis(master, None)
        for port in self.redis_ports[1:]:
            self.start_redis(port, master)
        for port in self.redis_ports[1:]:
            self.wait_synced(port)
        for port in self.sentinel_ports:
            self._start_sentinel(port, master)
        self.wait_sentinels_agree(master)
        return self

    def wait_synced(self, port: int, timeout_s: float = 30) -> None:
        client = self.client(port)
        try:
            wait_for(lambda: client.info("replication").get("master_link_status") == "up",
                     f"replica {port} to finish its sync", timeout_s)
        finally:
            client.close()

    # -- Sentinels ----------------------------------------------------------------------
    def _start_sentinel(self, port: int, master: int) -> None:
        d = self.dir / f"sentinel-{port}"
        d.mkdir(exist_ok=True)
        conf = d / "sentinel.conf"  # Sentinel rewrites its file with what it learns
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {d}\nlogfile {d / 'sentinel.log'}\n"
                        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n"
                        f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                        f"sentinel parallel-syncs {MASTER_NAME} 2\n" +
                        (f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
                         f"sentinel auth-pass {MASTER_NAME} {self.password}\n" if self.password else ""))
        self.procs[port] = _spawn([find_redis_server(), str(conf), "--sentinel"])
        client = self.client(port)
        try:
            wait_for(client.ping, f"Sentinel on port {port} to answer PING", 20)
        finally:
            client.close()

    def sentinel_view(self, port: int) -> tuple[tuple[str, int], int, int]:
        """(master address, replicas known, other Sentinels known) as one Sentinel sees them."""
        client = self.client(port)
        try:
            m = client.sentinel_master(MASTER_NAME)
            replicas = [r for r in client.sentinel_slaves(MASTER_NAME) if not r.get("is_sdown")]
            return (m["ip"], int(m["port"])), len(replicas), int(m["num-other-sentinels"])
        finally:
            client.close()

    def wait_sentinels_agree(self, master: int, timeout_s: float = 40) -> None:
        """Every Sentinel names ``master``, knows the live replicas and the other Sentinels."""
        want_replicas = sum(1 for p in self.redis_ports if p != master and self.running(p))

        def agreed() -> bool:
            return all(self.sentinel_view(p) == (("127.0.0.1", master), want_replicas, len(self.sentinel_ports) - 1)
                       for p in self.sentinel_ports)
        wait_for(agreed, f"the Sentinels to agree on master {master}", timeout_s, every_s=0.1)

    def master_port(self) -> int:
        return self.sentinel_view(self.sentinel_ports[0])[0][1]

    def wait_new_master(self, old: int, timeout_s: float = 40) -> int:
        """Wait until every Sentinel names a master other than ``old``; its port."""
        def moved() -> int | None:
            ports = {self.sentinel_view(p)[0][1] for p in self.sentinel_ports}
            return ports.pop() if len(ports) == 1 and old not in ports else None
        new = wait_for(moved, f"the Sentinels to promote a replica of {old}", timeout_s, every_s=0.05)
        client = self.client(new)
        try:
            wait_for(lambda: client.info("replication").get("role") == "master", f"{new} to act as master", timeout_s)
        finally:
            client.close()
        return new

    def wait_demoted(self, port: int, timeout_s: float = 40) -> None:
        """Wait until ``port`` (a master a graceful failover replaced) runs as a replica.

        Until then it still accepts writes: a client that has not yet noticed the failover
        writes there, and those writes are dropped when it resyncs from the new master.
        """
        client = self.client(port)
        try:
            wait_for(lambda: client.info("replication").get("role") == "slave", f"{port} to be demoted", timeout_s)
        finally:
            client.close()

    # -- faults --------------------------------------------------------------------------
    def running(self, port: int) -> bool:
        proc = self.procs.get(port)
        return proc is not None and proc.poll() is None

    def kill(self, port: int) -> None:
        """SIGKILL: no shutdown save, every client connection cut mid-command."""
        proc = self.procs.pop(port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def graceful_failover(self) -> None:
        client = self.client(self.sentinel_ports[0])
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        finally:
            client.close()

    def stop(self) -> None:
        for port in list(self.procs):
            stop_process(self.procs.pop(port))

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
