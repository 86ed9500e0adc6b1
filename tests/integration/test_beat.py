"""Two beat processes: one sends ticks, the other waits on the Redis lock and takes over."""

import re

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
