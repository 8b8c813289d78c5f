"""`agentrl train` from the command line: the warm start's hand-off, and resumes that must not
silently go wrong."""

from __future__ import annotations

import shlex

import pytest
import yaml

from agentrl import cli

TINY_RUN = ["train.presets=[banditAgent]", "val.presets=[banditAgent]", "val.group_num=1",
            "train.group_num=1", "train.group_size=2", "rollout.max_new_tokens=8", "threads=1",
            "trainer.logger=[]", "trainer.plot=false", "val.before_train=false", "val.test_freq=0"]


def _printed_next_command(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.strip().startswith("next: "))
    return shlex.split(line.strip().removeprefix("next: "))


@pytest.mark.slow  # SFT with its two evaluations, then a PPO step: ~40 s on 2 busy cores
def test_the_command_agentrl_sft_prints_trains_from_its_checkpoint(tmp_path, capsys,
                                                                   monkeypatch, one_torch_thread):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sft", "model=tiny", "run_dir=warm", "sft.presets=[banditAgent]",
                     "sft.episodes=2", "sft.epochs=1", "sft.mini_batch_size=2",
                     "val.group_num=1", "val.presets=[banditAgent]",
                     "threads=1", "rollout.max_new_tokens=8"]) == 0
    command = _printed_next_command(capsys.readouterr().out)
    assert command[:2] == ["agentrl", "train"]
    checkpoint = tmp_path / "warm" / "sft" / "checkpoints" / "step_000001"

    assert cli.main([*command[1:], "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["name"] == str(checkpoint / "actor")
    assert cli.main([*command[1:], "run_dir=ppo", "train.total_steps=1", *TINY_RUN]) == 0
    assert (tmp_path / "ppo" / "checkpoints" / "step_000001" / "COMPLETE").is_file()
    capsys.readouterr()

    for folder in ("warm", "warm/sft", str(checkpoint)):  # run folders name the same model
        assert cli.main(["train", f"model={folder}", "--print-config"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["model"]["name"] == str(checkpoint / "actor")


@pytest.mark.parametrize("change, message", [
    ("actor.lr=3e-4", "actor.lr: 1e-05 -> 0.0003"),
    ("train.presets=[banditAgent,simpleSokobanAgent]", "train.presets: ['banditAgent'] -> "),
])
def test_a_resume_that_would_change_the_run_stops_before_the_model_loads(
        tmp_path, capsys, monkeypatch, change, message, one_torch_thread):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = ["train", "model=tiny", f"run_dir={tmp_path}", "train.total_steps=2",
           "val.test_freq=0", "val.before_train=false", "actor.lr=1e-5", *TINY_RUN]
    assert cli.main(run) == 0
    with pytest.raises(SystemExit) as stopped:
        cli.main([*run, change])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*run, "train.total_steps=1"])
    assert "train.total_steps=1 is below step 2" in capsys.readouterr().err


def test_a_finished_run_run_again_says_so_and_how_to_train_further(tmp_path, capsys,
                                                                   monkeypatch, one_torch_thread):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = ["train", "model=tiny", f"run_dir={tmp_path}", "train.total_steps=1", *TINY_RUN]
    assert cli.main(run) == 0
    capsys.readouterr()
    assert cli.main(run) == 0
    out = capsys.readouterr().out
    assert f"the run in {tmp_path} is finished" in out and "step 1 of train.total_steps=1" in out
    further = next(line for line in out.splitlines() if "to train it further:" in line)
    assert "train.total_steps=<more than 1>" in further and "model=tiny" in further
    assert "train.total_steps=1 " not in further  # the old total is left out


def test_a_run_started_over_says_it_drops_the_earlier_records(tmp_path, caplog):
    """No ``after step None``: starting over drops every record of the earlier start."""
    import logging

    from agentrl.trainers.tracking import RunTracker

    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "val/x/success": 0.5}\n')
    with caplog.at_level(logging.WARNING):
        RunTracker(tmp_path, project="p", experiment="e", config={}, use_wandb=False,
                   resume_step=None).close()
    message = caplog.text
    assert "dropping 1 record(s)" in message and "None" not in message, message
    assert "starts over" in message


def _vllm_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_vllm_here(), reason="this Python has vLLM: cpu-verl runs here")
def test_cpu_verl_without_vllm_says_what_to_run_before_anything_starts(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("AGENTRL_VERL_CPU_PYTHON", raising=False)
    monkeypatch.setenv("AGENTRL_VERL_CPU_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", "hardware=cpu-verl", "model=tiny_vllm", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "bash env_setup.sh --verl-cpu" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(_vllm_here(), reason="this Python has vLLM: cpu-verl runs here")
def test_a_cpu_verl_dry_run_names_the_venv_the_run_takes_and_checks_here(tmp_path, capsys,
                                                                        monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")  # never run: the dry run stays in this Python
    monkeypatch.setenv("AGENTRL_VERL_CPU_PYTHON", str(fake))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--dry-run", "hardware=cpu-verl", "model=tiny_vllm"]) == 0
    captured = capsys.readouterr()
    assert f"the run re-runs itself with {fake}" in captured.err
    assert "verl.trainer.main_ppo" in captured.out


@pytest.mark.skipif(_vllm_here(), reason="this Python has vLLM: cpu-verl runs here")
def test_cpu_verl_reruns_itself_with_the_venvs_python(tmp_path):
    import os
    import subprocess
    import sys

    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\n')
    fake.chmod(0o755)
    env = {**os.environ, "AGENTRL_VERL_CPU_PYTHON": str(fake), "WANDB_MODE": "disabled"}
    env.pop("AGENTRL_REEXECUTED", None)
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "hardware=cpu-verl",
                           "model=tiny_vllm", "train.total_steps=2"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "args").read_text().split() == [
        "-m", "agentrl.cli", "train", "hardware=cpu-verl", "model=tiny_vllm",
        "train.total_steps=2"]
    assert f"running {fake}" in done.stderr


@pytest.mark.slow  # three PPO steps of the tiny model, each validated: ~30 s on 2 busy cores
def test_a_run_prints_its_last_and_its_best_checkpoint(tmp_path, capsys, monkeypatch,
                                                        one_torch_thread):
    from agentrl.trainers.checkpoint import list_checkpoints, model_folder, read_best
    from agentrl.trainers.tracking import read_metrics

    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir = tmp_path / "run"
    assert cli.main(["train", "model=tiny", f"run_dir={run_dir}", "train.total_steps=3",
                     *TINY_RUN, "val.test_freq=1", "val.group_num=4", "trainer.save_freq=0",
                     "trainer.keep_last=1"]) == 0
    out = capsys.readouterr().out
    success = {r["step"]: r["val/banditAgent/success"] for r in read_metrics(run_dir / "metrics.jsonl")}
    best_step = max(success, key=lambda s: (success[s], -s))  # the first of the highest
    best = read_best(run_dir)
    assert best.step == best_step and best.val_success == success[best_step]
    root = run_dir / "checkpoints"
    assert {p.name for p in list_checkpoints(run_dir)} == {best.folder_name, "step_000003"}
    assert (f"checkpoint: {root / 'step_000003'} (the last: step 3, held-out success "
            f"{100 * success[3]:.1f}%)") in out
    assert (f"best:       {root / best.folder_name} (the best: step {best_step}, held-out "
            f"success {100 * success[best_step]:.1f}%") in out
    assert model_folder(run_dir) == root / best.folder_name / "actor"


# -- Ctrl-C ------------------------------------------------------------------------------------
INTERRUPTED_RUN = ["model=tiny", "train.total_steps=4", "train.presets=[banditAgent]",
                   "val.presets=[banditAgent]", "val.group_num=2", "train.group_num=1",
                   "train.group_size=2", "rollout.max_new_tokens=8", "threads=1",
                   "trainer.logger=[console]", "trainer.plot=false", "val.before_train=false",
                   "val.test_freq=1", "trainer.save_freq=1",
                   "rollout.drop_uniform_groups=false"]  # every step updates: "actor update"


def _interrupted(command: list[str], cwd, marker: str, after: str, timeout: float = 300):
    """Run ``agentrl <command>``; send SIGINT once stderr shows ``marker`` after ``after``
    (progress bars name the stage); its exit status and stderr."""
    import fcntl
    import os
    import signal
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-m", "agentrl.cli", *command], cwd=cwd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "WANDB_MODE": "disabled"})
    fd = process.stderr.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    seen, deadline = b"", time.monotonic() + timeout
    while True:
        try:
            seen += os.read(fd, 1 << 16)
        except BlockingIOError:
            pass
        start = seen.find(after.encode())
        if start >= 0 and seen.find(marker.encode(), start) >= 0:
            process.send_signal(signal.SIGINT)
            break
        assert process.poll() is None, f"ended before {marker!r}: {seen.decode()[-2000:]}"
        assert time.monotonic() < deadline, f"no {marker!r} within {timeout} s"
        time.sleep(0.005)
    _, rest = process.communicate(timeout=120)
    return process.returncode, (seen + rest).decode(errors="replace")


@pytest.mark.parametrize("stage, marker", [
    ("the rollout", "step 2 rollout"),
    pytest.param("the PPO update", "actor update", marks=pytest.mark.slow),
    pytest.param("validation", "eval model", marks=pytest.mark.slow),
    pytest.param("saving a checkpoint", "Writing model", marks=pytest.mark.slow),
])
def test_ctrl_c_stops_train_with_one_line_and_the_command_that_resumes(tmp_path, stage, marker):
    from agentrl.trainers.checkpoint import checkpoint_problem

    command = ["train", *INTERRUPTED_RUN, "run_dir=run"]
    code, err = _interrupted(command, tmp_path, marker, after="step 2 rollout")
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert last.startswith(f"stopped by Ctrl-C during {stage} (step 2); last checkpoint "
                           f"{checkpoint} is intact; resume with: "), last
    assert shlex.split(last.split("resume with: ", 1)[1]) == ["agentrl", *command]
    assert checkpoint_problem(checkpoint) is None


@pytest.mark.slow  # an interrupted run, then its resume: ~50 s
def test_the_printed_command_resumes_a_run_stopped_while_saving(tmp_path):
    import subprocess
    import sys

    from agentrl.trainers.tracking import read_metrics

    command = ["train", *INTERRUPTED_RUN, "run_dir=run", "resume=never"]
    code, err = _interrupted(command, tmp_path, "Writing model", after="step 2 rollout")
    assert code == 130, err[-3000:]
    resume = shlex.split(err.strip().splitlines()[-1].split("resume with: ", 1)[1])
    assert resume[-1] == "resume=auto" and "resume=never" not in resume
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", *resume[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]


def test_ctrl_c_stops_sft_with_one_line(tmp_path):
    command = ["sft", "model=tiny", "run_dir=warm", "sft.presets=[banditAgent]",
               "sft.episodes=2", "sft.epochs=1", "sft.mini_batch_size=2", "val.group_num=1",
               "val.presets=[banditAgent]", "threads=1", "rollout.max_new_tokens=8"]
    code, err = _interrupted(command, tmp_path, "oracle demonstrations", after="")
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by Ctrl-C during SFT's "), last
    assert "no checkpoint saved yet; start again with: " in last
    assert shlex.split(last.split("start again with: ", 1)[1]) == ["agentrl", *command]


def test_the_next_command_of_agentrl_sft_trains_and_validates_what_it_warmed_up(
        tmp_path, capsys, monkeypatch):
    """The printed ``next:`` command carries the warmed-up presets (and the command's other
    overrides, less ``sft.*``): composed, it trains and validates them."""
    from types import SimpleNamespace

    from agentrl.config import compose_config
    from agentrl.trainers import sft as sft_trainer

    class FakeSFT:
        def __init__(self, config):
            pass

        def fit(self):
            return SimpleNamespace(checkpoint=tmp_path / "sft" / "checkpoints" / "step_000001",
                                   demonstrations=2, tokens=10, updates=1,
                                   seconds={"train": 1.0}, losses=[1.0], before=None,
                                   after=None)

        def close(self):
            pass

    monkeypatch.setattr(sft_trainer, "SFTTrainer", FakeSFT)
    assert cli.main(["sft", "model=tiny", "sft.presets=[tightBlocksworldTurnsAgent]",
                     "rollout.max_new_tokens=24", "sft.episodes=2"]) == 0
    command = _printed_next_command(capsys.readouterr().out)
    assert command[:3] == ["agentrl", "train", f"model={tmp_path}/sft/checkpoints/step_000001"]
    config = compose_config(["model=tiny", *command[3:]])
    assert list(config.train.presets) == ["tightBlocksworldTurnsAgent"]
    assert list(config.val.presets) == ["tightBlocksworldTurnsAgent"]
    assert config.rollout.max_new_tokens == 24 and "sft.episodes=2" not in command

    assert cli.main(["sft", "model=tiny", "sft.presets=[tightBlocksworldTurnsAgent]",
                     "val.presets=[tightBlocksworldAgent]"]) == 0  # a choice of its own stays
    command = _printed_next_command(capsys.readouterr().out)
    config = compose_config(["model=tiny", *command[3:]])
    assert list(config.val.presets) == ["tightBlocksworldAgent"]


def test_the_readme_says_what_plain_train_and_quick_train_each_train():
    """Plain ``agentrl train`` runs base.yaml (named in the README as it is), and the README's
    ``agentrl train`` equivalent of ``quick_train.sh`` composes to the script's CPU defaults."""
    import re
    from pathlib import Path

    from agentrl.config import compose_config

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    plain = compose_config([])
    assert (f"Plain\n`agentrl train` runs [configs/base.yaml](configs/base.yaml) as it is: PPO on\n"
            f"`{plain.train.presets[0]}` from the untrained model, no warm start "
            f"(`train.sft_steps={plain.train.sft_steps}`)") in readme
    line = next(line for line in readme.splitlines()
                if line.startswith("agentrl train hardware=cpu model=embedded"))
    config = compose_config(shlex.split(line)[2:])
    script = (root / "quick_train.sh").read_text()
    start = script.index("if [[ $1 == local ]]")
    local = script[start:script.index("\n  else", start)]
    defaults = dict(re.findall(r"DEFAULT_(\w+)=(\S+)", local))
    assert list(config.train.presets) == [defaults["TRAIN_PRESETS"].strip('"[]')]
    assert list(config.val.presets) == [defaults["VAL_PRESETS"].strip('"[]')]
    assert config.train.sft_steps == int(defaults["SFT_STEPS"])
    assert config.train.total_steps == int(defaults["TOTAL_STEPS"]) + int(defaults["SFT_STEPS"])
    assert (config.train.group_num, config.train.group_size, config.val.group_num) == (
        int(defaults["GROUP_NUM"]), int(defaults["GROUP_SIZE"]), int(defaults["VAL_GROUP_NUM"]))
    overrides = re.search(r"DEFAULT_OVERRIDES=\((.*)\)", local).group(1).split()
    assert set(overrides) <= set(shlex.split(line))


def test_ctrl_c_during_a_verl_run_says_where_it_stands_and_how_to_resume(tmp_path, monkeypatch,
                                                                        capsys):
    """The launch returns 130 once verl has ended (tests/verl/test_launch.py); the command then
    names the newest intact verl checkpoint (none yet here) and the command that goes on."""
    from agentrl.cli import train
    from agentrl.verl import launch

    monkeypatch.setattr(train, "_find_vllm", lambda *args, **kwargs: None)
    monkeypatch.setattr(launch, "launch", lambda config, dry_run=False: launch.EXIT_INTERRUPTED)
    overrides = ["hardware=cpu-verl", "model=tiny_vllm", f"run_dir={tmp_path / 'run'}"]
    assert cli.main(["train", *overrides]) == launch.EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("stopped by Ctrl-C during verl's run; no checkpoint saved yet; start "
                       f"again with: {shlex.join(['agentrl', 'train', *overrides])}")
