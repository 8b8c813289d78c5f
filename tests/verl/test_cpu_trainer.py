"""verl's real trainers, end to end on this CPU (hardware=cpu-verl): Ray, FSDP2 actor and critic,
vLLM's CPU build serving our AgentLoop, weight sync, checkpoints, and a restart after the whole
run was killed with SIGKILL mid-step (verl's resume, our launcher's clean-up of what the kill
left), with constrained action decoding on (vLLM's logits processor and the masked actor engine).
The legacy trainer's run starts from verl's SFT checkpoint (conftest's ``verl_sft_folder``: the
SFT -> PPO handoff), and its actor's weights are checked to come from there, not from the base
model. The V1 trainer's run plays a multi-turn game with context windows (one row per window).

Needs vLLM's CPU build (``bash env_setup.sh --verl-cpu``, which scripts/test.sh runs; V1 also
TransferQueue, which it installs): found in ``$AGENTRL_VERL_CPU_PYTHON``, the ``.venv-verl-cpu``
it makes, or this interpreter; skipped otherwise. One SFT run (under a minute) and two pairs of
PPO runs of a few minutes each, one after the other (~7-11 GiB of memory at once); every process
a run starts is ended with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verl_runs import cpu_sft_config, cpu_verl_python, v1_python, weight_distance

from agentrl.verl import doctor_rows
from agentrl.verl import child_run
from agentrl.verl.child_run import end_session, survivors

RUN_TIMEOUT_S = 900


def train_command(python: str, run_dir: Path, steps: int, model: Path) -> list[str]:
    """The smallest verl run, from the ``model=tiny_vllm`` model folder ``model`` (an SFT
    checkpoint's): one group of 2 bandit episodes a step, a checkpoint every step (the actor's
    with its Hugging Face model, as every agentrl verl run saves it), no validation, replies
    constrained to well-formed answers, WandB offline, the learning-curve PNG at the end."""
    return [python, "-m", "agentrl.cli", "train", "hardware=cpu-verl", "model=tiny_vllm",
            f"model.name={model}", f"run_dir={run_dir}", f"train.total_steps={steps}",
            "trainer.save_freq=1", "train.presets=[banditAgent]", "val.presets=[banditAgent]",
            "train.group_num=1", "train.group_size=2", "val.test_freq=0",
            "val.before_train=false", "rollout.max_new_tokens=16",
            "trainer.logger=[console,wandb]", "trainer.wandb_mode=offline",
            "verl.max_prompt_length=256", "verl.max_response_length=64",
            "rollout.constrained_actions=true"]


WINDOWED_PRESET = "tightBlocksworldTurnsAgent"
"""One move a turn, each turn its own chat (``context: state``): an episode of 3 turns is 3
rows."""


def v1_windows_command(python: str, run_dir: Path, steps: int) -> list[str]:
    """verl's V1 trainer on a game with context windows, from the base ``model=tiny_vllm``: one
    group of 2 episodes of 3 BlocksWorld turns a step, replies constrained to legal moves,
    2 held-out games at the last step, WandB offline, the learning-curve PNG at the end."""
    return [python, "-m", "agentrl.cli", "train", "hardware=cpu-verl", "model=tiny_vllm",
            "verl.trainer=v1", f"run_dir={run_dir}", f"train.total_steps={steps}",
            "trainer.save_freq=1", f"train.presets=[{WINDOWED_PRESET}]",
            f"val.presets=[{WINDOWED_PRESET}]", f"agents.{WINDOWED_PRESET}.max_turns=3",
            "train.group_num=1", "train.group_size=2", f"val.test_freq={steps}",
            "val.group_num=2", "val.before_train=false", "trainer.logger=[console,wandb]",
            "trainer.wandb_mode=offline",
            "verl.max_prompt_length=1024", "verl.max_response_length=256", "algorithm.lam=1.0",
            "rollout.constrained_actions=true"]


def start(command: list[str], log: Path) -> subprocess.Popen:
    """``command`` in a session of its own, on two threads."""
    return child_run.start(command, log, env={"OMP_NUM_THREADS": "2"})


def kill_after_checkpoint(process: subprocess.Popen, run_dir: Path) -> int:
    """SIGKILL ``process``'s process group mid-step: once a checkpoint exists and the next
    step's episodes are in the metrics file (logged, not yet checkpointed). Returns the step
    of the newest checkpoint then."""
    latest = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        saved = int(latest.read_text() or 0) if latest.exists() else 0
        metrics = run_dir / "metrics.jsonl"
        if saved and metrics.exists() and saved + 1 in train_steps(metrics):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return saved
        time.sleep(0.5)
    raise AssertionError(f"no step after a checkpoint to kill (exit {process.poll()})")


def kill_after_logged_checkpoint(process: subprocess.Popen, run_dir: Path, log: Path) -> int:
    """SIGKILL ``process``'s process group once checkpoint 1 exists and its step's metrics are
    on the console (the next step has begun). Returns 1."""
    latest = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        saved = int(latest.read_text() or 0) if latest.exists() else 0
        if saved and saved in child_run.console_steps(log.read_text(errors="replace")):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return saved
        time.sleep(0.5)
    raise AssertionError(f"no logged checkpoint to kill after (exit {process.poll()})")


RUN_FOLDER_KEYS = ("actor/pg_loss", "critic/vf_loss", "critic/vf_explained_var",
                   "timing_s/step")
"""verl's metrics the learning curves and the report draw, under the local engine's names."""


def assert_run_folder(run_dir: Path, preset: str, steps: list[int], val_steps: list[int]
                      ) -> None:
    """The folder every run leaves, read back through ``agentrl report``: each step once in
    metrics.jsonl with our per-preset metrics (training, and held-out at ``val_steps``) and
    verl's own, the episodes of every step, the learning-curve PNG."""
    from agentrl.report.data import run_data

    report = subprocess.run([sys.executable, "-m", "agentrl.cli", "report", str(run_dir),
                             "--no-play-references"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr[-4000:]
    assert (run_dir / "report.html").is_file() and (run_dir / "learning_curves.png").is_file()
    data = run_data(run_dir, play_references=False)
    series = data["series"]

    def steps_of(key: str) -> list[int]:
        return [step for step, _ in series.get(key, [])]

    print(f"report series: {sorted(series)}")
    assert steps_of(f"train/{preset}/success") == steps
    assert steps_of(f"val/{preset}/success") == val_steps
    for key in RUN_FOLDER_KEYS:
        assert steps_of(key) == steps, key
    assert data["presets"] == [preset]
    episodes = {int(step): records for step, records in data["episodes"].items()}
    assert sorted(episodes) == steps
    splits = {record["split"] for step in val_steps for record in episodes[step]}
    assert splits == ({"train", "val"} if val_steps else set())
    assert all(record["preset"] == preset and record["turns"]
               for records in episodes.values() for record in records)
    # `agentrl eval` of the run folder: its last actor, the Hugging Face model verl saved
    out = run_dir.parent / "eval.json"
    played = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--model",
                             str(run_dir), "--groups", "1", "--max-new-tokens", "8",
                             "--out", str(out), "--no-progress"], capture_output=True, text=True)
    assert played.returncode == 0, played.stderr[-4000:]
    evaluated = json.loads(out.read_text())
    assert evaluated["model"]["path"] == str(run_dir / "checkpoints" / f"global_step_{steps[-1]}"
                                             / "actor" / "huggingface")
    assert list(evaluated["presets"]) == [preset]
    if val_steps:  # the default run's evidence, from a verl run's folder
        summary = run_dir.parent / "quick.json"
        script = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "quick_train.py"
        summarized = subprocess.run([sys.executable, str(script),
                                     "--from-run", str(run_dir), "--out", str(summary)],
                                    capture_output=True, text=True)
        assert summarized.returncode == 0, summarized.stderr[-4000:]
        (evidence,) = json.loads(summary.read_text())["runs"]
        assert [s["step"] for s in evidence["ppo_steps"]] == steps
        assert [v["step"] for v in evidence["val"]] == val_steps


