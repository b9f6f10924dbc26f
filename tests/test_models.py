"""The trained agents committed in models/: small enough, loadable weights-only, and better than random play."""

import json
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
           "pong_v3_shared.pt": 5.0, "pong_v3_independent.pt": 10.0}


def test_the_repository_ships_trained_models_each_with_a_margin():
    assert MODELS, "models/ holds no model"
    assert {m.name for m in MODELS} == set(MARGINS), "every committed model needs its margin here"


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_model_is_a_weights_only_export_under_the_size_limit(model):
    assert model.stat().st_size <= LIMIT
    state = safe_load(model, kind=AGENTS_KIND)  # weights_only, checksums, layout: what `madqn eval` reads
    assert not {"optimizer", "replay"} & set(state)
    assert all(set(group) == {"agents", "n_actions", "online"} for group in state["groups"].values())  # no target net


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
