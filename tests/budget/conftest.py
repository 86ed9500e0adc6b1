"""The integration fixtures (real redis-server, launcher, app) for the budget end-to-end test."""

from tests.integration.conftest import app, broker_url, fleet_env, launcher, redis_server  # noqa: F401
