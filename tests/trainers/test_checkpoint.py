"""Checkpoints: atomic saves, finding the newest complete one, keep-last-K, exact round trips."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.trainers import checkpoint as ckpt
from agentrl.trainers.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_weights,
    save_checkpoint,
)
from agentrl.trainers.resume import resume_checkpoint
from agentrl.trainers.rng_state import capture_rng_state, restore_rng_state


def steps(run_dir) -> list[int]:
    return [checkpoint_step(p) for p in list_checkpoints(run_dir)]


def test_tiny_model_round_trips_with_tokenizer_critic_and_config(tiny, tmp_path):
    from agentrl.models import load_model

    model, tokenizer = tiny
    critic = torch.nn.Linear(4, 1)
    config = {"trainer": {"lr": 1e-5, "save_freq": 2}, "model": "tiny"}
    path = save_checkpoint(tmp_path, 2, models={"actor": (model, tokenizer)},
                           tensors={"critic": critic.state_dict()}, config=config)

    loaded = load_checkpoint(path)
    assert (loaded.path, loaded.step, loaded.config) == (path, 2, config)
    assert torch.equal(loaded.tensors["critic"]["weight"], critic.weight)
    reloaded, reloaded_tokenizer = load_model(str(loaded.model_dirs["actor"]))
    for name, value in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], value), name
    assert reloaded_tokenizer.encode("go left") == tokenizer.encode("go left")


def test_restore_weights_loads_in_place(tiny, tmp_path):
    model, _ = tiny
    path = save_checkpoint(tmp_path, 1, models={"actor": model})
    other = type(model)(model.config)  # fresh random weights, same shapes
    param = next(other.parameters())
    restore_weights(other, load_checkpoint(path).model_dirs["actor"])
    assert param is next(other.parameters())  # an optimizer holding it stays valid
    for name, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name


def test_restore_weights_loads_a_peft_adapter(tiny, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(0)
    trained = get_peft_model(type(model)(model.config), lora)
    path = save_checkpoint(tmp_path, 1, models={"actor": trained})
    assert (path / "actor" / "adapter_config.json").exists()
    torch.manual_seed(1)
    fresh = get_peft_model(type(model)(model.config), lora)
    restore_weights(fresh, path / "actor")
    adapters = {k: v for k, v in trained.state_dict().items() if "lora_" in k}
    assert adapters
    for name, value in adapters.items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_optimizer_and_scheduler_resume_the_same_update(tmp_path):
    def build():
        torch.manual_seed(0)
        net = torch.nn.Linear(3, 1)
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
        return net, optimizer, scheduler

    def train_step(net, optimizer, scheduler, x):
        optimizer.zero_grad()
        net(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()

    x = torch.randn(8, 3)
    net, optimizer, scheduler = build()
    train_step(net, optimizer, scheduler, x)
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    path = save_checkpoint(tmp_path, 1, tensors={"net": net.state_dict(), "trainer_state": state})
    train_step(net, optimizer, scheduler, x)

    resumed, resumed_optimizer, resumed_scheduler = build()
    loaded = load_checkpoint(path)
    resumed.load_state_dict(loaded.tensors["net"])
    resumed_optimizer.load_state_dict(loaded.tensors["trainer_state"]["optimizer"])
    resumed_scheduler.load_state_dict(loaded.tensors["trainer_state"]["scheduler"])
    train_step(resumed, resumed_optimizer, resumed_scheduler, x)
    assert torch.equal(resumed.weight, net.weight)
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()


def test_rng_state_round_trip_repeats_the_draws(tmp_path):
    generator = torch.Generator().manual_seed(5)

    def draws():
        return (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(),
                torch.rand(2, generator=generator).tolist())

    state = capture_rng_state({"sampler": generator})
    path = save_checkpoint(tmp_path, 1, tensors={"trainer_state": {"rng": state}})
    first = draws()
    assert draws() != first  # the generators moved on
    restore_rng_state(load_checkpoint(path).tensors["trainer_state"]["rng"], {"sampler": generator})
    assert draws() == first


def test_a_save_that_fails_before_its_marker_leaves_nothing_that_counts(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, tensors={"x": torch.zeros(2)})

    def crash(folder, step):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_marker", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, tensors={"x": torch.ones(2)})
    assert steps(tmp_path) == [1]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def test_crash_leftovers_are_ignored_then_cleaned_up(tmp_path):
    first = save_checkpoint(tmp_path, 1, tensors={"x": torch.zeros(2)})
    root = tmp_path / "checkpoints"
    # A process killed after writing its files, before its marker: the temporary folder stays.
    unfinished = root / f"step_000003.tmp-{os.getpid()}"
    shutil.copytree(first, unfinished)
    (unfinished / ckpt.MARKER).unlink()
    # A complete-looking folder whose file was truncated (a partial copy) and one with no marker.
    truncated = root / "step_000004"
    shutil.copytree(first, root / "step_000004")
    (truncated / "x.pt").write_bytes(b"")
    (truncated / ckpt.MARKER).write_text((first / ckpt.MARKER).read_text().replace('"step": 1',
                                                                                    '"step": 4'))
    shutil.copytree(first, root / "step_000005")
    (root / "step_000005" / ckpt.MARKER).unlink()

    assert latest_checkpoint(tmp_path) == first
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_checkpoint(truncated)
    save_checkpoint(tmp_path, 2, tensors={"x": torch.ones(2)})
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]


def test_keep_last_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, tensors={"x": torch.full((2,), float(step))}, keep_last=2)
    assert steps(tmp_path) == [4, 5]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000004", "step_000005"]
    latest = load_checkpoint(latest_checkpoint(tmp_path))
    assert latest.tensors["x"].tolist() == [5.0, 5.0]


def test_saving_a_step_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 3, tensors={"x": torch.zeros(1)})
    save_checkpoint(tmp_path, 3, tensors={"x": torch.ones(1)})
    assert steps(tmp_path) == [3]
    assert load_checkpoint(latest_checkpoint(tmp_path)).tensors["x"].item() == 1.0


def test_config_is_saved_plain_without_secrets(tmp_path):
    @dataclass(frozen=True)
    class Settings:
        run_dir: Path
        presets: tuple[str, ...]
        wandb: dict

    config = Settings(tmp_path / "run", ("a", "b"), {"api_key": "abcdef123456", "project": "p"})
    path = save_checkpoint(tmp_path, 1, config=config)
    assert load_checkpoint(path).config == {
        "run_dir": str(tmp_path / "run"), "presets": ["a", "b"],
        "wandb": {"api_key": "<redacted>", "project": "p"}}


def test_resume_modes(tmp_path):
    assert resume_checkpoint(tmp_path, "auto") is None
    path = save_checkpoint(tmp_path, 7, tensors={"x": torch.zeros(1)})
    assert resume_checkpoint(tmp_path, "auto") == path
    assert resume_checkpoint(tmp_path, "never") is None
    assert resume_checkpoint(tmp_path, str(path)) == path
    with pytest.raises(ValueError, match="resume='latest'.*auto, never"):
        resume_checkpoint(tmp_path, "latest")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tensors": {"config": 1}}, "tensors name 'config'"),
    ({"tensors": {"a/b": 1}}, "tensors name 'a/b'"),
    ({"tensors": {"x": 1}, "models": {"x": object()}}, "both models and tensors"),
    ({"keep_last": 0}, "keep_last must be a positive int"),
])
def test_bad_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        save_checkpoint(tmp_path, 1, **kwargs)
