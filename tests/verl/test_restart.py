"""A verl run started again after a kill: its checkpoints (the tracker verl resumes from) and
the processes the killed launch left (agentrl.verl.restart)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.verl import restart

ROLES = ("actor", "critic")


def save_step(checkpoints: Path, step: int, roles=ROLES, world: int = 1) -> Path:
    """A ``global_step_N`` laid out as verl 0.9.1's FSDP checkpoint manager writes it."""
    folder = checkpoints / f"global_step_{step}"
    for role in roles:
        (folder / role).mkdir(parents=True)
        (folder / role / "fsdp_config.json").write_text(json.dumps({"world_size": world}))
        for rank in range(world):
            for kind in ("model", "optim", "extra_state"):
                shard = folder / role / f"{kind}_world_size_{world}_rank_{rank}.pt"
                torch.save({"w": torch.ones(64)}, shard)
    torch.save({"position": step}, folder / "data.pt")
    return folder


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def tracker(checkpoints: Path) -> Path:
    return checkpoints / restart.TRACKER


def verl_finds(checkpoints: Path) -> str | None:
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    return find_latest_ckpt_path(str(checkpoints))


def test_a_tracker_left_empty_by_a_kill_points_at_the_newest_intact_checkpoint(tmp_path):
    save_step(tmp_path, 1)
    newest = save_step(tmp_path, 2)
    tracker(tmp_path).write_text("")          # opened, not yet written, when the kill came
    with pytest.raises(ValueError):           # what verl 0.9.1 does with it
        verl_finds(tmp_path)
    assert restart.resume_point(tmp_path, "auto", ROLES) == newest
    assert verl_finds(tmp_path) == str(newest)


def test_a_checkpoint_cut_short_is_skipped_with_a_warning(tmp_path, caplog):
    older = save_step(tmp_path, 1)
    newer = save_step(tmp_path, 2)
    cut_short(newer / "critic" / "optim_world_size_1_rank_0.pt")
    tracker(tmp_path).write_text("2")        # named by the tracker, damaged afterwards
    with caplog.at_level(logging.WARNING, logger=restart.__name__):
        assert restart.resume_point(tmp_path, "auto", ROLES) == older
    assert "global_step_2 (critic: optim_world_size_1_rank_0.pt cut short" in caplog.text
    assert verl_finds(tmp_path) == str(older)


def test_a_save_killed_before_the_tracker_was_written_is_resumed_from(tmp_path):
    save_step(tmp_path, 1)
    newest = save_step(tmp_path, 2)           # data.pt written, the tracker not yet
    tracker(tmp_path).write_text("1")
    assert restart.resume_point(tmp_path, "auto", ROLES) == newest
    assert tracker(tmp_path).read_text() == "2"


@pytest.mark.parametrize("damage", ["no data.pt", "a rank's shard missing", "no critic"])
def test_partial_saves_are_not_intact(tmp_path, damage):
    folder = save_step(tmp_path, 1, world=2)
    if damage == "no data.pt":
        (folder / "data.pt").unlink()
    elif damage == "a rank's shard missing":
        (folder / "actor" / "model_world_size_2_rank_1.pt").unlink()
    else:
        save_step(tmp_path / "other", 1, roles=("actor",))
        folder = tmp_path / "other" / "global_step_1"
    assert restart.checkpoint_problem(folder, ROLES) is not None
    assert restart.checkpoint_problem(save_step(tmp_path / "whole", 1, world=2), ROLES) is None


def test_no_intact_checkpoint_stops_the_launch_naming_each(tmp_path):
    # keep_last=1: the previous actor was deleted once the new one was saved, then the kill
    # came mid-way through the critic's save
    save_step(tmp_path, 1, roles=("critic",))
    (tmp_path / "global_step_1" / "actor").mkdir()
    cut_short(save_step(tmp_path, 2) / "critic" / "model_world_size_1_rank_0.pt")
    tracker(tmp_path).write_text("1")
    with pytest.raises(ValueError, match=r"global_step_2 \(critic: .*global_step_1 \(actor: "
                                         r".*allowed: resume=never"):
        restart.resume_point(tmp_path, "auto", ROLES)


