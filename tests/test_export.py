"""madqn export: a weights-only file that plays exactly like the checkpoint it came from."""

import json

import pytest
import torch

import madqn
from madqn.training.checkpoint import AGENTS_KIND, safe_load
from madqn.cli import main
from madqn.errors import CheckpointError
from madqn.cli.export import export_agents
from helpers import SMOKE, play_side_by_side, read_csv, run_madqn

LIMIT = 15_000_000  # bytes: the largest export the repository accepts for a pong_v3 model
DQN3_PONG_WEIGHTS = 1_687_206  # convnet_atari3 with 6 actions (dqn3-reference.md section 1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny pong_v3 runs with real updates: shared and independent."""
    root = tmp_path_factory.mktemp("export")
    return {sharing: madqn.train("pong_v3", SMOKE, run_dir=root / sharing, steps=120, learn_start=40,
                                 sharing=sharing, final_eval_episodes=0).run_dir
            for sharing in ("shared", "independent")}


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_export_round_trip_plays_identically_and_holds_only_the_online_networks(runs, tmp_path, sharing):
    run_dir = runs[sharing]
    out = tmp_path / "model.pt"
    result = export_agents(run_dir, out)
    checkpoint = safe_load(run_dir / "checkpoints" / "latest.pt")

    exported = safe_load(out, kind=AGENTS_KIND)
    assert set(exported) == {"format_version", "kind", "config", "agents", "observation_specs", "action_starts",
                             "step", "groups"}
    assert exported["step"] == checkpoint["step"] == result.step == 120
    # the updates that trained each network: the run's own count, as its train.csv's last row states it
    last = {row["learner"]: int(row["updates"]) for row in read_csv(run_dir / "train.csv") if int(row["step"]) == 120}
    assert result.updates == {name: group["updates"] for name, group in exported["groups"].items()} == last
    assert all(n > 0 for n in last.values())
    assert exported["config"] == checkpoint["config"] and exported["agents"] == ["first_0", "second_0"]
    learners = {"shared"} if sharing == "shared" else {"first_0", "second_0"}
    assert set(exported["groups"]) == learners
    for name, group in exported["groups"].items():
        assert set(group) == {"agents", "n_actions", "online", "updates"}  # no target network, optimizer or replay
        online = checkpoint["groups"][name]["learner"]["online"]
        assert group["online"].keys() == online.keys()
        assert all(t.dtype == torch.float32 and torch.equal(t, online[k]) for k, t in group["online"].items())

    # size: the fp32 weights plus a little zip/pickle overhead, under the repository's limit
    indicator_weights = 2 * 32 * 8 * 8 if sharing == "shared" else 0  # conv1 sees 2 agent-id channels too
    weights = len(learners) * DQN3_PONG_WEIGHTS + indicator_weights
    assert result.parameters == weights
    assert result.size == out.stat().st_size
    assert 4 * weights < result.size < 4 * weights + 100_000
    assert result.size <= LIMIT

    before = madqn.load_agents(run_dir, seed=3)
    after = madqn.load_agents(out, seed=3)
    assert play_side_by_side(before, after) >= 100
    if sharing == "independent":  # the comparison can fail: two different networks give different Q-values
        probe = madqn.load_agents(out, seed=3)
        probe.networks["first_0"] = probe.networks["second_0"]
        with pytest.raises(AssertionError):
            play_side_by_side(before, probe, steps=5)


