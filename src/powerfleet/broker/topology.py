"""Who is the Redis master, which replicas follow it, when it last changed: asked of the
Sentinels (or of the one Redis, without them). Read by `powerfleet status` and the start-up
check every command makes, so a Sentinel setup that cannot work fails in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from powerfleet.broker.clients import BrokerConfigError, UnknownMaster, master_name, sentinel_kwargs
from powerfleet.config.broker_urls import is_sentinel, parse_sentinel_url
from powerfleet.config.fleet import BrokerConfig

# Anything but an answer (refused, timed out, not Redis at all: InvalidResponse): ask the next.
_ERRORS = (redis.RedisError, OSError)


@dataclass(frozen=True)
class SentinelAnswer:
    sentinel: str
    master: dict[str, str] | None  # SENTINEL MASTER's fields, None: this Sentinel does not know the name
    replicas: list[dict[str, str]]
    ckquorum: str | None = None  # SENTINEL CKQUORUM's reply ("OK ..." or "NOQUORUM ..."); None: not asked


def _text(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)


def _fields(reply: Any) -> dict[str, str]:
    """SENTINEL MASTER/REPLICAS fields as text (redis-py answers a dict, or a flat list over RESP2)."""
    if isinstance(reply, dict):
        return {_text(k): _text(v) for k, v in reply.items()}
    items = [_text(x) for x in reply]
    return dict(zip(items[::2], items[1::2]))


def _ckquorum(client: redis.Redis, name: str) -> str:
    """Whether the Sentinels that this one sees can authorise a failover (SENTINEL CKQUORUM, one line)."""
    try:
        return _text(client.execute_command("SENTINEL", "CKQUORUM", name)).splitlines()[0]
    except redis.ResponseError as exc:
        return str(exc).splitlines()[0] if str(exc) else "NOQUORUM"


def ask_sentinels(url: str, broker: BrokerConfig, timeout_s: float, stop_at_first: bool = True,
                  quorum: bool = False) -> list[SentinelAnswer]:
    """One answer per Sentinel that replied (stopping at the first that knows the master unless
    ``stop_at_first`` is False); ``quorum``: each answer also carries SENTINEL CKQUORUM's reply."""
    name = master_name(broker)
    answers: list[SentinelAnswer] = []
    unreachable: list[str] = []
    for host, port in parse_sentinel_url(url).sentinels:
        where = f"{host}:{port}"
        client = redis.Redis(host=host, port=port, **sentinel_kwargs(broker.sentinel, timeout_s))
        try:
            try:
                master = _fields(client.execute_command("SENTINEL", "MASTER", name))
                replicas = [_fields(r) for r in client.execute_command("SENTINEL", "REPLICAS", name)]
            except redis.ResponseError as exc:
                if "no such master" not in str(exc).lower():
                    unreachable.append(f"{where} ({str(exc).splitlines()[0][:120]})")
                    continue
                master, replicas = None, []
            answers.append(SentinelAnswer(where, master, replicas,
                                          _ckquorum(client, name) if quorum and master is not None else None))
            if master is not None and stop_at_first:
                break
        except _ERRORS as exc:
            unreachable.append(f"{where} ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})")
        finally:
            client.close()
    if not answers:
        raise BrokerConfigError(f"no Sentinel answered: {', '.join(unreachable)}")
    if all(a.master is None for a in answers):
        asked = ", ".join(a.sentinel for a in answers)
        raise UnknownMaster(f"no Sentinel knows a master named {name!r} (broker.sentinel.master_name); "
                                f"asked {asked}")
    return answers


def find_master(url: str, broker: BrokerConfig, timeout_s: float) -> tuple[str, int]:
    """The current master's address; BrokerConfigError (one line) when none can be found."""
    answer = next(a for a in ask_sentinels(url, broker, timeout_s) if a.master is not None)
    assert answer.master is not None
    if "s_down" in answer.master.get("flags", "") or "o_down" in answer.master.get("flags", ""):
        where = f"{answer.master.get('ip')}:{answer.master.get('port')}"
        quorum = _quorum_of(url, broker, timeout_s)
        then = ("a failover may be under way" if quorum["failover_possible"]
                else f"no failover can happen: {quorum['detail']}")
        raise BrokerConfigError(f"the Sentinels see master {master_name(broker)!r} down ({where}); {then}")
    return answer.master["ip"], int(answer.master["port"])


def describe(url: str, broker: BrokerConfig, timeout_s: float) -> dict[str, Any]:
    """The broker's topology as JSON data for `powerfleet status` (never raises on a Redis error)."""
    if not is_sentinel(url):
        return _describe_plain(url, timeout_s)
    try:
        answers = ask_sentinels(url, broker, timeout_s, stop_at_first=False, quorum=True)
        answer = next(a for a in answers if a.master is not None)
    except BrokerConfigError as exc:
        return {"mode": "sentinel", "master_name": broker.sentinel.master_name, "error": str(exc),
                "sentinels_configured": len(parse_sentinel_url(url).sentinels), "sentinels_answered": 0,
                "failover_possible": False}
    m = answer.master
    assert m is not None
    epoch = int(m.get("config-epoch", "0") or 0)
    replicas = [{"address": f"{r.get('ip')}:{r.get('port')}", "flags": r.get("flags", ""),
                 "link": r.get("master-link-status", "")} for r in answer.replicas]
    # config-epoch counts this master's failovers; Sentinel records the promotion as the time it
    # last saw the master's role change (role-reported-time, ms ago), which is also set when the
    # Sentinel started: with epoch 0 there has been no failover.
    since = int(m.get("role-reported-time", "0") or 0) / 1000.0
    return {"mode": "sentinel", "master_name": broker.sentinel.master_name, "sentinel": answer.sentinel,
            "master": f"{m.get('ip')}:{m.get('port')}", "master_flags": m.get("flags", ""),
            "replicas": replicas, "sentinels": 1 + int(m.get("num-other-sentinels", "0") or 0),
            "quorum": int(m.get("quorum", "0") or 0),
            "last_failover": {"epoch": epoch, "age_s": round(since, 1)} if epoch > 0 else None,
            **_quorum(url, answers)}


def _quorum(url: str, answers: list[SentinelAnswer]) -> dict[str, Any]:
    """How many of the configured Sentinels answered, and whether a failover can be authorised
    (any answering Sentinel's CKQUORUM says OK: a majority of the Sentinels it knows is reachable)."""
    replies = [a.ckquorum for a in answers if a.ckquorum is not None]
    ok = next((r for r in replies if r.startswith("OK")), None)
    return {"sentinels_configured": len(parse_sentinel_url(url).sentinels),
            "sentinels_answered": sum(1 for a in answers if a.master is not None),
            "failover_possible": ok is not None, "quorum_detail": ok or (replies[0] if replies else "no answer")}


def _quorum_of(url: str, broker: BrokerConfig, timeout_s: float) -> dict[str, Any]:
    q = _quorum(url, ask_sentinels(url, broker, timeout_s, stop_at_first=False, quorum=True))
    return {"failover_possible": q["failover_possible"],
            "detail": f"{q['sentinels_answered']} of {q['sentinels_configured']} Sentinels answer; {q['quorum_detail']}"}


def _describe_plain(url: str, timeout_s: float) -> dict[str, Any]:
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        info = client.info("replication")
    except (redis.RedisError, OSError) as exc:
        return {"mode": "standalone", "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    finally:
        client.close()
    replicas = [{"address": f"{v.get('ip')}:{v.get('port')}", "flags": "slave", "link": str(v.get("state", ""))}
                for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return {"mode": "standalone", "role": info.get("role"), "replicas": replicas, "last_failover": None}
