"""The broker's epoch: which master's history the data a client reads belongs to.

Redis gives every master a replication ID (``INFO replication`` ``master_replid``); a replica
shares its master's, and a replica promoted by a failover takes a new one. Replication is
asynchronous, so the promoted replica may lack the old master's last writes: a record read
after a failover can be older than one the old master had acknowledged. A record that a
reader compares against the cluster (the budget's replica counts) carries the epoch it was
written under, and one from another epoch is re-derived instead of trusted
(docs/reliability.md "Broker failover").
"""

from __future__ import annotations

from typing import Any

import redis


def epoch_of(info: Any) -> str | None:
    """The replication ID in an ``INFO replication`` reply (None: not a reply we can read)."""
    if not isinstance(info, dict):
        return None
    replid = info.get("master_replid")
    if isinstance(replid, bytes):
        replid = replid.decode(errors="replace")
    return replid if isinstance(replid, str) and replid else None


def broker_epoch(client: redis.Redis) -> str | None:
    """The current master's epoch; None where INFO is refused (a managed Redis may rename it)."""
    try:
        return epoch_of(client.info("replication"))
    except redis.ResponseError:
        return None
