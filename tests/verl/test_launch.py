"""The verl launch: presets -> verl overrides -> verl's own config checks, the dry run, the
scripts, and the config errors of the verl section. No GPU, no Ray, no model download."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from agentrl import cli
from agentrl.config import compose_config
from agentrl.trainers.tracking import read_metrics
from agentrl.verl import constrained, launch

ROOT = Path(__file__).resolve().parents[2]
GPU_PRESETS = ["a100", "h100", "l40"]
MODELS = ["qwen_halfb", "qwen_3b", "qwen_7b"]
EXAMPLES = sorted(ROOT.glob("examples/*_ppo/*.sh"))


def verl_config(overrides: list[str]):
    config = compose_config(overrides)
    return config, launch.compose_verl_config(launch.verl_overrides(config,
                                                                    launch.task_paths(config)))


def at(verl_cfg, key: str):
    return OmegaConf.select(verl_cfg, key)


# -- presets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("hardware", "model"), [  # the quick tier: every preset and model once
    pair if GPU_PRESETS.index(pair[0]) == MODELS.index(pair[1])
    else pytest.param(*pair, marks=pytest.mark.slow)
    for pair in itertools.product(GPU_PRESETS, MODELS)])
def test_every_gpu_preset_passes_verls_checks(hardware, model):
    config, cfg = verl_config([f"hardware={hardware}", f"model={model}"])
    v, gpus = config.verl, config.verl.nnodes * config.verl.n_gpus_per_node
    assert config.backend == "verl" and config.hardware.name == hardware
    assert at(cfg, "actor_rollout_ref.model.path") == at(cfg, "critic.model.path") == \
        config.model.name
    # groups: a row per group, n episodes per row
    assert at(cfg, "data.train_batch_size") == config.train.group_num
    assert at(cfg, "actor_rollout_ref.rollout.n") == config.train.group_size
    batch = config.train.group_num * config.train.group_size
    mini = at(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size") * config.train.group_size
    assert batch % mini == 0 and mini % gpus == 0
    assert 1 <= at(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") <= mini // gpus
    # hardware
    assert (at(cfg, "trainer.nnodes"), at(cfg, "trainer.n_gpus_per_node")) == (
        v.nnodes, v.n_gpus_per_node)
    assert at(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size") == \
        v.tensor_model_parallel_size
    assert at(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization") == \
        v.gpu_memory_utilization
    for fsdp in ("actor_rollout_ref.actor.fsdp_config", "critic.fsdp"):
        assert at(cfg, f"{fsdp}.param_offload") == v.param_offload
        assert at(cfg, f"{fsdp}.optimizer_offload") == v.optimizer_offload
    # lengths: the rollout follows the data section
    assert at(cfg, "actor_rollout_ref.rollout.prompt_length") == v.max_prompt_length
    assert at(cfg, "actor_rollout_ref.rollout.response_length") == v.max_response_length
    # the algorithm, the loop, validation and checkpoints
    assert (at(cfg, "algorithm.adv_estimator"), at(cfg, "algorithm.gamma")) == ("gae", 1.0)
    assert at(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop") == "agentrl_game"
    assert at(cfg, "actor_rollout_ref.model.external_lib") == "agentrl.verl.agent_loop"
    assert at(cfg, "trainer.use_v1") is False
    assert at(cfg, "actor_rollout_ref.rollout.val_kwargs.temperature") == 0
    assert at(cfg, "trainer.test_freq") == config.val.test_freq
    assert at(cfg, "trainer.total_training_steps") == config.train.total_steps
    assert at(cfg, "trainer.default_local_dir") == str(config.run_dir / "checkpoints")
    # + verl's file logger, which agentrl.verl.metrics copies into metrics.jsonl
    assert list(at(cfg, "trainer.logger")) == ["console", "wandb", "file"]


def test_smaller_models_get_larger_micro_batches_on_the_same_gpu():
    """configs/sizing/ is picked by the model preset's name (hydra defaults interpolation)."""
    for hardware in GPU_PRESETS:
        sizes = [compose_config([f"hardware={hardware}", f"model={m}"]) for m in MODELS]
        micro = [c.actor.micro_batch_size for c in sizes]
        assert micro == sorted(micro, reverse=True) and micro[0] > micro[-1]
        assert len({c.train.group_num * c.train.group_size for c in sizes}) == 1


