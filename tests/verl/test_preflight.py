"""The launch preflight: every configuration the presets and scripts make either passes verl's
dispatch (replayed here with verl's own splitting code) or is refused before Ray, naming a key.
No GPU, no Ray."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from verl_fakes import fake_transfer_queue

from agentrl import cli
from agentrl.config import compose_config
from agentrl.verl import constrained, launch, preflight

ROOT = Path(__file__).resolve().parents[2]

GPU_PRESETS = ["a100", "l40"]
"""h100 is a100 with its own name (tests/verl/test_launch.py): the same sizes, the same checks."""
MODELS = ["qwen_halfb", "qwen_3b", "qwen_7b"]
SHAPES = [None, (2, 4), (4, 8), (8, 16)]
"""Group shapes (group_num, group_size): the presets' own (examples/*.sh), quick_train.sh's
local-engine defaults given as positional arguments (``quick_train.sh 8 2 4``), and the L40 and
A100 presets' on the other card."""
GPU_COUNTS = range(1, 65)
KEY_NAMED = ("train.", "actor.", "verl.", "data.", "critic.", "model.", "actor_rollout_ref.")


def layouts(gpus: int) -> list[tuple[int, int]]:
    """(nnodes, n_gpus_per_node) the scripts make: one node of GPUS (GPUS_PER_NODE's default),
    and nodes of 8 where GPUS is a multiple of 8."""
    out = [(1, gpus)]
    if gpus > 8 and gpus % 8 == 0:
        out.append((gpus // 8, 8))
    return out


@functools.lru_cache(maxsize=None)
def base(hardware: str, model: str, shape: tuple[int, int] | None, extra: tuple[str, ...] = ()):
    """Our config and verl's composed one (composing takes seconds: once per preset and shape),
    with the overrides last applied to the latter (``extra``: more overrides of ours)."""
    overrides = [f"hardware={hardware}", f"model={model}", *extra]
    if shape:
        overrides += [f"train.group_num={shape[0]}", f"train.group_size={shape[1]}"]
    config = compose_config(overrides)
    composed = launch.verl_overrides(config, launch.task_paths(config))
    verl_config = launch.compose_verl_config(composed, validate=False)
    OmegaConf.set_struct(verl_config, False)
    return config, verl_config, dict(item.split("=", 1) for item in composed)


def apply(verl_config, applied: dict[str, str], overrides: list[str]):
    """``overrides`` (hydra's grammar, as the launch writes them) applied to the composed config
    in place, those that differ from the ``applied`` ones only: the values that change with the
    GPU count, without composing verl's config again."""
    for override in overrides:
        key, value = override.split("=", 1)
        if applied.get(key) != value:
            OmegaConf.update(verl_config, key.lstrip("+~"), yaml.safe_load(value), force_add=True)
            applied[key] = value
    return verl_config


def replay_dispatch(cfg) -> None:
    """verl 0.9.1's splitting code on a batch of this config's shape: AssertionError where the
    real run would die after its first rollout."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    get = functools.partial(OmegaConf.select, cfg)
    n = get("actor_rollout_ref.rollout.n")
    batch = get("data.train_batch_size") * n
    dp = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
    data = DataProto.from_dict({"x": torch.zeros(batch, 1)})
    data.chunk(get("actor_rollout_ref.rollout.agent.num_workers"))   # AgentLoopManager
    share = len(data.chunk(dp)[0])                                     # dispatch to the ranks

    def micro_batches(size: int, micro: int) -> None:
        td = tu.get_tensordict({"x": torch.zeros(size, 1)},
                               {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": micro})
        prepare_micro_batches(td)

    micro_batches(share, get("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"))
    mini = get("actor_rollout_ref.actor.ppo_mini_batch_size") * n
    assert mini % dp == 0, f"Got {mini=} and {dp=}"                   # train_mini_batch
    td = tu.get_tensordict({"x": torch.zeros(share, 1)})
    for mini_batch in tu.make_iterator(td, mini_batch_size=mini // dp, epochs=1, seed=0):
        micro_batches(len(mini_batch), get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"))
    tokens = get("data.max_prompt_length") + get("data.max_response_length")
    assert get("critic.ppo_max_token_len_per_gpu") >= tokens          # rearrange_micro_batches


WINDOWED_V1 = ["verl.trainer=v1", "train.presets=[tightBlocksworldTurnsAgent]",
               "val.presets=[tightBlocksworldTurnsAgent]"]
"""verl's V1 trainer with the default preset, which is windowed (``context: state``): one row
per turn, so a step's row count is known only after its rollout."""


@pytest.fixture(scope="module")
def v1_trainer():
    """verl's V1 trainer module (imported against a stand-in TransferQueue, not installed on a
    CPU machine)."""
    with fake_transfer_queue():
        from verl.trainer.ppo.v1 import trainer_base

        yield trainer_base


class PaddingStore:
    """The two TransferQueue calls ``upsample_batch_to_divisible_size`` makes, in memory."""

    def __init__(self):
        self.sample = {"prompts": torch.zeros(4, dtype=torch.int64),
                       "responses": torch.zeros(3, dtype=torch.int64)}

    def kv_batch_get(self, keys, partition_id, **kwargs):
        return [dict(self.sample) for _ in keys]

    def kv_batch_put(self, **kwargs):
        return None


@dataclasses.dataclass
class BatchMeta:
    keys: list
    tags: list
    partition_id: str = "train"
    fields: object = None
    extra_info: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)


def replay_v1_step(cfg, trainer_base, rows: int, global_steps: int, monkeypatch) -> None:
    """verl 0.9.1's V1 trainer on a step of ``rows`` rows, with its own code: the padding to
    ``_get_required_batch_multiple`` (``upsample_batch_to_divisible_size``), the equal split over
    the ranks (``get_seqlen_balanced_partitions``), each rank's no-grad micro-batches (actor and
    reference) and its mini- and micro-batches of the actor's update. AssertionError where the
    real run dies."""
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import tensordict_utils as tu
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions
    from verl.workers.engine.utils import prepare_micro_batches

    get = functools.partial(OmegaConf.select, cfg)
    dp = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
    trainer = SimpleNamespace(config=cfg, use_critic=need_critic(cfg), global_steps=global_steps)
    multiple = trainer_base.PPOTrainer._get_required_batch_multiple(trainer, dp)
    monkeypatch.setattr(padding_utils, "tq", PaddingStore())
    monkeypatch.setattr(padding_utils, "KVBatchMeta", BatchMeta)
    batch = BatchMeta(keys=[f"u{i}_0_0" for i in range(rows)],
                      tags=[{"seq_len": 100 + i % 7} for i in range(rows)])
    batch = padding_utils.upsample_batch_to_divisible_size(batch, multiple, eos_token_id=0)
    seqlens = [tag.get("seq_len", padding_utils.SYNTHETIC_PADDING_SEQ_LEN) for tag in batch.tags]
    ranks = get_seqlen_balanced_partitions(seqlens, k_partitions=dp, equal_size=True)

    def micro_batches(size: int, micro: int) -> None:
        td = tu.get_tensordict({"x": torch.zeros(size, 1)},
                               {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": micro})
        prepare_micro_batches(td)

    keys = ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            *(["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"]
              if need_reference_policy(cfg) else [])]
    mini = get("actor_rollout_ref.actor.ppo_mini_batch_size") * get("actor_rollout_ref.rollout.n")
    for rank in ranks:
        for key in keys:
            micro_batches(len(rank), get(key))
        if get("trainer.critic_warmup") <= global_steps:                  # the actor's update
            assert mini % dp == 0, f"Got {mini=} and {dp=}"               # train_mini_batch
            td = tu.get_tensordict({"x": torch.zeros(len(rank), 1)})
            for mini_batch in tu.make_iterator(td, mini_batch_size=mini // dp, epochs=1, seed=0):
                micro_batches(len(mini_batch),
                              get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"))


def replay_v1(cfg, trainer_base, monkeypatch) -> None:
    """:func:`replay_v1_step` on steps of every row count a windowed run can have, up to the
    padding (each episode is one row or more, so a step has at least ``train_batch_size * n``
    rows; the outcome depends only on the padded count, and two consecutive multiples of the
    padding unit decide it for every count), on a critic warm-up step and after it."""
    from verl.trainer.ppo.utils import need_critic

    get = functools.partial(OmegaConf.select, cfg)
    episodes = get("data.train_batch_size") * get("actor_rollout_ref.rollout.n")
    dp = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
    trainer = SimpleNamespace(config=cfg, use_critic=need_critic(cfg), global_steps=10 ** 9)
    unit = trainer_base.PPOTrainer._get_required_batch_multiple(trainer, dp)
    steps = sorted({1, get("trainer.critic_warmup")})
    for rows, step in itertools.product((episodes, episodes + 1, episodes + unit + 1), steps):
        replay_v1_step(cfg, trainer_base, rows, step, monkeypatch)


def test_v1_with_windows_fits_no_grad_micro_batches_to_the_padded_rank_share(v1_trainer,
                                                                             monkeypatch):
    """a100 + qwen_halfb on V1 with a windowed preset: 128 episodes, mini-batches of 32 rows
    over 8 GPUs; a step of 129 rows is padded to 160, 20 a rank, which the preset's no-grad
    micro-batch of 8 does not split. The preflight makes it 4 (the rows a rank holds are a
    multiple of 32 / 8), and verl's own padding and splitting then pass."""
    config = compose_config(["hardware=a100", "model=qwen_halfb", *WINDOWED_V1])
    assert config.verl.log_prob_micro_batch_size_per_gpu == 8
    fitted, notes = preflight.fit(config)
    assert fitted.verl.log_prob_micro_batch_size_per_gpu == 4
    assert any("log_prob_micro_batch_size_per_gpu 8 -> 4" in note for note in notes)
    cfg = launch.compose_verl_config(launch.verl_overrides(fitted, launch.task_paths(fitted)))
    preflight.check_dispatch(cfg, preflight.rows_vary(fitted))
    replay_v1(cfg, v1_trainer, monkeypatch)


@pytest.mark.parametrize(("hardware", "forced"), [("a100", 8), ("l40", 4)])
def test_v1_with_windows_refuses_a_raw_no_grad_micro_batch_verl_would_assert_on(
        hardware, forced, v1_trainer, monkeypatch):
    """The review's cases (a100: 8 against 4 rows a rank; l40: 4 against 2), forced past the
    fitting by a raw verl override, for the actor and the reference: refused naming the key,
    and verl's own padding and splitting agree that the run would die."""
    raw = [f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu={forced}"
           for role in ("rollout", "ref")]
    config = compose_config([f"hardware={hardware}", "model=qwen_halfb", *WINDOWED_V1,
                             "actor.use_kl_loss=true", f"verl.overrides={raw}"])
    fitted, _ = preflight.fit(config)
    cfg = launch.compose_verl_config(launch.verl_overrides(fitted, launch.task_paths(fitted)))
    with pytest.raises(ValueError, match=r"log_prob_micro_batch_size_per_gpu: with context "
                                         r"windows .* micro-batches of " + str(forced)):
        preflight.check_dispatch(cfg, preflight.rows_vary(fitted))
    with pytest.raises(AssertionError, match="divisible"):
        replay_v1(cfg, v1_trainer, monkeypatch)


class Stop(Exception):
    """Ends verl's trainer set-up once the critic's worker config is built."""


def v1_critic_engine(cfg, trainer_base, monkeypatch):
    """The critic's engine config as verl 0.9.1's V1 trainer builds it (``PPOTrainer._setup``,
    stopped at the critic's worker class; no Ray, no model)."""
    from verl.trainer.ppo.utils import Role, need_critic

    built = {}

    def worker_class(cls, config=None, **kwargs):
        if isinstance(config, trainer_base.TrainingWorkerConfig):
            built["engine"] = config.engine_config
            raise Stop
        return SimpleNamespace()

    monkeypatch.setattr(trainer_base, "RayClassWithInitArgs", worker_class)
    pools = SimpleNamespace(create_resource_pool=lambda: None, resource_pool_dict={"pool": "pool"},
                            get_resource_pool=lambda role: "pool")
    trainer = SimpleNamespace(
        config=launch._checkable_copy(cfg), use_critic=need_critic(cfg),
        use_reference_policy=False, role_worker_mapping={Role.ActorRollout: object,
                                                         Role.Critic: object},
        resource_pool_manager=pools, **{step: lambda: None for step in (
            "_init_tokenizer", "_init_dataloader", "_init_dump_executor",
            "_init_resource_pool_mgr")})
    with pytest.raises(Stop):
        trainer_base.PPOTrainer._setup(trainer)
    return built["engine"]


@pytest.mark.parametrize("model", ["qwen_halfb", "qwen_7b"])
def test_v1_updates_the_critic_on_the_token_budget_the_memory_estimate_counts(
        model, v1_trainer, monkeypatch):
    """V1 hands the critic's engine ``critic.ppo_infer_max_token_len_per_gpu`` as its update
    budget. On a100 with 7B that was the no-grad forwards' 4 x 5,120 = 20,480 tokens a
    micro-batch, where the estimate and docs/HARDWARE.md count the actor's micro-batch of 2
    trajectories, 10,240."""
    config, _ = preflight.fit(compose_config(["hardware=a100", f"model={model}",
                                              "verl.trainer=v1"]))
    cfg = launch.compose_verl_config(launch.verl_overrides(config, launch.task_paths(config)))
    engine = v1_critic_engine(cfg, v1_trainer, monkeypatch)
    micro = {"qwen_halfb": 4, "qwen_7b": 2}[model]     # configs/sizing, the preset
    assert engine.max_token_len_per_gpu == micro * 5_120 == preflight.critic_update_tokens(config)
    assert engine.infer_max_token_len_per_gpu == engine.max_token_len_per_gpu


def test_the_memory_estimate_is_docs_arithmetic_with_vllms_cuda_graphs_in_every_training_phase():
    """a100 + 3B, the tightest preset: docs/HARDWARE.md's per-GPU arithmetic (12.4 GB of FSDP
    state, 4 trajectories of 5,120 tokens at 2.68 MB each, the 4 GB margin) plus the 2 GB of
    CUDA graphs vLLM keeps while it sleeps through the forwards and updates."""
    config = compose_config(["hardware=a100", "model=qwen_3b"])
    estimate = preflight.estimate_memory(config, 80)
    state = 16 * 6.18e9 / 8 / 1e9
    assert estimate.update == pytest.approx(state + 4 * 5_120 * 2.677e6 / 1e9 + 4 + 2, abs=0.1)
    assert estimate.no_grad == pytest.approx(state + 4 * 5_120 * 1.519e6 / 1e9 + 4 + 2, abs=0.1)
    assert estimate.critic == pytest.approx(state + 4 * 5_120 * 0.246e6 / 1e9 + 4 + 2, abs=0.1)
    assert estimate.rollout == pytest.approx(state + 40 + 4, abs=0.1)  # graphs: in vLLM's share
    assert estimate.peak < 80


def preflight_outcome(hardware, model, shape, nodes, per_node) -> str:
    """'passed' (and verl's dispatch replay passed too) or 'refused: <message>'."""
    try:
        config, verl_config, applied = base(hardware, model, shape)
        config = dataclasses.replace(config, verl=dataclasses.replace(
            config.verl, nnodes=nodes, n_gpus_per_node=per_node))
        config, _ = preflight.fit(config)
        cfg = apply(verl_config, applied,
                    launch.verl_overrides(config, launch.task_paths(config)))
        preflight.check_dispatch(cfg)
    except ValueError as refusal:
        return f"refused: {refusal}"
    replay_dispatch(cfg)
    return "passed"


@pytest.mark.slow
@pytest.mark.parametrize(("hardware", "model"), itertools.product(GPU_PRESETS, MODELS))
def test_every_gpu_count_passes_verls_dispatch_or_is_refused_naming_a_key(hardware, model):
    outcomes = {}
    for shape, gpus in itertools.product(SHAPES, GPU_COUNTS):
        for nodes, per_node in layouts(gpus):
            outcome = preflight_outcome(hardware, model, shape, nodes, per_node)
            outcomes[shape, nodes, per_node] = outcome
            if outcome != "passed":
                assert any(key in outcome for key in KEY_NAMED), outcome
    # the review's cases that used to die at dispatch now pass, adapted
    passed = [key for key, outcome in outcomes.items() if outcome == "passed"]
    assert (None, 1, 8) in passed and (None, 2, 8) in passed
    if hardware == "a100":
        assert (None, 4, 8) in passed      # 32 GPUs: 4 trajectories each, micro-batches fit


HARDWARE = sorted(path.stem for path in (ROOT / "configs" / "hardware").glob("*.yaml"))
ALL_MODELS = sorted(path.stem for path in (ROOT / "configs" / "model").glob("*.yaml"))


def v1_dry_run_outcome(hardware: str, model: str, nodes: int, per_node: int):
    """What ``agentrl train --dry-run hardware=<hardware> model=<model> verl.trainer=v1`` with
    the windowed preset does on ``nodes`` x ``per_node`` GPUs, step by step as
    :func:`agentrl.verl.launch.launch` (our config's rules, the preflight's fitting, verl's
    composed config checked by verl's ``validate_config``, the masks' rules, the dispatch
    divisions): ('passed', verl's config) or ('refused: <message>', None). verl's config is
    composed once per preset pair, the values that change with the GPUs applied to it."""
    try:
        config, verl_config, applied = base(hardware, model, None, tuple(WINDOWED_V1))
        config = dataclasses.replace(config, verl=dataclasses.replace(
            config.verl, nnodes=nodes, n_gpus_per_node=per_node))
        config, _ = preflight.fit(config)
        cfg = apply(verl_config, applied, launch.verl_overrides(config, launch.task_paths(config)))
        launch.validate_verl_config(cfg)
        constrained.check_verl_config(cfg)
        preflight.check_dispatch(cfg, preflight.rows_vary(config))
    except ValueError as refusal:
        return f"refused: {refusal}", None
    assert preflight.rows_vary(config)
    return "passed", cfg


@pytest.mark.slow  # 120 dry runs: about a minute
def test_v1_dry_runs_with_windows_pass_verls_dispatch_or_are_refused_naming_a_key(
        v1_trainer, monkeypatch):
    """Every verl hardware preset x every model preset x 1, 4, 8 and 16 GPUs (one node; 16
    also as 2 nodes of 8) on the V1 trainer with the windowed default preset: each dry run is
    refused naming a key, or passes and then survives verl's own V1 padding, split and
    micro-batching on every row count a step can have."""
    verl_hardware = [name for name in HARDWARE  # cpu.yaml is the local engine's
                     if compose_config([f"hardware={name}"]).backend == "verl"]
    assert {"a100", "h100", "l40", "cpu-verl"} <= set(verl_hardware) == set(HARDWARE) - {"cpu"}
    outcomes = {}
    for hardware, model, gpus in itertools.product(verl_hardware, ALL_MODELS, (1, 4, 8, 16)):
        for nodes, per_node in layouts(gpus):
            outcome, cfg = v1_dry_run_outcome(hardware, model, nodes, per_node)
            outcomes[hardware, model, nodes, per_node] = outcome
            if outcome == "passed":
                replay_v1(cfg, v1_trainer, monkeypatch)
            else:
                assert any(key in outcome for key in KEY_NAMED), outcome
    passed = {key for key, outcome in outcomes.items() if outcome == "passed"}
    refused = {key: outcome.split(" ", 2)[1] for key, outcome in outcomes.items()
               if key not in passed}
    print(f"{len(outcomes)} dry runs: {len(passed)} passed; refused by the key first named: "
          + ", ".join(f"{key}: {sum(v == key for v in refused.values())}"
                      for key in sorted(set(refused.values()))))
    # every GPU preset runs every Qwen preset on a node of 8 and on 2 nodes of 8
    for hardware, model in itertools.product(("a100", "h100", "l40"), MODELS):
        assert {(hardware, model, 1, 8), (hardware, model, 2, 8)} <= passed


def test_a_v1_dry_run_with_windows_prints_the_fitted_no_grad_micro_batch(tmp_path, capsys):
    """The review's case end to end through ``agentrl train --dry-run``: a100 + qwen_halfb
    with the windowed preset on V1 gets no-grad micro-batches of 4, not the preset's 8."""
    assert cli.main(["train", "--dry-run", "hardware=a100", "model=qwen_halfb", *WINDOWED_V1,
                     f"run_dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out.split("# verl's config above passed verl's checks.")[0])
    assert printed["trainer"]["use_v1"] is True
    for role in ("rollout", "ref"):
        assert printed["actor_rollout_ref"][role]["log_prob_micro_batch_size_per_gpu"] == 4
    assert "# preflight: verl.log_prob_micro_batch_size_per_gpu 8 -> 4" in out


def test_the_reviews_l40_two_node_case_is_adapted_not_left_to_die():
    """hardware=l40 model=qwen_halfb verl.nnodes=2: 2 trajectories a GPU, no-grad micro 4."""
    config = compose_config(["hardware=l40", "model=qwen_halfb", "verl.nnodes=2"])
    fitted, notes = preflight.fit(config)
    assert config.verl.log_prob_micro_batch_size_per_gpu == 4
    assert fitted.verl.log_prob_micro_batch_size_per_gpu == 2
    assert any("log_prob_micro_batch_size_per_gpu 4 -> 2" in note for note in notes)
    cfg = launch.compose_verl_config(launch.verl_overrides(fitted, launch.task_paths(fitted)))
    preflight.check_dispatch(cfg)
    replay_dispatch(cfg)


def test_check_dispatch_refuses_what_verl_would_assert_naming_the_key():
    """A raw verl override (applied last, past the fitting) is still checked."""
    config = compose_config(["hardware=l40", "model=qwen_halfb", "verl.nnodes=2",
                             "verl.overrides=['actor_rollout_ref.rollout."
                             "log_prob_micro_batch_size_per_gpu=4']"])
    fitted, _ = preflight.fit(config)
    cfg = launch.compose_verl_config(launch.verl_overrides(fitted, launch.task_paths(fitted)))
    with pytest.raises(ValueError, match=r"log_prob_micro_batch_size_per_gpu: a rank's 2 "
                                         r"trajectories do not split into micro-batches of 4"):
        preflight.check_dispatch(cfg)
    with pytest.raises(AssertionError):   # and verl's own code agrees
        replay_dispatch(cfg)


@pytest.mark.parametrize(("hardware", "model", "gpus"), [
    ("a100", "qwen_7b", 4), ("l40", "qwen_3b", 4), ("a100", "qwen_3b", 1), ("l40", "qwen_7b", 4)])
def test_memory_is_fitted_to_the_card_or_refused_with_the_estimate(hardware, model, gpus):
    """Presets assume 8 GPUs a node: on fewer, the per-GPU state grows; the preflight shrinks
    micro-batches and offloads Adam until the estimate fits, or refuses."""
    config = compose_config([f"hardware={hardware}", f"model={model}",
                             f"verl.n_gpus_per_node={gpus}"])
    card = preflight.card_memory_gb(config)
    try:
        fitted, notes = preflight.fit(config)
    except ValueError as refusal:
        assert "GB per GPU at the peak" in str(refusal) and "verl.n_gpus_per_node" in str(refusal)
        return
    assert preflight.estimate_memory(fitted, card).peak <= card
    assert preflight.estimate_memory(config, card).peak > card   # it did need fitting
    assert notes and fitted != config


@pytest.mark.parametrize("model", MODELS)
def test_a_40gb_card_is_checked_against_its_own_memory(model):
    """The 80 GB sizes do not fit a 40 GB A100 (what the scripts used to pick for it); the 48 GB
    sizes they pick now do, checked against the card's real memory."""
    card = 42.9  # an A100-SXM4-40GB: 40960 MiB
    eighty = compose_config(["hardware=a100", f"model={model}", f"hardware.gpu_memory_gb={card}"])
    assert preflight.estimate_memory(eighty, card).peak > card
    forty_eight = compose_config(["hardware=l40", f"model={model}",
                                  f"hardware.gpu_memory_gb={card}"])
    fitted, _ = preflight.fit(forty_eight)
    assert preflight.estimate_memory(fitted, card).peak <= card


def test_largest_divisor():
    assert [preflight.largest_divisor(12, k) for k in (1, 4, 5, 8, 100)] == [1, 4, 4, 6, 12]
    assert preflight.largest_divisor(7, 4) == 1
