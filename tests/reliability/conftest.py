"""Fixtures shared with the suites whose worlds these tests reuse: a real redis-server (session
and per-module), the retune test world (loopback API server, frontends, trace directory)."""

from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures
from tests.retune.conftest import kube, redis_url, world  # noqa: F401 - fixtures