def test_h100_is_the_a100_preset_with_its_own_name():
    a100, h100 = (compose_config([f"hardware={h}", "model=qwen_7b"]).to_dict()
                  for h in ("a100", "h100"))
    assert a100.pop("hardware") != h100.pop("hardware") and a100 == h100


# -- key mapping -----------------------------------------------------------------------------------
def test_our_keys_reach_verls(tmp_path):
    checkpoint = tmp_path / "step_000004"
    checkpoint.mkdir()
    config, cfg = verl_config([
        "hardware=a100", "model=qwen_halfb", "val.test_freq=0", "trainer.save_freq=0",
        "train.total_steps=7", f"resume={checkpoint}", "rollout.top_k=0", "lora.rank=8",
        "model.chat_template=chatml", "critic.ppo_epochs=3", "actor.ppo_mini_batch_size=64",
        "trainer.logger=[console]", "val.group_size=2", "verl.trainer=v1",
        "critic.pretrain_steps=2", "verl.overrides=['trainer.log_val_generations=4','algorithm.lam=0.9']"])
    assert at(cfg, "trainer.test_freq") == -1                      # 0 = never
    assert at(cfg, "trainer.save_freq") == 7                       # 0 = only at the end
    assert at(cfg, "trainer.resume_mode") == "resume_path"
    assert at(cfg, "trainer.resume_from_path") == str(checkpoint)
    assert at(cfg, "actor_rollout_ref.rollout.top_k") == -1
    assert at(cfg, "actor_rollout_ref.model.lora_rank") == 8
    # with LoRA no Hugging Face model in the actor's checkpoint (an adapter-wrapped state dict)
    assert list(at(cfg, "actor_rollout_ref.actor.checkpoint.save_contents")) == [
        "model", "optimizer", "extra"]
    assert at(cfg, "actor_rollout_ref.model.custom_chat_template").startswith("{%")
    assert at(cfg, "critic.ppo_epochs") == 3
    assert at(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size") == 64 // 16
    assert list(at(cfg, "trainer.logger")) == ["console", "file"]  # + verl's, for metrics.jsonl
    assert at(cfg, "actor_rollout_ref.rollout.val_kwargs.n") == 2
    assert at(cfg, "trainer.use_v1") is True
    assert at(cfg, "actor_rollout_ref.rollout.agent.agent_loop_manager_class") == \
        "agentrl.verl.agent_loop_v1.GameAgentLoopManagerTQ"
    # V1's rows pass its replay buffer: ours logs them, told where by verl's own keys
    sampler = "trainer.v1.sampler"
    assert (at(cfg, f"{sampler}.custom_sampler.path"), at(cfg, f"{sampler}.custom_sampler.name")
            ) == ("pkg://agentrl.verl.agent_loop_v1", "GameReplayBuffer")
    kwargs = OmegaConf.to_container(at(cfg, f"{sampler}.sampler_kwargs"), resolve=True)
    assert kwargs == {"default_local_dir": str(config.run_dir / "checkpoints"),
                      "logger": ["console", "file"], "agentrl_log_episodes": 4,
                      "n": at(cfg, "actor_rollout_ref.rollout.n"), "val_n": 2}
    assert at(cfg, "trainer.critic_warmup") == 3  # verl's steps count from 1: 2 critic-only
    assert at(cfg, "trainer.log_val_generations") == 4
    assert at(cfg, "algorithm.lam") == 0.9                         # raw overrides win
    assert config.algorithm.lam == 1.0


def test_every_actor_checkpoint_holds_its_hugging_face_model():
    """What `agentrl eval <run>` loads: global_step_N/actor/huggingface with its weights."""
    _, cfg = verl_config(["hardware=a100", "model=qwen_halfb"])
    assert "hf_model" in at(cfg, "actor_rollout_ref.actor.checkpoint.save_contents")


@pytest.mark.parametrize("resume, mode", [("auto", "auto"), ("never", "disable")])
def test_resume_modes(resume, mode):
    _, cfg = verl_config(["hardware=l40", "model=qwen_3b", f"resume={resume}"])
    assert at(cfg, "trainer.resume_mode") == mode


@pytest.mark.parametrize("text", ["plain", "with space", "it's", "back\\slash\\", "null", "123",
                                  "a,b=[c]", "{{ x }}", "${trainer.nnodes}", "q'\\'"])
def test_strings_survive_hydras_override_grammar(text):
    cfg = launch.compose_verl_config(
        [f"trainer.experiment_name={launch.hydra_value(text)}"], validate=False)
    assert cfg.trainer.experiment_name == text


def test_micro_batches_are_capped_to_a_gpus_share():
    config = compose_config(["hardware=a100", "model=qwen_halfb", "verl.nnodes=2"])
    assert config.actor.micro_batch_size == 4
    assert launch.micro_batch_per_gpu(config) == 32 // 16


# -- verl's own checks -----------------------------------------------------------------------------
def test_verls_rejections_name_verls_keys():
    config = compose_config(["hardware=a100", "model=qwen_7b",
                             "verl.overrides=['actor_rollout_ref.actor.ppo_micro_batch_size=4']"])
    with pytest.raises(ValueError, match="verl's config check failed.*ppo_micro_batch_size"):
        launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))
    config = compose_config(["hardware=a100", "model=qwen_7b", "verl.overrides=['trainer.nope=1']"])
    with pytest.raises(ValueError, match="rejects an override.*nope"):
        launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))


