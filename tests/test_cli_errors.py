"""Bad input anywhere: one line on stderr (``madqn: error: ...``), exit code 2, no traceback (``--debug`` shows it).

Most cases call ``madqn.cli.main`` in-process (the same code path as the ``madqn`` command, minus
the interpreter start); a few run the real command to check the process exit code and stderr.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import madqn
from madqn.training.checkpoint import FORMAT_VERSION, TRAINER_KIND
from madqn.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"


def run_main(capsys, *args):
    code = main(["train", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, message):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("madqn: error: ")
    assert message in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A real run directory with a checkpoint (10 steps, no learning: cheap)."""
    run = tmp_path_factory.mktemp("saved") / "run"
    madqn.train("pong_v3", SMOKE, run_dir=run, steps=10, num_threads=1, handle_signals=False)
    return run


@pytest.fixture
def run_copy(saved_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    return run


# ---- env, config keys, types, ranges, files ------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--env", "pong_v4"], "unknown Atari game 'pong_v4' (did you mean 'pong_v3'?)"),
    (["--env", "boxing"], "unknown Atari game 'boxing' (did you mean 'boxing_v2'?)"),
    (["--env", "no_such_module_xyz:make"], "cannot import module 'no_such_module_xyz'"),
    (["--env", "missing_env.py:make"], "env file not found: missing_env.py"),
    (["--set", "lerning_rate=0.1"], "unknown config key 'lerning_rate' in --set"),
    (["--set", "learn_strt=5"], "unknown config key 'learn_strt' in --set (did you mean 'learn_start'?)"),
    (["--set", "steps"], "override 'steps' must look like key=value"),
    (["--set", "steps=ten"], "config key 'steps' must be an integer, got 'ten'"),
    (["--set", "lr=fast"], "config key 'lr' must be a number, got 'fast'"),
    (["--set", "rescale_r=1"], "config key 'rescale_r' must be true or false, got 1"),
    (["--set", "sharing=both"], "config key 'sharing' must be one of shared, independent; got 'both'"),
    (["--steps", "-5"], "config key 'steps' must be >= 1, got -5"),
    (["--set", "learn_start=-1"], "config key 'learn_start' must be >= 0, got -1"),
    (["--set", "ep_start=-0.1"], "config key 'ep_start' must be >= 0.0, got -0.1"),
    (["--set", "ep_end=1.5"], "config key 'ep_end' must be <= 1.0, got 1.5"),
    (["--set", "eval_ep=2"], "config key 'eval_ep' must be <= 1.0, got 2.0"),
    (["--set", "discount=1.5"], "config key 'discount' must be <= 1.0, got 1.5"),
    (["--set", "discount=-0.1"], "config key 'discount' must be >= 0.0, got -0.1"),
    (["--set", "replay_memory=10"], "config key 'replay_memory' (10) must be at least hist_len + minibatch_size (36)"),
    (["--set", "replay_memory=40", "--set", "minibatch_size=64"], "must be at least hist_len + minibatch_size (68)"),
    (["--set", "rmsprop_eps=0"], "config key 'rmsprop_eps' must be > 0, got 0.0"),
    (["--set", "rmsprop_decay=1"], "config key 'rmsprop_decay' must be < 1, got 1.0"),
    (["--set", "device=tpu"], "config key 'device' must be auto, cpu, cuda or cuda:N; got 'tpu'"),
    (["--config", "nope.toml"], "config file not found: nope.toml"),
    (["--set", "random_opponent=1.5"], "config key 'random_opponent' must be <= 1.0, got 1.5"),
    (["--env", f"{ROOT / 'envs' / 'pong_vs_random.py'}:make_env", "--set", "random_opponent=0.5"],
     "config key 'random_opponent' needs at least two agents; the env has 1"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(capsys, *args, "--run-dir", tmp_path / "run")
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "run").exists()  # a refused run leaves nothing behind


def test_bad_config_files(capsys, tmp_path):
    cases = {
        "typo.toml": ("lerning_rate = 0.1\n", "unknown config key 'lerning_rate' in"),
        "type.toml": ('steps = "many"\n', "config key 'steps' must be an integer"),
        "syntax.toml": ("steps = = 3\n", "is not valid TOML"),
        "table.toml": ("[agent]\nlr = 1\n", "tables are not supported ([agent])"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        code, _, err = run_main(capsys, "--config", tmp_path / name, "--run-dir", tmp_path / "run")
        assert_one_line_error(code, err, message)
    (tmp_path / "binary.toml").write_bytes(b"\x80\x81\xfe\xff" * 10)
    code, _, err = run_main(capsys, "--config", tmp_path / "binary.toml", "--run-dir", tmp_path / "run")
    assert_one_line_error(code, err, "is not a text file (not valid UTF-8)")
    (tmp_path / "adir.toml").mkdir()
    code, _, err = run_main(capsys, "--config", tmp_path / "adir.toml", "--run-dir", tmp_path / "run")
    assert_one_line_error(code, err, "cannot read config file")
    assert "Is a directory" in err


# ---- run directories ----------------------------------------------------------------------------

def test_existing_run_dir_is_refused_without_resume_or_force(capsys, run_copy):
    before = (run_copy / "checkpoints" / "latest.pt").read_bytes()
    code, _, err = run_main(capsys, "--config", SMOKE, "--run-dir", run_copy)
    assert_one_line_error(code, err, f"run directory {run_copy} already exists; use --resume {run_copy} to continue "
                                     "it or --force to overwrite it")
    assert (run_copy / "checkpoints" / "latest.pt").read_bytes() == before  # nothing of the run was touched
    code, out, err = run_main(capsys, "--config", SMOKE, "--run-dir", run_copy, "--force", "--steps", "5")
    assert code == 0, err
    assert "done: 5 agent steps" in out


def test_run_dir_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    code, _, err = run_main(capsys, "--config", SMOKE, "--run-dir", tmp_path / "file")
    assert_one_line_error(code, err, "exists and is not a directory")


def test_resume_of_missing_or_empty_run(capsys, tmp_path):
    code, _, err = run_main(capsys, "--resume", tmp_path / "nothing")
    assert_one_line_error(code, err, f"cannot resume: run directory {tmp_path / 'nothing'} does not exist")
    (tmp_path / "empty").mkdir()
    code, _, err = run_main(capsys, "--resume", tmp_path / "empty")
    assert_one_line_error(code, err, "has no checkpoint (")


def test_resume_with_unsafe_override_or_other_run_dir(capsys, run_copy, tmp_path):
    code, _, err = run_main(capsys, "--resume", run_copy, "--sharing", "shared", "--steps", "20")
    assert_one_line_error(code, err, "cannot change 'sharing' when resuming (the run has sharing = 'independent', "
                                     "requested 'shared')")
    code, _, err = run_main(capsys, "--resume", run_copy, "--set", "full_action_space=true", "--steps", "20")
    assert_one_line_error(code, err, "cannot change 'full_action_space' when resuming")
    code, _, err = run_main(capsys, "--resume", run_copy, "--run-dir", tmp_path / "elsewhere")
    assert_one_line_error(code, err, "a resumed run stays in its directory")
    code, _, err = run_main(capsys, "--resume", run_copy)
    assert_one_line_error(code, err, "already reached step 10 of steps = 10; pass --steps N with N > 10")


# ---- checkpoints --------------------------------------------------------------------------------

def test_truncated_checkpoint(capsys, run_copy):
    path = run_copy / "checkpoints" / "latest.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, f"refusing to load {path}: not a complete madqn checkpoint")


def test_bit_flipped_checkpoint(capsys, run_copy):
    path = run_copy / "checkpoints" / "latest.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the weights: torch.load alone would accept it
    path.write_bytes(bytes(data))
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, f"refusing to load {path}: the file is corrupt (checksum mismatch in ")


def test_foreign_checkpoints(capsys, run_copy):
    path = run_copy / "checkpoints" / "latest.pt"
    torch.save({"conv1.weight": torch.zeros(3)}, path)  # somebody's state_dict
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, f"refusing to load {path}: not a madqn checkpoint")
    torch.save({"format_version": 1}, path)
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, f"checkpoint format 1 is not supported (this madqn reads format {FORMAT_VERSION})")
    torch.save({"format_version": FORMAT_VERSION, "kind": TRAINER_KIND, "config": {}}, path)
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, "entry 'agents' is missing or malformed")
    path.write_text("hello")
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, "not a complete madqn checkpoint")


