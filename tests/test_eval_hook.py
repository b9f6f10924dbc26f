"""Periodic evaluation during training and DQN3.0's validation statistics."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from madqn.training.checkpoint import safe_load
from madqn.config import make_config
from madqn.core.networks import DQN3ConvNet
from madqn.evaluation.eval_hook import draw_validation_set, network_health, q_state_spread, validation_statistics
from madqn.training.trainer import Trainer
from helpers import read_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"


def test_validation_statistics_match_a_per_sample_computation():
    """V = mean max_a Q_target(s2, a), TD error = mean |clip(r + gamma (1 - term) V(s2) - Q(s, a))|, one sample at a time."""
    cfg = make_config(SMOKE, {"steps": 200, "sharing": "shared", "seed": 5, "num_threads": 1})
    with Trainer(cfg) as trainer:
        trainer.run()
        g = trainer.groups[0]
        g.learner.sync_target()
        with torch.no_grad():  # make online and target differ, so that using the wrong one shows
            for p in g.learner.online_network.parameters():
                p.add_(0.01 * torch.randn_like(p))
        sampler_state = g.replay.rng.bit_generator.state
        valid = draw_validation_set(g, 40, np.random.default_rng(0), trainer.device)
        assert g.replay.rng.bit_generator.state == sampler_state  # the training sampler is untouched
        v, td = validation_statistics(g.learner, valid, chunk=16)
        q2s, deltas = [], []
        with torch.no_grad():
            for i in range(len(valid)):
                ids = valid.agent_ids[i:i + 1]
                q = g.learner.online_network(valid.states[i:i + 1], ids)[0, valid.actions[i]].item()
                q2 = g.learner.target_network(valid.next_states[i:i + 1], ids).max().item()
                y = valid.rewards[i].item() + cfg.discount * (1 - valid.terminals[i].item()) * q2
                q2s.append(q2)
                deltas.append(abs(min(max(y - q, -cfg.clip_delta), cfg.clip_delta)))
        assert v == pytest.approx(np.mean(q2s), rel=1e-5)
        assert td == pytest.approx(np.mean(deltas), rel=1e-5)
        # the same generator seed draws the same held-out set
        again = draw_validation_set(g, 40, np.random.default_rng(0), trainer.device)
        assert torch.equal(again.states, valid.states) and torch.equal(again.actions, valid.actions)


@pytest.mark.parametrize("double, precision", [(True, "fp32"), (False, "bf16"), (True, "bf16")])
def test_validation_td_error_and_v_equal_the_learners_own_on_the_same_batch(double, precision):
    """valid.csv's TD error and V are the learner's: Double DQN's bootstrap and the learner's precision, the
    same computation ``Learner.update`` makes (its delta and q2_max, before its optimizer step)."""
    from madqn.core.learner import Learner
    from madqn.evaluation.eval_hook import ValidationSet
    from helpers import random_batch

    torch.manual_seed(3)
    learner = Learner(DQN3ConvNet(6, 4, n_agents=2), lr=2.5e-4, lr_end=2.5e-4, lr_endt=1, learn_start=0,
                      discount=0.99, clip_delta=1.0, rescale_r=True, r_max=1.0, weight_cost=0.0, device="cpu",
                      double=double, precision=precision)
    with torch.no_grad():  # online and target differ, so that Double DQN's bootstrap differs from DQN's
        for p in learner.online_network.parameters():
            p.add_(0.05 * torch.randn_like(p))
    states, actions, rewards, next_states, terminals, ids = random_batch(7, batch=32)
    valid = ValidationSet(states, actions, rewards, next_states, terminals, ids, None)
    v, td = validation_statistics(learner, valid, chunk=32)
    stats = learner.update(states, actions, rewards, next_states, terminals, agent_ids=ids)
    assert td == pytest.approx(stats["delta"].abs().double().mean().item(), rel=1e-6)
    assert v == pytest.approx(stats["q2_max"].item(), rel=1e-6)
    assert 0 < (stats["delta"].abs() < 1).sum() < 32  # unclipped rows carry the bootstrap value


def test_unit_activity_and_q_spread_match_a_direct_computation_and_see_a_dead_layer():
    """DQN3ConvNet.unit_activity against the layers applied one by one; a dead conv3 gives activity 0 there and a
    Q spread of exactly 0 across states (network_health), a live network neither."""
    torch.manual_seed(0)
    net = DQN3ConvNet(6, hist_len=4, n_agents=2)
    frames = torch.randint(0, 256, (24, 4, 84, 84), dtype=torch.uint8)
    ids = torch.arange(24) % 2
    planes = torch.zeros(24, 2, 84, 84)
    planes[torch.arange(24), ids] = 1.0  # the agent indicator as the concatenated one-hot planes it stands for
    with torch.no_grad():
        h = torch.relu(net.conv1(torch.cat([frames.float() / 255, planes], dim=1)))
        expected = {}
        for name, layer in (("conv1", None), ("conv2", net.conv2), ("conv3", net.conv3), ("fc", net.fc)):
            h = h if layer is None else torch.relu(layer(h.flatten(1) if name == "fc" else h))
            units = h.reshape(24, h.shape[1], -1)
            expected[name] = float(sum(bool((units[:, k] > 0).any()) for k in range(h.shape[1]))) / h.shape[1]
    assert net.unit_activity(frames, ids) == pytest.approx(expected, abs=1e-9)
    assert all(0 < a <= 1 for a in expected.values())

    class Held:  # what network_health reads of a learner and a validation set
        online_network, uses_agent_ids = net, True

    valid = type("Valid", (), {"states": frames, "agent_ids": ids, "__len__": lambda self: 24})()
    spread, active = network_health(Held(), valid, chunk=10)
    assert spread > 0 and active == pytest.approx(expected, abs=1e-9)
    with torch.no_grad():
        net.conv3.bias.fill_(-1e3)
    spread, active = network_health(Held(), valid, chunk=10)
    assert active["conv3"] == 0.0 and active["conv2"] == pytest.approx(expected["conv2"]) and spread == 0.0


def test_q_spread_of_a_shared_network_is_taken_within_each_agents_states():
    """A shared network whose Q depends on the agent id but not on the frames has no spread across states
    (the agents' value gap is not a response to the frames); within-agent spreads average by row count."""
    q = torch.tensor([[0.0, 1.0], [0.0, 1.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0]], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 1])
    assert q_state_spread(q, ids) == 0.0
    assert q_state_spread(q, None) == pytest.approx(float(q.std(dim=0).mean()))
    q2 = torch.tensor([[0.0], [2.0], [10.0], [10.0], [13.0]], dtype=torch.float64)
    within0, within1 = float(torch.tensor([0.0, 2.0]).std()), float(torch.tensor([10.0, 10.0, 13.0]).std())
    assert q_state_spread(q2, ids) == pytest.approx((2 * within0 + 3 * within1) / 5)
    assert math.isnan(q_state_spread(q2[:1], ids[:1]))