@pytest.fixture(scope="module")
def local_model(tmp_path_factory) -> Path:
    """The tiny model's config and tokenizer as an HF folder (verl's HFModelConfig reads it)."""
    from agentrl.models import load_model

    model, tokenizer = load_model("tiny")
    folder = tmp_path_factory.mktemp("tiny-hf")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_local_model_folder_is_checked_too(local_model, tmp_path):
    """With a folder, verl's HFModelConfig is built as well: it reads the model's files."""
    folder = shutil.copytree(local_model, tmp_path / "model")
    config, cfg = verl_config(["hardware=a100", f"model.name={folder}"])
    assert at(cfg, "actor_rollout_ref.model.path") == str(folder)
    (folder / "config.json").write_text("{broken")
    with pytest.raises(ValueError, match="verl's config check failed"):
        launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))


# -- the dry run and the launch --------------------------------------------------------------------
def test_dry_run_prints_verls_config_and_the_command_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--dry-run", "hardware=l40", "model=qwen_7b",
                     f"run_dir={run_dir}"]) == 0
    out = capsys.readouterr().out
    printed, command = out.split("# verl's config above passed verl's checks.")
    cfg = yaml.safe_load(printed)
    assert cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 2
    assert cfg["actor_rollout_ref"]["rollout"]["response_length"] == 4096  # resolved
    assert cfg["data"]["train_files"] == str(run_dir / "data" / "train.parquet")
    assert "-m verl.trainer.main_ppo" in command and "data.train_batch_size=4" in command
    assert f"hydra.run.dir={run_dir / 'verl'}" in command
    assert not run_dir.exists()


