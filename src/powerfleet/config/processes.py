"""The fleet's processes and transport: broker (Sentinel included), beat, time limits, Flower,
the task API and /metrics."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator, model_validator

from powerfleet.config.base import Strict
from powerfleet.config.broker_urls import check_broker_url, is_sentinel


class SentinelConfig(Strict):
    # The name the Sentinels monitor (`sentinel monitor <name> ...`); required with sentinel:// URLs.
    master_name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    # The Sentinels' own password (their `requirepass`); the Redis master's goes in the URL.
    password: str | None = None
    # TLS to the Sentinels and to the Redis nodes they name, verified against this CA file
    # (the system store when unset).
    tls: bool = False
    tls_ca_file: str | None = None


class BrokerConfig(Strict):
    # None: start a private redis-server on loopback (see powerfleet.broker.embedded).
    # redis://, rediss://, unix://, or sentinel://host:port URLs joined by ; (docs/reliability.md).
    url: str | None = None
    result_backend: str | None = None  # defaults to the broker URL
    sentinel: SentinelConfig = SentinelConfig()
    # A publish the master refuses with NOREPLICAS (min-replicas-to-write unmet, e.g. while a
    # replica resyncs after a failover) is retried for this long, then reported in one line.
    noreplicas_retry_s: float = Field(5.0, ge=0, le=120)
    # Must exceed the longest acks_late task, or Redis redelivers it while it still runs.
    visibility_timeout_s: int = Field(3600, ge=60, le=7 * 86400)
    # Every tick stores a small result: a day of them at the default rates is ~36 MB of Redis
    # (docs/reliability.md measured ~1.5 MB per hour); a week would be ~250 MB.
    result_expires_s: int = Field(86400, ge=3600)

    @field_validator("url", "result_backend")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        return None if v is None else check_broker_url(v)

    @model_validator(mode="after")
    def _sentinel_needs_a_master(self) -> "BrokerConfig":
        if (is_sentinel(self.url) or is_sentinel(self.result_backend)) and self.sentinel.master_name is None:
            raise ValueError("a sentinel:// URL needs broker.sentinel.master_name (the name the Sentinels monitor)")
        return self


class BeatConfig(Strict):
    reconcile_interval_s: float = Field(15.0, gt=0, le=86400)
    budget_interval_s: float = Field(30.0, gt=0, le=86400)
    retune_interval_s: float = Field(10.0, gt=0, le=86400)
    # The RedBeat lock: a standby beat takes over at most this long after the leader dies.
    lock_timeout_s: int = Field(60, ge=5, le=3600)
    max_loop_interval_s: int = Field(5, ge=1, le=300)

    @model_validator(mode="after")
    def _lock_outlives_loop(self) -> "BeatConfig":
        if self.lock_timeout_s <= self.max_loop_interval_s:
            raise ValueError("lock_timeout_s must be greater than max_loop_interval_s")
        return self


class TimeLimit(Strict):
    soft_s: float = Field(gt=0)
    hard_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> "TimeLimit":
        if self.soft_s >= self.hard_s:
            raise ValueError("soft_s must be less than hard_s")
        return self


class TimeLimits(Strict):
    """Soft/hard limits per task family; prefork workers enforce both."""

    control: TimeLimit = TimeLimit(soft_s=60, hard_s=90)
    sweep: TimeLimit = TimeLimit(soft_s=600, hard_s=660)
    node: TimeLimit = TimeLimit(soft_s=20, hard_s=30)


class FlowerConfig(Strict):
    address: str = "127.0.0.1"
    port: int = Field(5555, ge=1, le=65535)
    # "user:password" entries. Required when address is not loopback.
    basic_auth: list[str] = Field(default_factory=list)
    # Flower's worker-control endpoints (shutdown, pool, consumers, rate/time limits, revoke,
    # abort) stop work or uncap a node with one call; off, they answer 403 (docs/operations.md).
    allow_worker_control: bool = False

    @field_validator("basic_auth")
    @classmethod
    def _user_colon_password(cls, v: list[str]) -> list[str]:
        for entry in v:
            user, sep, password = entry.partition(":")
            if not sep or not user or not password:
                raise ValueError("each entry must be 'user:password'")
        return v

    @property
    def is_loopback(self) -> bool:
        if self.address == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return False


class TaskApiConfig(Strict):
    """Sends by hand (`powerfleet trigger`, Flower's task API)."""

    # The JSON arguments of one send; the result (often an echo of them) stays in Redis for
    # broker.result_expires_s, so an unbounded payload is unbounded Redis memory.
    max_payload_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)


class MetricsConfig(Strict):
    port: int = Field(0, ge=0, le=65535)  # 0 disables /metrics
    address: str = "127.0.0.1"
