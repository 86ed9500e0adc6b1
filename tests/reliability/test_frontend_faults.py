"""A frontend unreachable or answering garbage while retune actuates a decision: that frontend is
reported not converged (with the reason), the others are still updated, and the next round (the
next tick) converges it once it answers again. Real Redis, the loopback API server, real loopback
frontends over HTTP; tests/retune/test_router.py covers the client's one-line errors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from powerfleet.clock import FakeClock
from powerfleet.retune import control
from powerfleet.retune.context import Deployment
from powerfleet.testing.retune_world import START_POLICY, frontend_pod
from powerfleet.twin.serving.frontend import LoopbackFrontend
from tests.retune.conftest import make_ports, retune_config

pytestmark = pytest.mark.integration
T0 = 1_800_000_000.0
DECIDED = {"overlap_score_credit": 1.0, "overlap_score_credit_decay": 0.0, "prefill_load_scale": 4.0,
           "temperature": 0.0, "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.25,
           "shared_cache_multiplier": 0.0, "decode_active_request_weight": 0.0}


class _Garbage(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"revision": "seven", "policy": [NaN'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_PATCH = do_GET


@pytest.fixture
def garbage_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_dead_or_garbage_frontend_is_not_converged_the_others_are_updated_and_it_is_retried(
        world, kube, redis_url, garbage_url) -> None:
    fes = world.add_deployment("llama", pods=3)
    ok_pod, dead_pod, garbage_pod = sorted(fes)
    cfg = retune_config(world, ["llama"])
    clock = FakeClock(T0, 1.0)
    ports = make_ports(redis_url, kube, "ctl@frontends", clock)
    ports.r.flushall()
    assert control.tick_deployment(cfg, ports, "llama", T0)["status"] == "leader"
    dep = Deployment.open(cfg, ports, "llama")
    term, _, _ = dep.leadership.claim()
    assert term is not None
    dep.store.update(term, lambda s: s.model_copy(update={"desired": dict(DECIDED), "desired_window": 1}))

    dead_port = int(fes[dead_pod].url.rsplit(":", 1)[1])
    fes[dead_pod].stop()
    world.api.apply(frontend_pod("llama", garbage_pod, garbage_url))
    clock.advance(10)
    row = control.tick_deployment(cfg, ports, "llama", clock.now())
    by_pod = {r["pod"]: r for r in row["routers"]}
    assert by_pod[ok_pod]["converged"] and fes[ok_pod].policy.temperature == 0.0
    for pod in (dead_pod, garbage_pod):
        assert not by_pod[pod]["converged"] and by_pod[pod]["error"], by_pod[pod]
        assert "\n" not in by_pod[pod]["error"]  # one line, no traceback
    assert fes[garbage_pod].policy.temperature == START_POLICY["temperature"]  # untouched by the round

    # Both answer again: the next round converges them, without touching the one already there.
    back = LoopbackFrontend(START_POLICY, port=dead_port).start()
    try:
        world.api.apply(frontend_pod("llama", garbage_pod, fes[garbage_pod].url))
        writes_on_ok = len(fes[ok_pod].writes)
        clock.advance(10)
        healed = control.tick_deployment(cfg, ports, "llama", clock.now())
        assert all(r["converged"] for r in healed["routers"]), healed["routers"]
        assert back.policy.temperature == 0.0 and fes[garbage_pod].policy.temperature == 0.0
        assert len(fes[ok_pod].writes) == writes_on_ok
    finally:
        back.stop()