def test_launch_writes_tasks_and_config_then_runs_verl(tmp_path, monkeypatch,
                                                       embedded_prompt_tokenizer):
    calls = []

    verl_log = tmp_path / "verl" / "tracking.jsonl"  # verl's file logger's

    def verl_line(step: int) -> str:
        return json.dumps({"step": step, "data": {"training/global_step": step,
                                                  "actor/pg_loss": step / 10}}) + "\n"

    def verl_run(command, env):
        calls.append((command, env))
        # what a killed launch's verl logged last is in, before verl empties its log
        assert [r.get("actor/pg_loss") for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.0]
        assert not verl_log.exists() and verl_log.parent.is_dir()
        records = [{"step": s, "time": 0, "train/p/success": s / 2} for s in (1, 2)]
        with (tmp_path / "metrics.jsonl").open("a") as file:
            file.write("".join(f"{json.dumps(r)}\n" for r in records))
        verl_log.write_text(verl_line(1) + verl_line(2))  # step 2: logged after our last batch
        return 3  # what our manager writes, then an error

    verl_log.parent.mkdir(parents=True)
    verl_log.write_text(verl_line(0))
    monkeypatch.setattr(launch, "run_verl", verl_run)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    config = compose_config(["hardware=l40", "model=qwen_halfb", f"run_dir={tmp_path}",
                             "train.total_steps=2", "val.group_num=2",
                             "trainer.wandb_mode=disabled"])
    assert launch.launch(config) == 3                              # verl's exit status
    (command, env), = calls
    assert command[1:3] == ["-m", launch.VERL_ENTRY]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert env["WANDB_MODE"] == "disabled" and env["WANDB_DIR"] == str(tmp_path)
    train, val = launch.task_paths(config)
    assert f"data.train_files={train}" in command and f"data.val_files={val}" in command
    import pyarrow.parquet as pq

    assert pq.read_metadata(train).num_rows == 2 * 4 and pq.read_metadata(val).num_rows == 2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["hardware"]["name"] == "l40"
    assert (tmp_path / "learning_curves.png").stat().st_size > 0  # drawn from our metrics
    assert env["VERL_FILE_LOGGER_PATH"] == str(verl_log) and not verl_log.exists()
    assert [(r["step"], "actor/pg_loss" in r) for r in read_metrics(tmp_path / "metrics.jsonl")
            ] == [(0, True), (1, False), (1, True), (2, False), (2, True)]  # each once, in order


# -- config errors of the verl section -------------------------------------------------------------
GPU = ["hardware=a100", "model=qwen_halfb"]
WINDOWED = [*GPU, "verl.trainer=v1", "train.presets=[simpleSokobanAgent]",
            "val.presets=[simpleSokobanAgent]", "agents.simpleSokobanAgent.history_window=2",
            "algorithm.lam=1.0", "algorithm.gamma=1.0"]