def test_export_cli_then_eval_and_video_load_the_file(runs, tmp_path, capsys):
    """The commands in-process (madqn.cli.main, what the madqn script runs), to spare three interpreter starts."""
    out = tmp_path / "models" / "pong_shared.pt"
    assert main(["export", str(runs["shared"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    updates = {row["learner"]: int(row["updates"]) for row in read_csv(runs["shared"] / "train.csv")}["shared"]
    assert f"wrote {out}: 6.8 MB" in printed and f"step 120, updates shared {updates:,}, from" in printed
    from madqn.commands import madqn_command  # the follow-up commands run as printed, also off PATH

    assert f"play it: {madqn_command('eval', out, '--opponent', 'random')}; {madqn_command('video', out)}" in printed
    assert main(["eval", str(out), "--opponent", "random", "--episodes", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"pong_v3: pong_shared (step 120, updates shared {updates:,}) vs random" in printed
    assert "random (baseline)" in printed
    assert json.loads((tmp_path / "models" / "evals" / "random-s0-n2.json").read_text())["updates"] == {"shared": updates}
    assert main(["video", str(out), "--out", str(tmp_path / "v.gif"), "--max-steps", "5"]) == 0
    assert (tmp_path / "v.gif").stat().st_size > 0
    with pytest.raises(CheckpointError, match="best.pt is written by periodic evaluation"):
        export_agents(runs["shared"], tmp_path / "b.pt", checkpoint="best")


def test_corrupt_or_foreign_export_is_one_line_and_exit_2(runs, tmp_path, capsys):
    good = tmp_path / "good.pt"
    export_agents(runs["shared"], good)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    flipped = tmp_path / "flipped.pt"
    middle = len(data) // 2
    flipped.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    text = tmp_path / "notes.pt"
    text.write_text("not a model\n")
    replay_like = tmp_path / "other_kind.pt"
    torch.save({**safe_load(good, kind=AGENTS_KIND), "kind": "madqn-replay"}, replay_like)
    missing_weights = tmp_path / "missing.pt"
    state = safe_load(good, kind=AGENTS_KIND)
    del state["observation_specs"]
    torch.save(state, missing_weights)

    cases = {truncated: "not a complete madqn checkpoint", flipped: "corrupt", text: "not a complete madqn checkpoint",
             replay_like: "'madqn-replay' file", missing_weights: "'observation_specs' is missing"}
    for bad, message in cases.items():
        with pytest.raises(CheckpointError, match=message):
            madqn.load_agents(bad)
    proc = run_madqn("eval", flipped, "--opponent", "random", cwd=tmp_path)  # the real exit status, once
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("madqn: error: ") and cases[flipped] in proc.stderr
    for bad, argv in [(truncated, ["video", str(truncated)]),
                      (replay_like, ["export", str(replay_like), "--out", str(tmp_path / "again.pt")]),
                      (missing_weights, ["eval", str(missing_weights)])]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("madqn: error: ") and err.count("\n") == 1 and cases[bad] in err, err
    assert not (tmp_path / "again.pt").exists()


def test_export_never_writes_over_its_source_or_an_existing_file_without_force(runs, tmp_path, capsys):
    """Issue 30 E1: ``--out`` naming the source (directly, through a symlink or a hard link) is refused even with
    ``--force``; any other existing file is refused without ``--force`` and replaced with it."""
    import os
    import shutil

    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(runs["shared"], tmp_path / "run")
    source = checkpoints / "latest.pt"
    original = source.read_bytes()
    link = tmp_path / "link.pt"
    link.symlink_to(source)
    hard = tmp_path / "hard.pt"
    os.link(source, hard)
    for argv in (["export", str(source), "--out", str(source)],
                 ["export", str(tmp_path / "run"), "--out", str(source), "--force"],
                 ["export", str(source), "--out", str(checkpoints / ".." / "checkpoints" / "latest.pt"), "--force"],
                 ["export", str(source), "--out", str(link), "--force"],
                 ["export", str(link), "--out", str(hard), "--force"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("madqn: error: ") and err.count("\n") == 1 and "its own source" in err, err
    assert source.read_bytes() == original and link.is_symlink()
    assert safe_load(source)["kind"] == "madqn-trainer"  # the run can still resume

    existing = tmp_path / "existing.pt"
    existing.write_text("keep me\n")
    assert main(["export", str(source), "--out", str(existing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("madqn: error: ") and err.count("\n") == 1 and "--force" in err, err
    assert existing.read_text() == "keep me\n"
    with pytest.raises(madqn.MadqnError, match="already exists"):
        export_agents(source, existing)
    assert main(["export", str(source), "--out", str(existing), "--force"]) == 0
    assert safe_load(existing, kind=AGENTS_KIND)["step"] == 120
    export_agents(source, existing, force=True)  # the API spells it the same way