def test_without_checkpoints_an_empty_tracker_is_removed(tmp_path):
    tracker(tmp_path).write_text("")
    assert restart.resume_point(tmp_path, "auto", ROLES) is None
    assert not tracker(tmp_path).exists()
    assert restart.resume_point(tmp_path / "absent", "auto", ROLES) is None


def test_a_named_checkpoint_must_be_intact(tmp_path):
    folder = save_step(tmp_path, 3)
    assert restart.resume_point(tmp_path, str(folder), ROLES) == folder
    (folder / "data.pt").unlink()
    with pytest.raises(ValueError, match="resume=.*data.pt missing.*allowed: auto, never"):
        restart.resume_point(tmp_path, str(folder), ROLES)
    assert restart.resume_point(tmp_path, "never", ROLES) is None


def marked(run_dir: Path, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv],
                            env={**os.environ, **restart.run_mark(run_dir)})


def test_processes_a_killed_launch_left_are_ended(tmp_path):
    run_dir, other_run = tmp_path / "run", tmp_path / "other"
    left = [marked(run_dir, "vllm engine"), marked(run_dir, "ray::WorkerDict")]
    other = marked(other_run, "ray::WorkerDict")
    try:
        assert set(restart.marked_processes(run_dir)) == {p.pid for p in left}
        assert restart.end_leftovers(run_dir) == sorted(p.pid for p in left)
        assert [p.wait(timeout=10) for p in left] == [-signal.SIGKILL] * 2
        assert other.poll() is None            # another run's: kept
        assert restart.end_leftovers(run_dir) == []
    finally:
        for process in (*left, other):
            process.kill()
            process.wait()


def test_a_running_verl_process_of_the_run_refuses_the_launch(tmp_path):
    running = marked(tmp_path, "-m", "verl.trainer.main_ppo")
    try:
        with pytest.raises(ValueError, match=rf"still running \(pid {running.pid}\)"):
            restart.end_leftovers(tmp_path)
        assert running.poll() is None
    finally:
        running.kill()
        running.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_verl_process_dies_with_its_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from agentrl.verl.restart import die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " preexec_fn=die_with_parent)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and restart._alive(child):
        time.sleep(0.05)
    assert not restart._alive(child)


def test_the_launch_repairs_the_tracker_and_continues_the_wandb_run(tmp_path, monkeypatch,
                                                                    embedded_prompt_tokenizer):
    from agentrl.config import compose_config
    from agentrl.verl import launch

    runs = []

    class FakeVerl:  # launch.run_verl's child: it records what it was started with
        def __init__(self, command, env, preexec_fn):
            runs.append((command, env, preexec_fn,
                         tracker(tmp_path / "checkpoints").read_text()))

        def wait(self):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", FakeVerl)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    config = compose_config(["hardware=l40", "model=qwen_halfb", f"run_dir={tmp_path}",
                             "train.total_steps=2", "trainer.wandb_mode=disabled",
                             "trainer.plot=false"])
    save_step(tmp_path / "checkpoints", 1)
    tracker(tmp_path / "checkpoints").write_text("")      # torn by the kill
    assert launch.launch(config) == launch.launch(config) == 0
    (first, env, preexec, tracked), (again, env_again, _, _) = runs
    assert tracked == "1" and preexec is restart.die_with_parent
    assert env[restart.RUN_MARK] == str(tmp_path.resolve())
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]
    assert env["WANDB_RUN_ID"] == env_again["WANDB_RUN_ID"] == run_id  # one WandB run
    assert env["WANDB_RESUME"] == "allow"
    assert launch.worker_env_key("WANDB_RUN_ID") + f"={run_id}" in first
    assert first == again


def test_the_newest_intact_checkpoint_is_named_without_moving_the_tracker(tmp_path):
    """What the stop line after Ctrl-C names: the checkpoint ``resume=auto`` would take."""
    checkpoints = tmp_path / "checkpoints"
    assert restart.newest_intact(checkpoints) is None
    save_step(checkpoints, 1)
    newest = save_step(checkpoints, 2)
    cut_short(newest / "actor" / "model_world_size_1_rank_0.pt")
    assert restart.newest_intact(checkpoints, ROLES) == checkpoints / "global_step_1"
    assert not tracker(checkpoints).exists()
