"""Beat's guard task (power.guard_runner: beat) on a control worker that cannot read the cluster yet:
each period says why in its result, the log has one line for the cause and no traceback, and the
group is guarded once the cluster answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.config import load_config
from powerfleet.testing.waiting import wait_for
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import broker_url, redis_server, wait_worker  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

GROUPS = "{rack-a: {limit_w: 1300, oversubscription: 1.3}}"


def test_a_guard_period_without_cluster_access_is_skipped_in_one_line_then_guards_once_it_answers(
        tmp_path: Path, broker_url: str) -> None:  # noqa: F811
    kubeconfig = tmp_path / "kubeconfig"  # not there yet: the worker starts before the cluster access
    env = {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_BUDGET__GROUPS": GROUPS,
           "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig)}
    app = create_app(load_config(environ=env))
    with Launcher(log_dir=tmp_path / "logs", env=env) as launcher:
        worker = launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@guard")
        wait_worker(app, "ctl@guard")
        results = [app.send_task("powerfleet.power.guard", kwargs={"group": "rack-a"}).get(timeout=60)
                   for _ in range(3)]
        for result in results:
            assert result["ran"] is False and result["summary"].startswith("skipped: the group's nodes and pods could "
                                                                           "not be read"), result
        log = worker.log.read_text()
        assert "Traceback" not in log, log
        assert log.count("cannot read the group's nodes and pods") == 1, log

        with ApiServer() as api:
            api.write_kubeconfig(kubeconfig)
            api.apply({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": "gpu-node-a", "labels": {"powerfleet.io/rack": "rack-a"}},
                       "status": {"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "2"}}})
            ran = app.send_task("powerfleet.power.guard", kwargs={"group": "rack-a"}).get(timeout=60)
            assert ran["ran"] is True and ran.get("skipped") is None, ran
            wait_for(lambda: "the group's view is readable again" in worker.log.read_text(), "the recovery line")
            assert "Traceback" not in worker.log.read_text()
