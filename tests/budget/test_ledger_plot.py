"""The demo report's ledger plot (issue 18 item 9): each budget tick records its groups' figures;
the report plots projected, measured and limit per rack from them."""

from __future__ import annotations

import json

import redis
from PIL import Image

from powerfleet.budget.state import GROUP_HISTORY, GROUP_HISTORY_LEN, BudgetState
from powerfleet.twin.demo.ledger_plot import LEDGER_DATA, LEDGER_IMAGE, ledger_series, plot_ledger
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


def test_ticks_record_group_figures_in_a_bounded_history(broker_url):  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    state = BudgetState(r)
    state.record_groups(10.0, {"rack-a": {"limit_w": 5000, "projected_w": 4200, "peak_w": 4800, "measured_w": None}})
    r.rpush(GROUP_HISTORY, "not json")
    state.record_groups(40.0, {"rack-a": {"limit_w": 5000, "projected_w": 4600, "peak_w": 4900, "measured_w": 3100.5}})
    got = state.group_history()
    assert [e["at"] for e in got] == [10.0, 40.0] and got[1]["groups"]["rack-a"]["measured_w"] == 3100.5
    for i in range(GROUP_HISTORY_LEN + 5):
        state.record_groups(100.0 + i, {})
    assert r.llen(GROUP_HISTORY) == GROUP_HISTORY_LEN


def test_the_plot_shows_projected_measured_and_limit_per_rack(tmp_path):
    history = [{"at": 1000.0 + 30 * i, "groups": {
        "rack-a": {"limit_w": 5000, "projected_w": 4000 + 100 * i, "measured_w": None if i == 0 else 3000.0 + i},
        "rack-b": {"limit_w": 6000, "projected_w": 5000, "measured_w": 4100.0}}} for i in range(4)]
    series = ledger_series(list(reversed(history)), 1000.0)  # time order, whatever the input's
    assert series["rack-a"]["t"] == [0.0, 30.0, 60.0, 90.0]
    assert series["rack-a"]["projected_w"] == [4000, 4100, 4200, 4300]
    assert series["rack-a"]["measured_w"] == [None, 3001.0, 3002.0, 3003.0]
    assert series["rack-b"]["limit_w"] == [6000] * 4
    assert plot_ledger(tmp_path, history, 1000.0) == LEDGER_IMAGE
    with Image.open(tmp_path / LEDGER_IMAGE) as img:
        img.verify()
        assert img.size[0] >= 600
    assert json.loads((tmp_path / LEDGER_DATA).read_text())["rack-a"]["projected_w"] == [4000, 4100, 4200, 4300]
    assert plot_ledger(tmp_path, [], 0.0) == LEDGER_IMAGE  # no tick recorded: a plot that says so