@pytest.mark.parametrize("overrides, message", [
    (["hardware=a100", "model.name=tiny"], r"model.name='tiny' is not allowed with backend='verl'"),
    (["hardware=a100", "verl.nnodes=2"], r"model.name='embedded' is not allowed with verl.nnodes=2"),
    ([*GPU, "verl.tensor_model_parallel_size=3"],
     r"tensor_model_parallel_size=3 is not allowed.*allowed: \[1, 2, 4, 8\]"),
    ([*GPU, "verl.n_gpus_per_node=5"], r"128 trajectories per step is not allowed on .* 5 GPUs"),
    ([*GPU, "verl.agent_workers=5"], r"verl.agent_workers=5 is not allowed.*legacy"),
    ([*GPU, "actor.ppo_mini_batch_size=8"], r"ppo_mini_batch_size=8 is not allowed.*group_size=16"),
    ([*GPU, "rollout.filter_ratio=0.5"], r"filter_ratio=0.5 is not allowed with backend='verl'"),
    ([*GPU, "rollout.norm_method=mean_std"], r"rollout.norm_method='mean_std' is not allowed"),
    ([*GPU, "critic.share_backbone=true"], r"critic.share_backbone=True is not allowed"),
    ([*GPU, "verl.gpu_memory_utilization=1.5"], r"verl.gpu_memory_utilization=1.5 is not allowed"),
    ([*GPU, "verl.strategy=ddp"], r"verl.strategy='ddp' is not allowed; allowed: \['fsdp'"),
    ([*GPU, "verl.trainer=v2"], r"verl.trainer='v2' is not allowed; allowed: \['legacy', 'v1'\]"),
    ([*GPU, "verl.overrides=[no_equals_sign]"], r"verl.overrides=.* is not allowed.*'key=value'"),
    ([*GPU, "verl.n_gpus=8"], r"unknown key 'verl.n_gpus'"),
    ([*GPU, "algorithm.gamma_unit=turn", "algorithm.lam=0.95"],
     r"algorithm.lam=0.95 is not allowed with algorithm.gamma_unit=.turn. on backend=.verl."),
    ([*GPU, "train.presets=[simpleSokobanAgent]", "agents.simpleSokobanAgent.history_window=2"],
     r"agents.simpleSokobanAgent.history_window=2 is not allowed with verl.trainer='legacy'.*"
     r"allowed: verl.trainer=v1"),
    ([*WINDOWED, "algorithm.lam=0.95"],
     r"algorithm.lam=0.95 is not allowed with agents.simpleSokobanAgent.history_window=2"),
    ([*WINDOWED, "algorithm.use_kl_in_reward=true"],
     r"algorithm.use_kl_in_reward=True is not allowed with agents.simpleSokobanAgent.history_"
     r"window=2 on verl.*allowed: False"),
    ([*WINDOWED, "algorithm.gamma=0.99"], r"algorithm.gamma=0.99 is not allowed with agents."
     r"simpleSokobanAgent.history_window=2 .*allowed: 1.0, or algorithm.gamma_unit=turn"),
])
def test_verl_section_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        compose_config(overrides)


@pytest.mark.slow   # converts the GGUF on a cold cache (15-40 s)
def test_the_embedded_model_goes_to_verl_as_its_converted_folder(tmp_path):
    """``model.name=embedded`` on verl: the workers load the folder the local engine converted
    the GGUF into (one Hugging Face architecture, as verl asserts), written at launch."""
    import json

    from agentrl.models.embedded import embedded_model_folder
    from agentrl.verl.launch import model_path, write_model_folder

    config = compose_config(["hardware=cpu-verl", "model=embedded", f"run_dir={tmp_path}"])
    assert config.backend == "verl" and config.model.name == "embedded"
    write_model_folder(config)
    folder = Path(model_path(config))
    assert folder == embedded_model_folder() and folder.is_absolute()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (folder / "model.safetensors").exists() and (folder / "chat_template.jinja").exists()


def test_context_windows_run_on_verls_v1_trainer_with_whole_episode_returns():
    config = compose_config([*WINDOWED, "rollout.constrained_actions=true"])
    assert config.agents["simpleSokobanAgent"].history_window == 2
    assert config.rollout.constrained_actions and config.verl.trainer == "v1"
    turn = compose_config([*WINDOWED, "algorithm.gamma_unit=turn", "algorithm.gamma=0.9"])
    assert turn.algorithm.gamma == 0.9  # a turn discount rides in the reshaped turn rewards


def test_constrained_actions_default_on_locally_off_on_verl():
    assert compose_config([]).constrained_actions
    assert not compose_config(["rollout.constrained_actions=false"]).constrained_actions
    assert not compose_config(GPU).constrained_actions  # null: off on verl, no error


