"""verl's SFT: our demonstrations as the parquet verl's own multi-turn dataset reads, and the
SFT launch's dry run checked by verl's config classes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf
from verl_runs import cpu_sft_config, weight_distance

from agentrl import cli
from agentrl.config import compose_config
from agentrl.rollout.demonstrations import demonstration_seeds
from agentrl.verl import sft as verl_sft

PRESET = "quickSokobanAgent"


def test_make_data_sft_writes_what_verls_multiturn_dataset_learns(tmp_path, model_dir, capsys):
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    out = tmp_path / "data"
    assert cli.main(["make-data", "--sft", "--out", str(out), f"sft.presets=[{PRESET}]",
                     "sft.episodes=4", f"val.presets=[{PRESET}]", "val.group_num=2"]) == 0
    assert "sft_train.parquet: 4 rows" in capsys.readouterr().out
    rows = pd.read_parquet(out / verl_sft.SFT_TRAIN_FILE)
    assert rows["seed"].tolist() == demonstration_seeds(4, seed=0)
    assert len(pd.read_parquet(out / verl_sft.SFT_VAL_FILE)) == 2
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = MultiTurnSFTDataset(str(out / verl_sft.SFT_TRAIN_FILE), tokenizer, OmegaConf.create(
        {"messages_key": "messages", "max_length": 2048, "pad_mode": "no_padding"}))
    for index in range(len(dataset)):  # verl's own check: per-message ids == whole-chat ids
        item = dataset[index]
        learned = tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
        replies = [m["content"] for m in rows["messages"][index] if m["role"] == "assistant"]
        assert learned.startswith(replies[0]) and all(r in learned for r in replies)
        assert all(r.startswith("<answer>") for r in replies)  # the preset's answer format


def test_random_turns_are_refused_for_verls_data(tmp_path):
    config = compose_config([f"sft.presets=[{PRESET}]", "sft.random_action_share=0.2"])
    with pytest.raises(ValueError, match="sft.random_action_share=0.2 is not allowed"):
        verl_sft.write_sft_data(config, tmp_path)


def test_sft_dry_run_prints_verls_checked_config_and_the_command(tmp_path, model_dir, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["sft", "--dry-run", "backend=verl", "hardware=a100",
                     f"model.name={model_dir}", f"run_dir={run_dir}", "sft.mini_batch_size=16",
                     "sft.micro_batch_size=2", "sft.epochs=2", "lora.rank=8"]) == 0
    printed, command = capsys.readouterr().out.split("# verl's SFT config above passed")
    cfg = yaml.safe_load(printed)
    assert cfg["data"]["train_batch_size"] == 16 and cfg["data"]["micro_batch_size_per_gpu"] == 2
    assert cfg["data"]["train_files"] == str(run_dir / "sft" / "data" / "sft_train.parquet")
    assert cfg["model"]["lora_rank"] == 8 and cfg["trainer"]["total_epochs"] == 2
    assert "-m verl.trainer.sft_trainer" in command and "--nproc_per_node=8" in command
    assert not run_dir.exists()


def test_sft_config_errors_name_the_key(model_dir):
    with pytest.raises(ValueError, match="sft.mini_batch_size=4 is not allowed on 8 GPUs"):
        verl_sft.launch_sft(compose_config(["backend=verl", "hardware=a100",
                                            f"model.name={model_dir}", "sft.mini_batch_size=4",
                                            "sft.micro_batch_size=2"]), dry_run=True)
    with pytest.raises(ValueError, match="rejects an override"):
        verl_sft.compose_sft_config(["trainer.no_such_key=1"])


def test_launch_writes_the_data_then_runs_torchrun(tmp_path, model_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(verl_sft.subprocess, "run",
                        lambda command, env, check: calls.append(command)
                        or subprocess.CompletedProcess(command, 0))
    config = compose_config(["backend=verl", "hardware=a100", f"model.name={model_dir}",
                             f"run_dir={tmp_path}", f"sft.presets=[{PRESET}]", "sft.episodes=8",
                             f"val.presets=[{PRESET}]"])
    assert verl_sft.launch_sft(config) == 0
    train, _ = verl_sft.sft_paths(config)
    assert len(pd.read_parquet(train)) == 8
    assert calls and calls[0][1:3] == ["-m", "torch.distributed.run"]


def test_cpu_verl_sft_runs_on_the_cpu_platform(tmp_path):
    """hardware=cpu-verl: verl's SFT trainer on this CPU, on the model the PPO launch loads."""
    from agentrl.verl.launch import model_path

    config = cpu_sft_config(tmp_path)
    cfg = verl_sft.compose_sft_config(verl_sft.sft_overrides(config, verl_sft.sft_paths(config)))
    assert cfg.trainer.device == "cpu" and cfg.model.use_remove_padding is False
    assert cfg.model.override_config.attn_implementation == "sdpa"
    assert cfg.engine.mixed_precision.param_dtype == "fp32" and cfg.engine.strategy == "fsdp2"
    assert cfg.model.path == model_path(config).removesuffix("/")   # tiny-vllm-hf, not a hub id


@pytest.mark.slow
def test_verls_sft_trainer_runs_on_cpu_and_saves_a_model_ppo_starts_from(verl_sft_folder, tmp_path):
    """torchrun + verl's own SFT trainer, one step on this CPU (gloo, fp32, sdpa; conftest's
    ``verl_sft_folder``): a Hugging Face model folder in its checkpoint with what a PPO run
    loads besides the weights (the tokenizer and its chat template, the generation config's
    end-of-sequence ids), which ``agentrl train model.name=`` resolves to.
    ``test_cpu_trainer.py`` runs verl's PPO from it."""
    from transformers import AutoTokenizer, GenerationConfig

    from agentrl.verl.launch import model_path

    folder, base = verl_sft_folder, Path(model_path(cpu_sft_config(tmp_path)))
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    assert weight_distance(folder, base) > 0.5    # the step learned (lr 1e-3): not the base's
    tokenizer, base_tokenizer = (AutoTokenizer.from_pretrained(path) for path in (folder, base))
    assert tokenizer.chat_template and tokenizer.chat_template == base_tokenizer.chat_template
    assert tokenizer.get_vocab() == base_tokenizer.get_vocab()
    ends = GenerationConfig.from_pretrained(folder).eos_token_id
    assert ends == GenerationConfig.from_pretrained(base).eos_token_id is not None
    ppo = compose_config(["hardware=cpu-verl", f"model.name={folder}", f"run_dir={tmp_path}/ppo"])
    assert model_path(ppo) == str(folder.resolve())
