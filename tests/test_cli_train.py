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