def test_constrained_actions_on_verl_mask_the_sampler_and_the_actor():
    config, cfg = verl_config([*GPU, "rollout.constrained_actions=true"])
    assert config.constrained_actions
    assert list(at(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors")) == [
        constrained.PROCESSOR]
    env = launch.launch_env(config, base={})
    assert env["VERL_ENGINE_VENDOR"] == constrained.ENGINE_VENDOR
    assert constrained.ENGINE_MODULE in env["VERL_USE_EXTERNAL_MODULES"].split(",")
    runtime = at(cfg, "ray_kwargs.ray_init.runtime_env.env_vars")  # what every Ray worker gets
    assert runtime["VERL_ENGINE_VENDOR"] == constrained.ENGINE_VENDOR
    assert runtime["VERL_USE_EXTERNAL_MODULES"] == env["VERL_USE_EXTERNAL_MODULES"]
    constrained.check_verl_config(cfg)
    _, plain = verl_config(GPU)
    assert at(plain, "actor_rollout_ref.rollout.engine_kwargs.vllm") == {}
    assert constrained.ENGINE_MODULE not in launch.launch_env(
        compose_config(GPU), base={})["VERL_USE_EXTERNAL_MODULES"]


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.model.use_fused_kernels=true", r"use_fused_kernels=True .*logits"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
     r"ulysses_sequence_parallel_size=2 .*splits"),
    ("actor_rollout_ref.model.mtp.enable=true", r"mtp.enable=True .*speculative"),
    ("+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={method:ngram}",
     r"speculative_config=.* .*speculative"),
])
def test_constrained_actions_refuse_what_cannot_train_on_masks(override, message, tmp_path):
    config = compose_config([*GPU, "rollout.constrained_actions=true", f"run_dir={tmp_path}",
                             f"verl.overrides=['{override}']"])
    with pytest.raises(ValueError, match=message.replace(
            " .*", " is not allowed with rollout.constrained_actions=true: .*")):
        launch.launch(config, dry_run=True)


def test_the_legacy_worker_rule_does_not_bind_v1():
    config = compose_config([*GPU, "verl.agent_workers=5", "verl.trainer=v1"])
    assert config.verl.agent_workers == 5


def test_verl_rules_leave_the_local_backend_alone():
    config = compose_config(["verl.tensor_model_parallel_size=3", "rollout.filter_ratio=0.5"])
    assert config.backend == "local"


# -- the scripts -----------------------------------------------------------------------------------
def run_script(script: Path, *args: str, path_prefix: Path | None = None
               ) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("HARDWARE", None)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT, check=False)


@pytest.fixture
def recording_python(tmp_path) -> tuple[Path, Path]:
    """A ``python`` first on PATH that records an ``agentrl.cli`` command instead of running it
    (everything else goes to the real interpreter): the script's own work, without paying
    verl's import in one more process per script."""
    record = tmp_path / "command"
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f"""#!/usr/bin/env bash
if [[ "${{1-}}" == -m && "${{2-}}" == agentrl.cli ]]; then
  printf '%s\\n' "${{@:3}}" > {record}; exit 0
fi
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    return shim.parent, record


def test_there_are_twelve_example_scripts():
    assert [f"{p.parent.name}/{p.stem}" for p in EXAMPLES] == [
        f"{game}_ppo/{model}" for game in ("blocksworld", "sokoban", "tetris", "textworld")
        for model in sorted(MODELS)]


@pytest.mark.parametrize("script", [  # one quick, the others (~2.5 s each) in the full suite
    script if script.match("sokoban_ppo/qwen_halfb.sh")
    else pytest.param(script, marks=pytest.mark.slow) for script in EXAMPLES],
    ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_example_dry_run_resolves_and_validates(script, recording_python, capsys):
    """The script's ``agentrl train --dry-run`` command, run here: verl's config checks pass."""
    bin_dir, record = recording_python
    done = run_script(script, "--dry-run", "8", path_prefix=bin_dir)  # 8 GPUs: verl's plan
    assert done.returncode == 0, done.stderr[-3000:]
    command = record.read_text().splitlines()
    assert command[:2] == ["train", "--dry-run"]
    assert cli.main(command) == 0
    out = capsys.readouterr().out
    game, model = script.parent.name.removesuffix("_ppo"), script.stem
    assert f"actor_rollout_ref.model.path={compose_config([f'model={model}']).model.name}" in out
    assert f"trainer.experiment_name={game}_ppo-{model}" in out
    data = yaml.safe_load(out.split("# verl's config above")[0])["data"]
    assert Path(data["train_files"]).parts[-3:] == (f"{game}_ppo-{model}", "data",
                                                    "train.parquet")


@pytest.mark.slow
def test_quick_train_dry_run_spreads_gpus_over_nodes():
    """End to end, no stand-in: the script, agentrl, verl's checks, in their own processes."""
    done = run_script(ROOT / "quick_train.sh", "--dry-run", "16", "", "", "", "", "", "", "8",
                      "agentrl", "two-nodes", "qwen_3b", "5", "actor.lr=3e-6")
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in ("trainer.nnodes=2", "trainer.n_gpus_per_node=8",
                     "trainer.total_training_steps=5", "actor_rollout_ref.actor.optim.lr=3e-06",
                     "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct"):
        assert expected in done.stdout


