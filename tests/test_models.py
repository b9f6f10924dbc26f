"""The trained agents committed in models/: small enough, loadable weights-only, and better than random play."""

import json
import re
import tomllib
from pathlib import Path

import pytest

from helpers import run_madqn  # noqa: E402
from madqn.training.checkpoint import AGENTS_KIND, safe_load

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT / "models").glob("*.pt"))
LIMIT = 15_000_000  # bytes: the largest model file the repository accepts

# per model: points per game by which its mean score must exceed the random player's on the same episodes, in
# every seat, or per seat where a model beats random players in some seats only (as the README's table says)
MARGINS = {"boxing_v2_independent.pt": 20.0, "boxing_v2_shared.pt": {"second_0": 30.0}, "pong_single.pt": 5.0,
           "pong_v3_shared.pt": 5.0, "pong_v3_independent.pt": 10.0,
           "pong_v3_shared_efficient.pt": 5.0, "pong_v3_independent_efficient.pt": 10.0}
# where and how a preset runs (processes, threads, compiled kernels), not what it learns: the pong presets gained
# their two-core settings after the committed models were trained with the same learning settings in one process
EXECUTION_KEYS = {"backend", "actors", "rollout_len", "sync_every", "max_in_flight", "compile", "overlap", "vector_env"}


def readme_models() -> dict[str, dict[str, str]]:
    """The README's table of trained agents: file name -> game, description, config file, seed, agent steps."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\| `models/(\S+\.pt)` \| ([^,|]+)(, [^|]*)? \| `(configs/\S+\.toml)`, seed (\d+)[^|]*\| ([\d,]+) \([^|]*\| ([\d,]+) \|", line)
        if m:
            name, game, description, config, seed, steps, updates = m.groups()
            rows[name] = {"game": game, "description": description or "", "config": config, "seed": int(seed),
                          "steps": int(steps.replace(",", "")), "updates": int(updates.replace(",", ""))}
    return rows


def test_the_models_are_what_the_readme_table_says():
    """Each models/*.pt loaded as madqn loads it: the README table's game, network sharing, config file, seed and
    agent steps, and agents and action counts that fit the real env (one row per file, a margin per file)."""
    from madqn.api import RESUME_SAFE_KEYS
    from madqn.envs.adapters import make_env
    from madqn.evaluation.agents import load_agents, load_checkpoint

    table = readme_models()
    assert MODELS and set(table) == {m.name for m in MODELS} == set(MARGINS)
    for model in MODELS:
        row = table[model.name]
        state, config = load_checkpoint(model)
        agents = load_agents(model)
        assert config.env == row["game"] and config.seed == row["seed"] and state["step"] == row["steps"], model.name
        trained_with = tomllib.loads((ROOT / row["config"]).read_text())
        ignored = set(RESUME_SAFE_KEYS) | EXECUTION_KEYS
        assert {k: v for k, v in trained_with.items() if k not in ignored} == \
            {k: getattr(config, k) for k in trained_with if k not in ignored}, model.name
        shared = "one shared network" in row["description"]
        assert config.sharing == ("shared" if shared else "independent"), model.name
        networks = {id(n) for n in agents.networks.values()}
        assert len(networks) == (1 if shared else len(agents.possible_agents)), model.name
        if "one network per" in row["description"]:
            assert len(agents.possible_agents) >= 2
        env = make_env(config.env, config, convert=False)
        try:
            agents.check_env(env, source=model.name)  # the env's agents and each one's action count
        finally:
            env.close()
        assert all(n == env.action_space(a).n for a, n in agents.n_actions.items())


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_model_is_a_weights_only_export_under_the_size_limit(model):
    assert model.stat().st_size <= LIMIT
    state = safe_load(model, kind=AGENTS_KIND)  # weights_only, checksums, layout: what `madqn eval` reads
    assert not {"optimizer", "replay"} & set(state)
    assert all(set(group) == {"agents", "n_actions", "online", "updates"} for group in state["groups"].values())  # no target net
    # the updates each network took, as the README's table states them
    assert {g["updates"] for g in state["groups"].values()} == {readme_models()[model.name]["updates"]}, model.name


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_model_beats_random_play_evaluated_as_a_user_would(model, tmp_path):
    """`madqn eval models/X.pt --opponent random`, as the README prints it, on 3 episodes per seat: the model's
    mean score beats the random player's on the same episode seeds by the model's margin in each seat it has one
    for (every seat where the margin is one number)."""
    out = tmp_path / "eval.csv"
    result = run_madqn("eval", model, "--opponent", "random", "--episodes", 3, "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = json.loads(out.with_suffix(".json").read_text())["lines"]
    trained = {line["seat"]: line["mean"] for line in lines if line["player"] != "random"}
    baseline = {line["seat"]: line["mean"] for line in lines if line["player"] == "random"}
    assert trained and set(trained) == set(baseline)
    margins = MARGINS[model.name]
    margins = margins if isinstance(margins, dict) else dict.fromkeys(trained, margins)
    assert set(margins) <= set(trained), (set(margins), set(trained))
    for seat, margin in margins.items():
        assert trained[seat] >= baseline[seat] + margin, (seat, trained[seat], baseline[seat])