class _RunsCode:
    """Pickles as a call of exec(): plain torch.load would run it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def test_checkpoint_crafted_to_run_code_is_refused_and_the_code_never_runs(capsys, run_copy, tmp_path):
    marker = tmp_path / "pwned"
    path = run_copy / "checkpoints" / "latest.pt"
    torch.save({"format_version": FORMAT_VERSION, "kind": TRAINER_KIND, "payload": _RunsCode(marker)}, path)
    code, _, err = run_main(capsys, "--resume", run_copy, "--steps", "20")
    assert_one_line_error(code, err, f"refusing to load {path}: it holds more than tensors and plain values")
    assert "tampered or foreign file" in err
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the crafted file is live: unsafe loading does run it
    assert marker.read_text() == "pwned"


# ---- the real command ---------------------------------------------------------------------------

def test_process_exit_code_and_debug_traceback(madqn_cli, tmp_path):
    cmd, env = madqn_cli("train", "--env", "pong_v4", "--run-dir", tmp_path / "run")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("madqn: error: cannot resolve env 'pong_v4': unknown Atari game 'pong_v4'")
    cmd, env = madqn_cli("--debug", "train", "--set", "discount=2", "--run-dir", tmp_path / "run")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "ConfigError: config key 'discount' must be <= 1.0, got 2.0" in proc.stderr
