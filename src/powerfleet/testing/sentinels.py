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

from powerfleet.broker.embedded import find_redis_server, stop_process
from powerfleet.testing.ports import PortLease
from powerfleet.testing.waiting import wait_for

MASTER_NAME = "fleet"
TEST_PASSWORD = "sentinel-test-Secret-42"  # the Redis nodes' and the Sentinels' password in tests
# ``fast``: Sentinel's internal periods (SENTINEL DEBUG, Redis 7) shortened for tests. The
# defaults are what a deployment runs (and what bench/failover.py measures): hello messages
# every 2 s, INFO every 10 s, and an old master reconfigured as a replica only after four hello
# periods, which made a graceful failover's demotion take ~11 s. A TILT (the timer delayed over
# 2 s, which a loaded machine can cause) lasts 2 s instead of 30.
FAST_PERIODS = {"info-period": 500, "publish-period": 500, "ping-period": 200, "ask-period": 200,
                "tilt-period": 2000}


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
                 password: str | None = None, fast: bool = False, failover_timeout_ms: int = 10000,
                 unpromotable: int = 0) -> None:
        self.dir = base
        self.dir.mkdir(parents=True, exist_ok=True)
        # Leased below the ephemeral range: these Sentinels would make a parallel test's private
        # Redis that was handed a killed master's port into a replica (see testing/ports.py).
        self._lease = PortLease(1 + replicas + sentinels)
        self.redis_ports = self._lease.ports[:1 + replicas]
        self.sentinel_ports = self._lease.ports[1 + replicas:]
        self.down_after_ms = down_after_ms
        self.min_replicas = (min_replicas_to_write, min_replicas_max_lag)
        self.sync_delay_s = sync_delay_s  # Redis waits this long before a full sync (its default: 5)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # One password for the Redis nodes and the Sentinels (the chart's choice too).
        self.password = password
        self.fast = fast
        self.failover_timeout_ms = failover_timeout_ms
        # The last ``unpromotable`` replicas run with replica-priority 0: Sentinel never promotes
        # them, so a test knows which replica a failover picks (the other one).
        self.priority = {p: 0 for p in self.redis_ports[len(self.redis_ports) - unpromotable:]} if unpromotable else {}

    @property
    def url(self) -> str:
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        """The fleet's ``sentinel://`` list for database ``db`` (tests sharing a cluster use their own)."""
        auth = f":{self.password}@" if self.password else ""
        return ";".join(f"sentinel://{auth if i == 0 else ''}127.0.0.1:{p}/{db}" for i, p in enumerate(self.sentinel_ports))

    def env(self, db: int = 0) -> dict[str, str]:
        env = {"POWERFLEET_BROKER__URL": self.url_for(db), "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": MASTER_NAME}
        if self.password:
            env["POWERFLEET_BROKER__SENTINEL__PASSWORD"] = self.password
        return env

    def broker_config(self, db: int = 0) -> dict[str, object]:
        """The same as a fleet.yaml ``broker`` section."""
        sentinel: dict[str, object] = {"master_name": MASTER_NAME}
        if self.password:
            sentinel["password"] = self.password
        return {"url": self.url_for(db), "sentinel": sentinel}

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
                "--min-replicas-max-lag", str(self.min_replicas[1]),
                "--replica-priority", str(self.priority.get(port, 100))]
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
                        f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
                        f"sentinel parallel-syncs {MASTER_NAME} 2\n" +
                        (f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
                         f"sentinel auth-pass {MASTER_NAME} {self.password}\n" if self.password else ""))
        self.procs[port] = _spawn([find_redis_server(), str(conf), "--sentinel"])
        client = self.client(port)
        try:
            wait_for(client.ping, f"Sentinel on port {port} to answer PING", 20)
            for name, value in (FAST_PERIODS.items() if self.fast else ()):
                client.execute_command("SENTINEL", "DEBUG", name, value)
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

    def freeze(self, port: int) -> None:
        """SIGSTOP: the node holds its connections open and answers nothing (a hung host)."""
        os.kill(self.procs[port].pid, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        """SIGCONT a frozen node: it resumes as it was (a master Sentinel replaced is then demoted)."""
        os.kill(self.procs[port].pid, signal.SIGCONT)

    def cut_replication(self, port: int) -> None:
        """Replica ``port`` keeps its data and stays promotable, but stops receiving its master's
        writes (it can no longer authenticate to it): what it lacks, a failover to it loses,
        as asynchronous replication does when the master dies before a write reaches a replica."""
        client = self.client(port)
        try:
            client.config_set("masterauth", f"not-{self.password or 'set'}")
            client.client_kill_filter(_type="master")
            wait_for(lambda: client.info("replication").get("master_link_status") == "down",
                     f"replica {port} to lose its master link", 20)
        finally:
            client.close()

    def restore(self) -> int:
        """Back to a whole cluster after a test's faults: every Redis node running (a killed one
        restarted as a replica of the current master), every link up, the Sentinels agreed.
        Which node is master is whatever the last failover left; returns it."""
        master = self.master_port()
        for port in self.redis_ports:
            if not self.running(port):
                self.start_redis(port, master)
            else:  # heal a cut_replication
                client = self.client(port)
                try:
                    client.config_set("masterauth", self.password or "")
                finally:
                    client.close()
        for port in self.redis_ports:
            if port != master:
                self.wait_synced(port)
        self.wait_sentinels_agree(master)
        return master

    def promotable_replica(self) -> int:
        """The replica a failover of the current master promotes (the one priority allows)."""
        master = self.master_port()
        ports = [p for p in self.redis_ports if p != master and self.priority.get(p, 100) > 0]
        assert len(ports) == 1, f"more than one promotable replica: {ports}"
        return ports[0]

    def graceful_failover(self) -> None:
        client = self.client(self.sentinel_ports[0])
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        finally:
            client.close()

    def stop(self) -> None:
        # All at once, and no grace beyond 2 s: a master whose replica was promoted waits out
        # Redis's shutdown-timeout (10 s) for it, and nothing here needs a clean shutdown.
        procs = [self.procs.pop(port) for port in list(self.procs)]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            stop_process(proc, timeout_s=2.0)

    def close(self) -> None:
        """Stop every process, then give the ports back."""
        self.stop()
        self._lease.release()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
