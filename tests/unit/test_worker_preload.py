"""A worker imports the cluster client's API classes before its pool forks (cluster/kube.py).

A sweep shard's first run in a fresh pool child imported ``kubernetes.client.CoreV1Api`` (1.6 s on a
quiet core) inside its soft time limit, and a clean-clone run's demo failed on SoftTimeLimitExceeded.
"""

import subprocess
import sys

PROBE = """
import sys
from celery import signals
import powerfleet.tasks.retune  # registers the worker's signal handlers, as a worker's app does
before = "kubernetes.client.api.core_v1_api" in sys.modules
signals.worker_init.send(sender=None)
print(before, "kubernetes.client.api.core_v1_api" in sys.modules)
"""


def test_worker_init_imports_the_api_classes_a_shard_needs() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