def test_a_dead_network_is_reported_in_valid_csv_and_by_a_warning(tmp_path, capsys):
    import madqn
    import madqn.training.trainer

    class KillConv3(madqn.training.trainer.Hook):
        def on_start(self, trainer):
            with torch.no_grad():
                trainer.groups[0].learner.online_network.conv3.bias.fill_(-1e3)

    madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "run", steps=120, learn_start=40, sharing="shared",
                num_threads=1, seed=3, max_cycles=40, eval_freq=60, eval_steps=40, valid_size=20,
                final_eval_episodes=0, hooks=[KillConv3()])
    rows = read_csv(tmp_path / "run" / "valid.csv")
    assert [(int(r["step"]), float(r["q_state_std"]), float(r["min_active"])) for r in rows] == [(60, 0.0, 0.0),
                                                                                              (120, 0.0, 0.0)]
    assert "learner shared: no unit of conv3 is active on any of the 20 validation states" in capsys.readouterr().out


def test_csv_files_of_an_earlier_version_gain_the_new_columns(tmp_path):
    from madqn.training.metrics import CsvWriter

    path = tmp_path / "valid.csv"
    path.write_text("step,learner,V\n10,shared,0.5\n")
    writer = CsvWriter(path, ["step", "learner", "V", "q_state_std"])
    writer.write({"step": 20, "learner": "shared", "V": 0.6, "q_state_std": 0.01})
    writer.close()
    assert path.read_text().splitlines() == ["step,learner,V,q_state_std", "10,shared,0.5", "20,shared,0.6,0.01"]
    CsvWriter(path, ["step", "learner", "V", "q_state_std"]).close()  # already current: left as it is
    assert path.read_text().splitlines()[0] == "step,learner,V,q_state_std"


def run_with(tmp_path, name, **overrides):
    import madqn

    result = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / name, steps=200, learn_start=60, sharing="independent",
                         num_threads=1, seed=4, max_cycles=80, **overrides)
    state = torch.load(result.checkpoint, weights_only=True)
    return result, state


