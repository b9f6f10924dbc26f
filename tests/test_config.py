from pathlib import Path

import pytest

from madqn.config import FIELD_NAMES, Config, load_toml, make_config, parse_overrides
from madqn.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_are_dqn3():
    c = Config()
    assert (c.hist_len, c.replay_memory, c.learn_start, c.update_freq, c.n_replay, c.minibatch_size) == (
        4, 1_000_000, 50_000, 4, 1, 32)
    assert (c.discount, c.target_q, c.lr, c.wc, c.ep_start, c.ep_end, c.ep_endt) == (
        0.99, 10_000, 0.00025, 0.0, 1.0, 0.1, 1_000_000)
    assert (c.clip_delta, c.rescale_r, c.min_reward, c.max_reward, c.valid_size) == (1.0, True, -1.0, 1.0, 500)
    assert (c.action_repeat, c.random_starts, c.steps, c.eval_freq, c.eval_steps) == (
        4, 30, 50_000_000, 250_000, 125_000)
    assert (c.prog_freq, c.save_freq, c.seed, c.eval_ep, c.sticky_actions) == (10_000, 125_000, 1, 0.05, 0.0)


def test_dqn3_toml_holds_every_default_and_documents_units():
    d = load_toml(CONFIGS / "dqn3.toml")
    assert set(d) == set(FIELD_NAMES)
    assert Config(**d) == Config()
    text = (CONFIGS / "dqn3.toml").read_text()
    assert "[agent steps]" in text and "[transitions]" in text


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.toml")))
def test_shipped_configs_load(name):
    make_config(CONFIGS / name)


def test_dopamine_preset_has_dopamines_published_dqn_settings():
    """configs/pong_single_dopamine.toml against dopamine/agents/dqn/configs/dqn.gin (Runner.sticky_actions,
    WrappedReplayBuffer, DQNAgent.*, tf.train.RMSPropOptimizer.*) with the eps conversion the learner test
    checks: eps 1e-5 on the mean loss of 32 = 1e-5 * 32^2 on madqn's summed gradient."""
    c = make_config(CONFIGS / "pong_single_dopamine.toml")
    dopamine = dict(sticky_actions=0.25, max_cycles=27_000, replay_memory=1_000_000, minibatch_size=32,
                    discount=0.99, n_step=1, learn_start=20_000, update_freq=4, target_q=8_000, ep_start=1.0,
                    ep_end=0.01, ep_endt=250_000, optimizer="rmsprop", lr=0.00025, lr_end=0.00025,
                    rmsprop_decay=0.95, clip_delta=1.0, double=False, dueling=False, prioritized=False,
                    hist_len=4, action_repeat=4, random_starts=0, terminal_on_life_loss=False,
                    full_action_space=False, precision="fp32")
    assert {k: getattr(c, k) for k in dopamine} == dopamine
    assert c.rmsprop_eps == pytest.approx(1e-5 * 32**2)


def test_resolved_toml_round_trips(tmp_path):
    c = make_config(None, {"sharing": "shared", "steps": 123, "mlp_hidden": [8, 4], "lr": 1e-3})
    p = tmp_path / "c.toml"
    p.write_text(c.to_toml())
    assert make_config(p) == c


def test_unknown_key_in_file_is_named_with_suggestion(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("lerning_rate = 0.1\nlearn_strt = 5\n")
    with pytest.raises(ConfigError, match="unknown config key 'lerning_rate'"):
        make_config(p)
    p.write_text("learn_strt = 5\n")
    with pytest.raises(ConfigError, match="did you mean 'learn_start'"):
        make_config(p)


@pytest.mark.parametrize("override, message", [
    ("steps=-5", "'steps' must be >= 1"),
    ("ep_end=1.5", "'ep_end' must be <= 1"),
    ("discount=-0.1", "'discount' must be >= 0"),
    ("steps=ten", "'steps' must be an integer"),
    ("sharing=both", "'sharing' must be one of shared, independent"),
    ("replay_memory=10", "'replay_memory' (10) must be at least hist_len + minibatch_size (36)"),
    ("rescale_r=1", "'rescale_r' must be true or false"),
    ("device=tpu", "'device' must be auto, cpu, cuda"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        make_config(None, parse_overrides([override]))
    assert message in str(e.value)


def test_overrides_parse_toml_values():
    d = parse_overrides(["steps=1_000", "lr=1e-4", "sharing=shared", "rescale_r=false", "mlp_hidden=[64]"])
    assert d == {"steps": 1000, "lr": 1e-4, "sharing": "shared", "rescale_r": False, "mlp_hidden": [64]}
    assert make_config(None, {"lr": 1}).lr == 1.0  # an integer is accepted for a float key
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])
    with pytest.raises(ConfigError, match="unknown config key 'stepz'"):
        parse_overrides(["stepz=3"])


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        make_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        make_config(bad)
