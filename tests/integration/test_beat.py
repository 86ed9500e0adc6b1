"""Two beat processes: one sends ticks, the other waits on the Redis lock and takes over."""

import re
import signal
import threading
import time

import redis

from powerfleet.beat.ticklog import TickLog
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for


LOCK_TIMEOUT_S = 20


def _pid(origin: str) -> str:
    """Celery's message origin is 'gen<pid>@<host>' for the publishing process."""
    match = re.match(r"^(?:gen)?(\d+)@", origin)
    assert match, origin
    return match.group(1)


def test_only_one_of_two_beats_sends_ticks_and_the_standby_takes_over(launcher: Launcher, app, broker_url) -> None:
    launcher.env.update({
        "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1",
        # The leader must renew its lock within this on a loaded machine, or the standby (rightly)
        # takes over and the "one sender" assertion reads a handover as two leaders.
        "POWERFLEET_BEAT__LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S),
        "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1",
        "POWERFLEET_NODES": "[]",
    })
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@test")
    wait_worker(app, "ctl@test")
    first = launcher.spawn("beat", "beat")
    second = launcher.spawn("beat2", "beat")
    ticks = TickLog(redis.Redis.from_url(broker_url))

    origins = wait_for(lambda: (o := ticks.origins("reconcile")) and len(o) >= 5 and o, "five reconcile ticks")
    senders = {_pid(o) for o in origins}
    assert len(senders) == 1, f"ticks came from several beats: {senders}"
    leader_pid = senders.pop()
    assert leader_pid in {str(first.proc.pid), str(second.proc.pid)}
    assert first.proc.poll() is None and second.proc.poll() is None  # the standby is alive, just waiting

    leader = first if str(first.proc.pid) == leader_pid else second
    standby = second if leader is first else first
    launcher.stop_child(leader)
    wait_for(lambda: any(_pid(o) == str(standby.proc.pid) for o in ticks.origins("reconcile")),
             "the standby beat to send a tick", timeout_s=LOCK_TIMEOUT_S + 30)




class _PauseAfter:
    """Redis MONITOR in a thread that pauses every client (CLIENT PAUSE ALL) the moment the server
    runs a command starting with ``prefix``, and records what ran after it (before the pause held)."""

    def __init__(self, url: str, prefix: str, pause_s: float) -> None:
        self.prefix, self.pause_ms = prefix, int(pause_s * 1000)
        self.pauser = redis.Redis.from_url(url)
        self.pauser.ping()  # connected before it is needed: the pause must be one round trip
        self.paused = threading.Event()
        self.after: list[str] = []
        self._armed = threading.Event()
        self._monitor = redis.Redis.from_url(url).monitor()
        self._monitor.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def arm(self) -> None:
        self.after.clear()
        self.paused.clear()
        self._armed.set()

    def _read(self) -> None:
        try:
            for cmd in self._monitor.listen():
                command = cmd["command"]
                if self.paused.is_set():
                    self.after.append(command)
                elif self._armed.is_set() and command.startswith(self.prefix):
                    self.pauser.execute_command("CLIENT", "PAUSE", str(self.pause_ms), "ALL")
                    self._armed.clear()
                    self.paused.set()
        except Exception:  # the connection closes when the test ends
            pass

    def close(self) -> None:
        self._monitor.connection.disconnect()


def test_a_stop_that_lands_while_a_tick_is_being_published_lets_it_finish_and_exits_cleanly(
        launcher: Launcher, broker_url) -> None:
    """CI saw `up`'s Ctrl-C reach beat inside a publish: SystemExit in the socket read, kombu retried
    on the torn connection, and beat logged a traceback on its way out. Here Redis is paused the
    moment beat records a reconcile tick's run (RedBeat saves it just before the publish), so the
    publish is blocked in flight when SIGTERM comes."""
    launcher.env.update({"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1",
                         "POWERFLEET_NODES": "[]"})
    client = redis.Redis.from_url(broker_url)
    # Shorter than the result backend's socket timeout (3 s) and the broker's (10 s): a stall past
    # those fails the publish by itself, which is not what this test is about.
    pause_s = 2.5
    pauser = _PauseAfter(broker_url, "HSET powerfleet:redbeat:powerfleet-reconcile-tick meta", pause_s)
    beat = launcher.spawn("beat", "beat")
    try:
        for _attempt in range(20):
            queued = client.llen("control")
            pauser.arm()
            assert pauser.paused.wait(30), "beat to save a reconcile tick's run"
            paused_until = time.monotonic() + pause_s
            time.sleep(0.3)  # an observation window, not a wait for a state: MONITOR shows a publish that beat the pause
            if not any(c.startswith("LPUSH control") for c in pauser.after):
                break
            client.execute_command("CLIENT", "UNPAUSE")
        else:
            raise AssertionError("the pause never landed before a publish in 20 tries")
        beat.proc.send_signal(signal.SIGTERM)
        assert time.monotonic() < paused_until - 0.2, "the stop must land while the publish is blocked"
        assert beat.proc.wait(timeout=60) == 0
    finally:
        pauser.close()
    log = beat.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert client.llen("control") > queued, "the tick in flight was lost"