def test_positional_arguments_become_overrides(recording_python):
    bin_dir, record = recording_python
    done = run_script(EXAMPLES[0], "--dry-run", "4", "6", "", "3", "", "", "[banditAgent]", "",
                      "proj", "", "", "9", "actor.lr=2e-6", path_prefix=bin_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    command = record.read_text().splitlines()
    for expected in ("backend=verl", "hardware=a100", "verl.n_gpus_per_node=4", "verl.nnodes=1",
                     "train.group_num=6", "val.group_num=3", "val.presets=[banditAgent]",
                     "project=proj", "train.total_steps=9", "model=qwen_3b"):
        assert expected in command
    assert command[-1] == "actor.lr=2e-6"                          # pass-through comes last
    assert not any(arg.startswith("train.group_size=") for arg in command)  # "" keeps a preset


def test_scripts_reject_bad_positional_arguments():
    done = run_script(EXAMPLES[0], "--dry-run", "8", "many")
    assert done.returncode == 2 and "GROUP_NUM must be a whole number, got 'many'" in done.stderr
    done = run_script(EXAMPLES[0], "--dry-run", "12", "", "", "", "", "", "", "8")
    assert done.returncode == 2 and re.search(r"GPUS=12 .* GPUS_PER_NODE=8", done.stderr)


def fake_nvidia_smi(folder: Path, name: str, memory_mib: int) -> Path:
    """An ``nvidia-smi`` answering the queries scripts/positional_args.sh makes, for one GPU."""
    script = folder / "nvidia-smi"
    script.write_text(f"""#!/usr/bin/env bash
case "$*" in
  -L) echo "GPU 0: {name} (UUID: GPU-0)" ;;
  *query-gpu=name*) echo "{name}" ;;
  *query-gpu=memory.total*) echo "{memory_mib}" ;;
  *) exit 1 ;;
esac
""")
    script.chmod(0o755)
    return folder


@pytest.mark.parametrize(("name", "memory_mib", "preset"), [
    ("NVIDIA A100-SXM4-80GB", 81920, "a100"), ("NVIDIA A100-SXM4-40GB", 40960, "l40"),
    ("NVIDIA A800-PCIE-40GB", 40960, "l40"), ("NVIDIA H100 80GB HBM3", 81559, "h100"),
    ("NVIDIA H200", 143771, "h100"), ("NVIDIA L40S", 46068, "l40"),
])
def test_the_gpu_preset_follows_the_cards_memory_and_the_real_memory_is_passed(
        tmp_path, name, memory_mib, preset):
    """A 40 GB A100 gets the 48 GB sizes, and the preflight its real memory to fit them to."""
    fake_nvidia_smi(tmp_path, name, memory_mib)
    done = subprocess.run(
        ["bash", "-c", f"source {ROOT}/scripts/positional_args.sh; gpu_hardware_preset; "
         "gpu_memory_gb"], capture_output=True, text=True, check=False,
        env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    found, memory_gb = done.stdout.split()
    assert found == preset
    assert float(memory_gb) == pytest.approx(memory_mib * 2**20 / 1e9, abs=0.1)


def test_the_examples_count_every_gpu_of_a_running_ray_cluster(tmp_path):
    """Two nodes of 8 under `ray start`: the script's default is 16 GPUs on 2 nodes, not this
    node's 8 with the second idle. A ``python`` stand-in answers the cluster query and the
    set-up, and records the train command."""
    record, prefix = tmp_path / "command", tmp_path / "prefix"
    prefix.mkdir()
    bin_dir = fake_nvidia_smi(tmp_path, "NVIDIA H100 80GB HBM3", 81559)
    (bin_dir / "python").write_text(f"""#!/usr/bin/env bash
case "${{1-}} ${{2-}}" in
  "-m agentrl.verl.cluster") echo "16 8"; exit 0 ;;
  "-m agentrl.cli") printf '%s\\n' "${{@:3}}" > {record}; exit 0 ;;
esac
if [[ "${{1-}}" == -c && "${{2-}}" == *sys.prefix* ]]; then echo {prefix}; fi
exit 0
""")
    (bin_dir / "python").chmod(0o755)
    done = run_script(EXAMPLES[0], path_prefix=bin_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the running Ray cluster has 16 GPUs, 8 per node" in done.stderr
    command = record.read_text().splitlines()
    assert {"backend=verl", "verl.n_gpus_per_node=8", "verl.nnodes=2"} <= set(command)


def test_verls_actor_workers_find_agentrls_policy_losses():
    """``actor.policy_loss=self_imitation`` reaches verl's loss_mode, and the module verl's
    workers import (``external_lib``) registers it: checked in a fresh interpreter, where
    nothing else has imported agentrl's losses."""
    _, cfg = verl_config(["hardware=a100", "model=qwen_halfb", "actor.policy_loss=self_imitation"])
    assert at(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode") == "self_imitation"
    external_lib = at(cfg, "actor_rollout_ref.model.external_lib")
    script = ("import importlib; from verl.trainer.ppo import core_algos; "
              "assert 'self_imitation' not in core_algos.POLICY_LOSS_REGISTRY; "
              f"importlib.import_module({external_lib!r}); "
              "core_algos.get_policy_loss_fn('self_imitation')")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)


VERL_STAND_IN = ("import signal, time; signal.signal(signal.SIGINT, lambda *a: exit(0)); "
                 "print('verl running', flush=True); time.sleep(30)")
"""A child that ends when Ctrl-C reaches it, as verl's main_ppo does."""


def test_ctrl_c_during_the_verl_run_ends_it_and_returns_130_without_a_traceback(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group: verl's child ends, and the launch
    returns 130 for the command's one stop line (before, ``subprocess.run`` raised
    ``KeyboardInterrupt``: a traceback, and the process killed by the signal)."""
    script = tmp_path / "launch_verl.py"
    # Ctrl-C as a terminal delivers it: a suite started in the background (``cmd &`` in a
    # script) passes SIGINT on ignored, and the launch would never see it
    script.write_text("import signal, sys\nfrom agentrl.verl.launch import run_verl\n"
                      "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                      f"sys.exit(run_verl([sys.executable, '-c', {VERL_STAND_IN!r}], None))\n")
    process = subprocess.Popen([sys.executable, str(script)], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "verl running"
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == launch.EXIT_INTERRUPTED
    assert "Traceback" not in err


def test_a_verl_run_starts_its_own_wandb_service():
    """A parent's WandB service (``WANDB_SERVICE``, set by any ``wandb.init`` in it) would
    outlive a killed run and keep its run id "in use", refusing the resume: the launch drops it."""
    base = {"WANDB_SERVICE": "3-5808-unix-/tmp/wandb-5808/socket", "HOME": "/home/user"}
    env = launch.launch_env(compose_config(GPU), base=base)
    assert "WANDB_SERVICE" not in env and env["HOME"] == "/home/user"
    assert base["WANDB_SERVICE"]                     # the caller's mapping is left as it was