def test_evaluating_does_not_change_training(tmp_path):
    """The same seed with and without periodic evaluation (and validation): same actions, same weights."""
    _, plain = run_with(tmp_path, "plain", eval_freq=0, final_eval_episodes=0)
    result, evaluated = run_with(tmp_path, "eval", eval_freq=50, eval_steps=60, valid_size=20,
                                 final_eval_episodes=0)
    for name in plain["groups"]:
        for key, value in plain["groups"][name]["learner"]["online"].items():
            assert torch.equal(value, evaluated["groups"][name]["learner"]["online"][key]), (name, key)
    assert torch.equal(plain["rng"]["numpy"], evaluated["rng"]["numpy"])
    episodes = [[(r["step"], r["agent"], r["score"], r["length"]) for r in read_csv(tmp_path / name / "episodes.csv")]
                for name in ("plain", "eval")]
    assert episodes[0] == episodes[1] and len(episodes[0]) == 4  # 200 steps, 80-step episodes
    evals = read_csv(tmp_path / "eval" / "eval.csv")
    # 60 steps split between 2 seats: 30 each, 80-step episodes: none completes -> no score, no best
    assert [(int(r["step"]), r["seat"], int(r["episodes"])) for r in evals] == [
        (s, seat, 0) for s in (50, 100, 150, 200) for seat in ("first_0", "second_0")]
    valid = read_csv(tmp_path / "eval" / "valid.csv")
    assert [(int(r["step"]), r["learner"]) for r in valid] == [(s, a) for s in (100, 150, 200)
                                                             for a in ("first_0", "second_0")]
    assert not (tmp_path / "eval" / "checkpoints" / "best.pt").exists()


def test_best_checkpoint_and_resume(tmp_path):
    """Complete episodes: best.pt holds the best evaluation; a resumed run drops rows after its checkpoint
    and keeps the best score found before."""
    import madqn
    import madqn.training.trainer

    kw = dict(steps=160, learn_start=40, sharing="shared", num_threads=1, seed=2, max_cycles=20, eval_freq=40,
              eval_steps=80, valid_size=10, final_eval_episodes=0, save_freq=80)
    madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "run", **kw)
    evals = read_csv(tmp_path / "run" / "eval.csv")
    scores = {}
    for r in evals:
        assert int(r["episodes"]) == 2  # 40 steps per seat, 20-step episodes
        scores.setdefault(int(r["step"]), []).append(float(r["mean"]))
    assert sorted(scores) == [40, 80, 120, 160]
    best = safe_load(tmp_path / "run" / "checkpoints" / "best.pt")["best"]
    top = max(np.mean(v) for v in scores.values())
    assert best["score"] == pytest.approx(top)
    assert best["step"] == min(s for s, v in scores.items() if np.mean(v) == top)
    # a crash after step 80's checkpoint: latest.pt is back at step 80 while eval.csv goes on to 160
    import shutil

    class KeepCheckpoint(madqn.training.trainer.Hook):
        def on_step(self, trainer):
            if trainer.step == 80:
                shutil.copy(tmp_path / "run2" / "checkpoints" / "latest.pt", tmp_path / "step80.pt")

    madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "run2", hooks=[KeepCheckpoint()], **kw)
    before = read_csv(tmp_path / "run2" / "eval.csv")
    old_best = safe_load(tmp_path / "run2" / "checkpoints" / "best.pt")["best"]
    shutil.copy(tmp_path / "step80.pt", tmp_path / "run2" / "checkpoints" / "latest.pt")
    madqn.train("pong_v3", resume=tmp_path / "run2")
    again = read_csv(tmp_path / "run2" / "eval.csv")
    assert [int(r["step"]) for r in again] == [40, 40, 80, 80, 120, 120, 160, 160]  # no duplicated rows
    assert again[:4] == before[:4]  # the rows up to the checkpoint are kept as they were
    new_scores = {}
    for r in again[4:]:
        new_scores.setdefault(int(r["step"]), []).append(float(r["mean"]))
    best = safe_load(tmp_path / "run2" / "checkpoints" / "best.pt")["best"]
    assert best["score"] == pytest.approx(max([old_best["score"]] + [np.mean(v) for v in new_scores.values()]))
    steps = [int(r["step"]) for r in read_csv(tmp_path / "run2" / "eval_episodes.csv")]
    assert steps == sorted(steps) and steps.count(80) == 2 * 2 * 2  # 2 settings x 2 episodes x 2 seats


