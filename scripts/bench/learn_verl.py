"""The ``verl`` recipe of scripts/bench/learn.py: the warm start and PPO through verl's own
trainers on this CPU (``hardware=cpu-verl``), each a child process.

    sft  = sft_command(python, folder, plan)   # agentrl sft backend=verl: the oracle episodes
    ppo  = ppo_command(python, folder, plan, sft_model(folder))   # agentrl train, from its folder
    step_timings(child_run.console_steps(log))  # verl's timing_s/* per step, and their means

What the recipe keeps equal to the local ``sft_ppo``: the demonstrations (``--sft-episodes``
on the same seeds, ``--sft-epochs``, ``sft.*`` as the local SFT), ``--steps``, constrained
decoding, and the held-out games, played by the local evaluator from the final actor's Hugging
Face folder. What differs: a PPO step's episodes (cpu-verl's 2 groups x 4; the local cpu
preset's 4 x 8, its groups that all won alike left out), the preset's ``history_window`` is 0
(every turn in the context: verl's SFT trainer learns whole episodes, and the legacy PPO
trainer refuses context windows), the untrained "before" is measured the same way, and
``--minutes`` does not cap it (verl's trainers have no deadline). verl's response budget is checked before anything
starts (:func:`check_lengths`): an episode cut by it would not be the local episode.

Why apart from learn.py: what only this recipe needs (its command lines, the token budget,
verl's checkpoint folders and console timings) is tested without verl on canned output
(tests/bench/test_learn_verl.py); learn.py runs the stage and caches it as the others.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, NamedTuple

MAX_PROMPT_LENGTH = 512
MAX_RESPONSE_LENGTH = 1024
"""verl's row: the first prompt, then every later token of the episode (replies and
observations); 6 turns of tightBlocksworldTurnsAgent take ~950 at most (:func:`check_lengths`)."""
PPO_MICRO_BATCH = "actor.micro_batch_size=1"
"""The actor's and critic's rows a forward/backward (cpu-verl's 8 are one): 8 rows of 1,536
tokens made the critic's update worker 16.9 GB on this CPU, and Ray's memory monitor killed it
(the same update, accumulated over micro-batches); at 2 the actor's update worker still
peaked at ~15 GB and the monitor killed vLLM's workers at step 2."""
TIMEOUT_S = 3600.0
"""Per child run (start-up included); one past it is ended with everything it started."""
LENGTH_SAMPLE = 16
"""Demonstrations whose token counts bound the episode's (oracle play: a second at most)."""


class Plan(NamedTuple):
    """What a verl recipe run trains on (the benchmark's arguments for one seed)."""
    preset: str
    seed: int
    steps: int
    sft_episodes: int
    sft_epochs: int
    val_groups: int
    overrides: tuple[str, ...]
    """The user's and the benchmark's config overrides (``history_window=0`` among them)."""


def full_history(preset: str) -> tuple[str, str]:
    """The overrides that keep every turn in the context (verl's SFT trains whole episodes):
    one growing chat (``context: history``), no turn dropped (``history_window`` 0)."""
    return f"agents.{preset}.history_window=0", f"agents.{preset}.context=history"


def shared_keys(plan: Plan) -> list[str]:
    """Keys of both verl runs: the hardware, the task, decoding and verl's token budget."""
    preset = plan.preset
    return ["hardware=cpu-verl", *plan.overrides, f"seed={plan.seed}",
            f"train.presets=[{preset}]", f"val.presets=[{preset}]", f"sft.presets=[{preset}]",
            f"val.group_num={plan.val_groups}", "val.group_size=1",
            "rollout.constrained_actions=true", "trainer.logger=[console]",
            "trainer.wandb_mode=disabled", "trainer.plot=false",
            f"verl.max_prompt_length={MAX_PROMPT_LENGTH}",
            f"verl.max_response_length={MAX_RESPONSE_LENGTH}",
            f"rollout.max_context_tokens={MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH}"]


def sft_command(python: str, folder: Path, plan: Plan) -> list[str]:
    """``agentrl sft backend=verl``: verl's SFT trainer on ``--sft-episodes`` oracle episodes
    (the local SFT's seeds) for ``--sft-epochs``, into ``<folder>/sft``."""
    return [python, "-m", "agentrl.cli", "sft", "backend=verl", *shared_keys(plan),
            f"run_dir={folder / 'sft'}", f"sft.output_dir={folder / 'sft'}",
            f"sft.episodes={plan.sft_episodes}", f"sft.epochs={plan.sft_epochs}"]


def ppo_command(python: str, folder: Path, plan: Plan, model: Path) -> list[str]:
    """``agentrl train``: verl's PPO trainer from ``model`` for ``--steps`` steps, no
    validation (the local evaluator plays the held-out games), one checkpoint at the end with
    the actor's Hugging Face model (every agentrl verl run saves it), into ``<folder>/ppo``."""
    return [python, "-m", "agentrl.cli", "train", *shared_keys(plan), f"model.name={model}",
            f"run_dir={folder / 'ppo'}", f"train.total_steps={plan.steps}",
            f"trainer.save_freq={plan.steps}", "val.test_freq=0", "val.before_train=false",
            PPO_MICRO_BATCH]


def sft_model(folder: Path) -> Path:
    """The Hugging Face folder of verl's last SFT checkpoint in ``<folder>/sft``."""
    steps = sorted((folder / "sft" / "verl").glob("global_step_*/huggingface"),
                   key=lambda path: int(path.parent.name.rsplit("_", 1)[1]))
    if not steps:
        raise FileNotFoundError(f"verl's SFT run left no global_step_*/huggingface folder in "
                                f"{folder / 'sft' / 'verl'}")
    return steps[-1]


def actor_model(folder: Path, steps: int) -> Path:
    """The Hugging Face folder of the actor's checkpoint after ``steps`` PPO steps."""
    path = folder / "ppo" / "checkpoints" / f"global_step_{steps}" / "actor" / "huggingface"
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"verl's PPO run left no actor model at {path}")
    return path