def assert_ends_quietly(output: str) -> None:
    """A run that succeeded ends without a traceback (verl's WandB teardown included)."""
    tail = output[output.rfind("step:"):]
    assert "Traceback" not in tail and "Exception ignored" not in tail, tail[-6000:]


def train_records(metrics_file: Path) -> list[dict]:
    """The training records of a metrics file (a half-written last line is left out)."""
    records = []
    for line in metrics_file.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return [r for r in records if any(key.startswith("train/") for key in r)]


def train_steps(metrics_file: Path) -> list[int]:
    return [r["step"] for r in train_records(metrics_file)]


@pytest.mark.slow
def test_verls_trainer_from_its_sft_model_killed_mid_step_resumes_on_cpu(tmp_path, request):
    python = cpu_verl_python()
    sft = request.getfixturevalue("verl_sft_folder")   # after the skip: it runs verl's SFT
    run_dir = tmp_path / "run"
    command = train_command(python, run_dir, steps=3, model=sft)
    first = start(command, tmp_path / "first.log")
    try:
        saved = kill_after_checkpoint(first, run_dir)
        time.sleep(5)
        left = survivors(first.pid)
        print(f"killed after checkpoint {saved}; left in the session: {left}")
        second = start(command, tmp_path / "second.log")  # resume=auto: verl's resume_mode=auto
        second_out = child_run.finish(second, tmp_path / "second.log", RUN_TIMEOUT_S)
    finally:
        end_session(first.pid)
    first_out = (tmp_path / "first.log").read_text()
    resumed = re.findall(r"Resuming from \S*global_step_(\d+)", second_out)
    assert resumed == [str(saved)], second_out[-8000:]   # not from step 0
    before, after = child_run.console_steps(first_out), child_run.console_steps(second_out)
    assert sorted(before) == list(range(1, saved + 1))
    assert sorted(after) == list(range(saved + 1, 4))
    for step in [*before.values(), *after.values()]:  # vLLM sampled with the weights and the
        assert step["training/rollout_probs_diff_max"] < 1e-3  # masks the trainer holds
        # the value clip scaled to the step's returns (agentrl.verl.returns, in verl's critic)
        assert step["critic/cliprange_value"] >= 0.5
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "global_step_3" / "actor").is_dir()
    assert (checkpoints / "global_step_3" / "critic").is_dir()
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    # each step once: the step logged after the checkpoint, before the kill, was redone
    assert train_steps(run_dir / "metrics.jsonl") == [1, 2, 3]
    # the doctor's constrained row on this run (agentrl doctor's CPU rows are these runs')
    run = doctor_rows.StageResult("constrained", ran=True, steps={**before, **after},
                             records=train_records(run_dir / "metrics.jsonl"))
    row = doctor_rows.constrained_row(run, 3, reference=None)
    assert row.status == doctor_rows.PASS, row
    for record in train_records(run_dir / "metrics.jsonl"):  # the SFT'd random model, constrained
        assert record["train/banditAgent/format_error"] == 0.0
    assert_started_from(sft, run_dir, first_out)
    assert_run_folder(run_dir, "banditAgent", [1, 2, 3], val_steps=[])
    assert_ends_quietly(second_out)


