"""FleetConfig loading: defaults, file, environment; every failure is one ConfigError with the key."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.config import ConfigError, FleetConfig, load_config


def test_defaults_match_the_documented_intervals() -> None:
    cfg = load_config(environ={})
    assert (cfg.beat.reconcile_interval_s, cfg.beat.budget_interval_s, cfg.beat.retune_interval_s) == (15, 30, 10)
    assert cfg.broker.url is None  # embedded broker
    assert cfg.metrics.port == 0


def test_environment_overrides_the_file(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("beat:\n  reconcile_interval_s: 7\n  budget_interval_s: 8\nnodes: [a]\n")
    cfg = load_config(f, environ={"POWERFLEET_BEAT__BUDGET_INTERVAL_S": "9", "POWERFLEET_NODES": "[x, y]"})
    assert cfg.beat.reconcile_interval_s == 7
    assert cfg.beat.budget_interval_s == 9
    assert cfg.nodes == ["x", "y"]


def test_a_bare_off_for_enforcement_evidence_means_off_not_false(tmp_path) -> None:
    # YAML 1.1 reads `off` as false; the operator meant the mode named off.
    f = tmp_path / "c.yaml"
    f.write_text("budget:\n  enforcement_evidence: off\n")
    assert load_config(f, environ={}).budget.enforcement_evidence == "off"
    env = {"POWERFLEET_BUDGET__ENFORCEMENT_EVIDENCE": "off"}
    assert load_config(environ=env).budget.enforcement_evidence == "off"
    with pytest.raises(ConfigError, match="enforcement_evidence"):
        load_config(environ={"POWERFLEET_BUDGET__ENFORCEMENT_EVIDENCE": "on"})
    # ...while a boolean field still takes YAML 1.1's words for true and false.
    g = tmp_path / "g.yaml"
    g.write_text("flower:\n  allow_worker_control: yes\n")
    assert load_config(g, environ={}).flower.allow_worker_control is True
    env = {"POWERFLEET_FLOWER__ALLOW_WORKER_CONTROL": "on", "POWERFLEET_BUDGET__ENFORCEMENT_EVIDENCE": "off"}
    cfg = load_config(environ=env)
    assert cfg.flower.allow_worker_control is True and cfg.budget.enforcement_evidence == "off"


def test_config_file_named_by_environment(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("prefetch_multiplier: 3\n")
    assert load_config(environ={"POWERFLEET_CONFIG": str(f)}).prefetch_multiplier == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POWERFLEET_BROKER__URL": "amqp://x"}, "POWERFLEET_BROKER__URL: broker.url: Value error, must be a redis://"),
        ({"POWERFLEET_FLOWER__BASIC_AUTH": "[nocolon]"}, "flower.basic_auth: Value error, each entry must be"),
        ({"POWERFLEET_NODES": "[a, a]"}, "nodes: Value error, node names must be unique"),
        ({"POWERFLEET_RETUNE__WINDOW_PHASE_S": "400"}, "retune: Value error, window_phase_s must be less"),
        ({"POWERFLEET_BEAT__LOCK_TIMEOUT_S": "5", "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "5"}, "lock_timeout_s must be greater"),
        ({"POWERFLEET_NOPE": "1"}, "nope: unknown key"),
        ({"POWERFLEET_LIMITS__SWEEP__SOFT_S": "3000", "POWERFLEET_LIMITS__SWEEP__HARD_S": "4000"},
         "broker.visibility_timeout_s (3600) must exceed the longest hard time limit (limits.sweep.hard_s = 4000)"),
    ],
)
def test_bad_values_name_their_key(env, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ=env)
    assert message in str(err.value)


yaml_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_file_text_gives_a_config_or_a_config_error(tmp_path_factory, text) -> None:
    f = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    f.write_text(text)
    try:
        load_config(f, environ={})
    except ConfigError as exc:
        assert str(f) in str(exc)


def _one_line_error_naming(exc: ConfigError, source: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    assert text.startswith(source), (source, text)


@settings(max_examples=200, deadline=None)
@given(tree=st.dictionaries(st.sampled_from(["beat", "broker", "flower", "nodes", "limits", "retune", "x"]),
                            yaml_ish, max_size=4))
def test_arbitrary_structures_give_a_config_or_a_config_error(tmp_path_factory, tree) -> None:
    import yaml

    f = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    f.write_text(yaml.safe_dump(tree))
    try:
        cfg = load_config(f, environ={})
    except ConfigError as exc:
        _one_line_error_naming(exc, str(f))
        return
    # Accepted: what was asked for is what was loaded, and it survives a round trip.
    assert "x" not in tree
    assert FleetConfig.model_validate(cfg.model_dump()) == cfg
    if isinstance(tree.get("nodes"), list):
        assert cfg.nodes == tree["nodes"]
    assert cfg.broker.visibility_timeout_s > max(cfg.limits.control.hard_s, cfg.limits.sweep.hard_s,
                                                 cfg.limits.node.hard_s)


@settings(max_examples=200, deadline=None)
@given(key=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=30), value=st.text(max_size=40))
def test_arbitrary_environment_gives_a_config_or_a_config_error(key, value) -> None:
    try:
        cfg = load_config(environ={f"POWERFLEET_{key}": value})
    except ConfigError as exc:
        text = str(exc)
        assert "\n" not in text and ("POWERFLEET_" in text or text.startswith("defaults")), text
        return
    # Accepted: the variable named a real key (every unknown key is refused).
    node: object = cfg
    for part in key.lower().split("__"):
        assert hasattr(node, part), key
        node = getattr(node, part)


def test_visibility_timeout_equal_to_a_hard_limit_is_refused() -> None:
    # Equal is not enough: Redis would redeliver a task at the very moment it may still run.
    with pytest.raises(ConfigError, match="must exceed the longest hard time limit"):
        load_config(environ={"POWERFLEET_BROKER__VISIBILITY_TIMEOUT_S": "660"})
    assert load_config(environ={"POWERFLEET_BROKER__VISIBILITY_TIMEOUT_S": "661"}).broker.visibility_timeout_s == 661