def check_lengths(config: Any, preset: str, seeds: list[int]) -> dict[str, int]:
    """Whether a whole episode of ``preset`` fits verl's row, from oracle episodes on ``seeds``
    tokenized with the run's chat template: the longest first prompt against
    ``verl.max_prompt_length``, and ``max_turns`` turns of the largest per-turn cost (the
    observation and chat tokens between replies, the reply at its token cap) against
    ``verl.max_response_length``. ValueError naming the key otherwise (a cut episode is not
    the local one). Returns the measured bounds."""
    from agentrl.models.loading import load_tokenizer
    from agentrl.rollout.demonstrations import demonstration_messages

    tokenizer = load_tokenizer(config.model.name, chat_template=config.model.chat_template)
    agent = dict(config.playing_presets([preset], config.rollout.max_new_tokens))[preset]

    def count(messages: list[dict], prompt: bool = False) -> int:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=prompt,
                                             tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt, turn = 0, 0
    for seed in seeds:
        messages, _ = demonstration_messages(agent, seed)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        replies = [m["content"] for m in messages[first:] if m["role"] == "assistant"]
        start = count(messages[:first], prompt=True)
        between = count(messages) - start - sum(count_text(tokenizer, r) for r in replies)
        prompt = max(prompt, start)
        turn = max(turn, -(-between // max(len(replies) - 1, 1)) + agent.max_response_tokens)
    bounds = {"prompt": prompt, "response": agent.max_turns * turn}
    for key, need, limit in (("verl.max_prompt_length", prompt, config.verl.max_prompt_length),
                             ("verl.max_response_length", bounds["response"],
                              config.verl.max_response_length)):
        if need > limit:
            raise ValueError(f"{key}={limit} is too small for a whole {preset} episode: it "
                             f"needs up to {need} tokens ({agent.max_turns} turns of up to "
                             f"{turn}, replies at max_response_tokens="
                             f"{agent.max_response_tokens}); allowed: an integer >= {need}")
    return bounds


def count_text(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def step_timings(steps: dict[int, dict[str, float]]) -> dict[str, Any]:
    """verl's ``timing_s/*`` of each step and their means over the steps after the first (the
    first also starts the agent-loop workers), or over all when there is one."""
    per_step = {str(step): {k: v for k, v in metrics.items() if k.startswith("timing_s/")}
                for step, metrics in sorted(steps.items())}   # keys as the JSON reads back
    return {"per_step": per_step, "mean": mean_timings(list(per_step.values()))}


def mean_timings(records: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over ``records`` (one a step), the first left out when there are more."""
    later = records[1:] if len(records) > 1 else records
    keys = dict.fromkeys(key for record in later for key in record)
    return {key: round(statistics.fmean(r[key] for r in later if key in r), 3) for key in keys}


def local_timings(records: list[dict[str, Any]]) -> dict[str, float]:
    """The local engine's ``timing/*`` means of a PPO run's metrics records (training steps),
    as :func:`step_timings` averages verl's."""
    steps = [{k: v for k, v in r.items() if k.startswith("timing/") and v is not None}
             for r in records if r.get("step", 0) > 0 and "timing/step_s" in r]
    return mean_timings(steps)
