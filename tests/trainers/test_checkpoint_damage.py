"""Damaged checkpoints are named and skipped, never silently trusted or started over; a resume
with another config or fewer steps is refused unless allowed."""

from __future__ import annotations

import logging

import pytest
import torch

from agentrl.trainers.checkpoint import (
    MARKER, checkpoint_problem, load_checkpoint, model_folder, save_checkpoint,
)
from agentrl.trainers.resume import check_resume, resume_checkpoint

CONFIG = {"train": {"total_steps": 10, "presets": ["banditAgent"]}, "actor": {"lr": 1e-5},
          "trainer": {"save_freq": 1}, "resume_config_changes": "refuse"}


def _run(tmp_path, steps=(1, 2, 3)):
    return [save_checkpoint(tmp_path, step, tensors={"trainer_state": {"w": torch.arange(64.)}},
                            config=CONFIG) for step in steps]


def _zero_first_bytes(path, count=200):
    data = bytearray(path.read_bytes())
    data[:count] = bytes(count)
    path.write_bytes(bytes(data))


def test_a_same_size_corruption_is_found_by_its_checksum(tmp_path):
    path = _run(tmp_path, (1,))[0]
    assert checkpoint_problem(path) is None
    _zero_first_bytes(path / "trainer_state.pt")
    assert "trainer_state.pt does not match its checksum" in checkpoint_problem(path)


@pytest.mark.parametrize("damage", ["truncate", "zero"])
def test_resume_skips_a_damaged_newest_checkpoint_with_a_warning(tmp_path, damage, caplog):
    first, second, newest = _run(tmp_path)
    state = newest / "trainer_state.pt"
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[:50])
    else:
        _zero_first_bytes(state)
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(tmp_path, "auto") == second
    assert f"checkpoint {newest} is damaged" in caplog.text and "trainer_state.pt" in caplog.text


def test_with_every_checkpoint_damaged_resume_stops_and_names_them(tmp_path):
    for path in _run(tmp_path):
        _zero_first_bytes(path / "trainer_state.pt")
    (tmp_path / "checkpoints" / "step_000002" / MARKER).unlink()
    with pytest.raises(ValueError, match="no intact checkpoint.*step_000003.*step_000002.*"
                                         "step_000001.*Nothing was started"):
        resume_checkpoint(tmp_path, "auto")


def test_an_explicit_damaged_checkpoint_is_refused_by_name(tmp_path):
    path = _run(tmp_path, (1,))[0]
    _zero_first_bytes(path / "trainer_state.pt")
    with pytest.raises(ValueError, match=r"resume=.*step_000001.*checksum"):
        resume_checkpoint(tmp_path, str(path))


def test_loading_an_unreadable_state_file_names_it(tmp_path):
    path = _run(tmp_path, (1,))[0]
    _zero_first_bytes(path / "trainer_state.pt")
    with pytest.raises(ValueError, match=r"trainer_state.pt cannot be read.*is damaged"):
        load_checkpoint(path)


def test_a_changed_training_key_is_refused_naming_it_unless_allowed(tmp_path, caplog):
    path = _run(tmp_path, (2,))[0]
    changed = {**CONFIG, "actor": {"lr": 2e-5}, "trainer": {"save_freq": 5}}
    with pytest.raises(ValueError, match=r"actor.lr: 1e-05 -> 2e-05; allowed:.*"
                                         "resume_config_changes=allow") as refused:
        resume_checkpoint(tmp_path, "auto", changed)
    assert "save_freq" not in str(refused.value)  # logging settings may change
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(tmp_path, "auto",
                                 {**changed, "resume_config_changes": "allow"}) == path
    assert "actor.lr" in caplog.text
    check_resume(path, {**CONFIG, "train": {**CONFIG["train"], "total_steps": 50}})


def test_total_steps_below_the_checkpoint_step_is_refused(tmp_path):
    path = _run(tmp_path, (5,))[0]
    low = {**CONFIG, "train": {**CONFIG["train"], "total_steps": 3}}
    with pytest.raises(ValueError, match="train.total_steps=3 is below step 5"):
        check_resume(path, low)


def test_model_folder_takes_a_run_folders_newest_intact_checkpoint(tmp_path, tiny):
    model, tokenizer = tiny
    sft = tmp_path / "run" / "sft"
    paths = [save_checkpoint(sft, step, models={"actor": (model, tokenizer)}) for step in (1, 2)]
    assert model_folder(tmp_path / "run") == paths[1] / "actor"
    assert model_folder(paths[0]) == paths[0] / "actor"
    assert model_folder(paths[0] / "actor") == paths[0] / "actor"
    (paths[1] / "actor" / "config.json").write_text("{}")  # same size or not: damaged
    assert model_folder(sft) == paths[0] / "actor"
    with pytest.raises(ValueError, match="is damaged"):
        model_folder(paths[1])
    with pytest.raises(ValueError, match="no such file or folder"):
        model_folder(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no model, checkpoint or checkpoints/"):
        model_folder(tmp_path / "empty")


def test_a_run_resumed_before_a_damaged_checkpoint_replaces_it_and_keeps_its_own(tmp_path):
    """Resumed from step 2 past a damaged step 3, the run's next saves are the newest: the
    abandoned step 3 neither stays the "newest" nor pushes the good ones out of keep_last."""
    first, second, newest = _run(tmp_path)
    _zero_first_bytes(newest / "trainer_state.pt")
    assert resume_checkpoint(tmp_path, "auto") == second
    state = {"trainer_state": {"w": torch.arange(64.)}}
    save_checkpoint(tmp_path, 3, tensors=state, config=CONFIG, keep_last=1)
    assert resume_checkpoint(tmp_path, "auto").name == "step_000003"
    assert checkpoint_problem(resume_checkpoint(tmp_path, "auto")) is None
    _run(tmp_path, (4, 5))
    save_checkpoint(tmp_path, 4, tensors=state, config=CONFIG, keep_last=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_000003", "step_000004"]


def test_a_run_folder_with_an_sft_run_stands_for_the_sft_model_on_every_relaunch(tmp_path):
    """``agentrl train model=<sft run> run_dir=<the same folder>``: once PPO has saved its own
    checkpoints there, the same command still starts from the SFT model."""
    sft = save_checkpoint(tmp_path / "sft", 24, models={"actor": _FolderModel()}, config=CONFIG)
    first = model_folder(tmp_path)
    save_checkpoint(tmp_path, 5, models={"actor": _FolderModel()}, config=CONFIG)
    assert model_folder(tmp_path) == first == sft / "actor"


class _FolderModel:
    """A stand-in with ``save_pretrained``: a model folder with a config.json."""

    def save_pretrained(self, folder):
        from pathlib import Path

        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{}")