def assert_started_from(sft: Path, run_dir: Path, first_out: str) -> None:
    """The SFT -> PPO handoff: vLLM served the SFT folder, and the actor's last weights are
    the SFT model's plus PPO's small steps (lr 1e-5), far nearer to it than to the base model
    the SFT step started from (lr 1e-3): a run that loaded the base would fail here."""
    from agentrl.verl.launch import model_path

    served = f"'{sft.resolve()}'"   # vLLM's `serve` arguments, one a line
    assert any("vLLMHttpServer" in line and served in line
               for line in first_out.splitlines()), "vLLM was not started on the SFT folder"
    base = Path(model_path(cpu_sft_config(run_dir)))
    actor = run_dir / "checkpoints" / "global_step_3" / "actor" / "huggingface"
    to_sft, to_base = weight_distance(actor, sft), weight_distance(actor, base)
    print(f"actor's weights at step 3: {to_sft:.4f} from the SFT model's, "
          f"{to_base:.4f} from the base model's")
    assert to_sft < to_base / 4


@pytest.mark.slow
def test_verls_v1_trainer_with_context_windows_killed_mid_step_resumes_on_cpu(tmp_path):
    """Context windows on verl's V1 trainer, constrained: each episode comes back as one row
    per window, the masks reach the actor (vLLM's and the trainer's probabilities agree), and a
    run killed in step 2 resumes from checkpoint 1 and logs each step once."""
    python = v1_python()
    run_dir = tmp_path / "run"
    command = v1_windows_command(python, run_dir, steps=2)
    first = start(command, tmp_path / "first.log")
    try:
        saved = kill_after_logged_checkpoint(first, run_dir, tmp_path / "first.log")
        second = start(command, tmp_path / "second.log")
        second_out = child_run.finish(second, tmp_path / "second.log", RUN_TIMEOUT_S)
    finally:
        end_session(first.pid)
    first_out = (tmp_path / "first.log").read_text()
    assert "TaskRunnerV1" in first_out
    resumed = re.findall(r"Resuming from \S*global_step_(\d+)", second_out)
    assert resumed == [str(saved)] == ["1"], second_out[-8000:]
    before, after = child_run.console_steps(first_out), child_run.console_steps(second_out)
    assert sorted(before) == [1] and sorted(after) == [2]  # each step logged once
    row = doctor_rows.v1_row(doctor_rows.StageResult("v1", ran=True, steps={**before, **after},
                                            log=first_out), 2, episodes=2)
    assert row.status == doctor_rows.PASS, row  # the doctor's V1 row on this run
    for step in (before[1], after[2]):
        assert step["training/rollout_probs_diff_max"] < 1e-3  # the masks reach the actor
        rows = step["perf/total_num_tokens"] / (step["prompt_length/mean"]
                                                + step["response_length/mean"])
        # 2 episodes of up to 3 rows each (3 turns, a row a turn): more rows than episodes
        print(f"step rows: {rows:.2f}")
        assert rows > 2.5
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    assert_run_folder(run_dir, WINDOWED_PRESET, [1, 2], val_steps=[2])
    assert_ends_quietly(second_out)
