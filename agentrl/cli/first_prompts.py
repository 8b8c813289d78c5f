"""Before a local run loads its model: each preset's first prompt, measured with the model's
tokenizer, leaves room for a whole reply in ``rollout.max_context_tokens``.

    check_first_prompts(config)              # agentrl train: train.presets and val.presets
    check_first_prompts(config, sft=True)    # agentrl sft: the presets the oracle plays

An episode checks the same when it starts (:func:`agentrl.rollout.episode.run_episode`), but by
then the run has begun (its folder written, the model loaded, a validation under way) and its
message names no key. Here a prompt that does not fit stops the command first, naming the key,
the value and what is allowed. The prompts measured are those of the first ``SEEDS_MEASURED``
games of each preset the run plays (its first training step's and its held-out games): a board's
text varies little between games (a preset's boards have one size), a reset can take a second
(Sokoban's rooms are generated), and the episode's own check still guards the others. The verl
backend measures every row when it writes its task files (:class:`agentrl.verl.data.
PromptLimits`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["SEEDS_MEASURED", "check_first_prompts"]

SEEDS_MEASURED = 1
"""Games measured per preset and split."""


def check_first_prompts(config: Any, sft: bool = False) -> None:
    """``ValueError`` naming ``rollout.max_context_tokens`` when a first prompt of the run's
    presets and a reply at its limit do not fit in it. ``config``: a ``TrainConfig``."""
    from agentrl.envs.splits import split_seeds, train_seeds
    from agentrl.rollout.demonstrations import demonstration_seeds

    r, val = config.rollout, config.val
    if sft:
        train = (config.sft_presets, demonstration_seeds(SEEDS_MEASURED, config.seed))
    else:
        train = (config.train.presets, train_seeds(1, config.train.group_num, config.seed,
                                                   config.train.pool))
    val_key = "val.max_new_tokens" if val.max_new_tokens else "rollout.max_new_tokens"
    plays = [("training", *train, r.max_new_tokens, "rollout.max_new_tokens")]
    if not sft or config.sft.evaluate:
        plays.append(("held-out", val.presets, split_seeds("val", val.group_num),
                      val.max_new_tokens or r.max_new_tokens, val_key))
    tokenizer = None
    for split, names, seeds, limit, key in plays:
        for name, preset in config.playing_presets(dict.fromkeys(names), limit):
            tokenizer = tokenizer or _tokenizer(config)
            if tokenizer is None:
                return
            _check_preset(config, tokenizer, split, name, preset, seeds[:SEEDS_MEASURED], key)


def _check_preset(config: Any, tokenizer: Any, split: str, name: str, preset: Any,
                  seeds: Iterable[int], key: str) -> None:
    from agentrl.agents import Agent
    from agentrl.rollout.episode import first_prompt_ids

    budget, reply = config.rollout.max_context_tokens, preset.max_response_tokens
    with Agent(preset) as agent:
        for seed in seeds:
            tokens = len(first_prompt_ids(tokenizer, agent.reset(seed=seed)))
            if tokens + reply <= budget:
                continue
            shorter = f", or {key} <= {budget - tokens}" if budget > tokens else ""
            raise ValueError(f"rollout.max_context_tokens={budget} cannot hold the first prompt "
                             f"of preset {name!r} ({tokens} tokens, {split} game {seed}) and a "
                             f"reply of up to {reply} tokens ({key}, agents.{name}."
                             f"max_response_tokens); allowed: rollout.max_context_tokens >= "
                             f"{tokens + reply}{shorter}")


def _tokenizer(config: Any) -> Any:
    """The model's tokenizer with the run's chat template; None where it does not load (the
    model's loading then says why, naming the model)."""
    from agentrl.models.loading import load_tokenizer

    try:
        return load_tokenizer(config.model.name, chat_template=config.model.chat_template)
    except OSError:
        return None
