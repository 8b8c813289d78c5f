"""Where a local PPO step spends its time: share of each stage, and tokens/s of the update.

    python scripts/bench/train.py                          # quick_train.sh's CPU step, 2 steps
    python scripts/bench/train.py --steps 3 --out /tmp/train.json model=tiny
    python scripts/bench/train.py critic.share_backbone=true lora.rank=8

By default this is the step ``bash quick_train.sh`` runs on a CPU: the embedded model on the CPU
preset (configs/hardware/cpu.yaml: 4 groups of 8 episodes), train preset ``tightBlocksworldTurnsAgent``.
Extra ``key=value`` arguments are hydra overrides of configs/base.yaml (the same as
``agentrl train``). The run writes into a temporary run_dir, without validation, checkpoints,
WandB or plots, so only the training stages are timed. Stage shares are of the summed step
time, ``stage_seconds`` the mean seconds a step; update tokens/s counts every token the actor
(or critic) forward+backward passes read (prompt and response, all PPO epochs) over that
stage's seconds; ``generation`` is the engine's counters over the timed steps, ``engine/*`` in
each step's metrics its work in that step (decode tokens/s). The first step also pays one-off
costs (the constrained decoder's token index, first calls). The JSON records the load average:
on a shared machine compare runs taken side by side. ``actor_update_vs_bare`` compares the actor
update's tokens/s with a bare forward + backward + AdamW over random rows of the step's mean
length, cut into the same micro-batches (:func:`bare_update_tokens_per_s`): the bookkeeping's
cost below 1, the work the shared prompt prefix avoids above it. ``update_tokens_read_per_step``
counts the tokens the update's forward passes (old log-probs, actor, a critic on the actor's
backbone) read through the actor's embeddings: a measure of shared work that no load changes.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch
from rich.console import Console
from rich.table import Table

from agentrl.cli.bench import write_result
from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer

PRESETS = "[tightBlocksworldTurnsAgent]"
"""quick_train.sh's default train and val presets."""
STAGES = ("rollout", "filter", "old_logprobs", "ref", "values", "advantages", "critic", "actor")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="training steps timed (default 2)")
    parser.add_argument("--out", default="bench_results/train.json", help="JSON output path")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    with tempfile.TemporaryDirectory() as run_dir:
        config = compose_config([
            f"train.presets={PRESETS}", f"val.presets={PRESETS}",
            *args.overrides, f"run_dir={run_dir}", "val.before_train=false", "val.test_freq=0",
            "trainer.logger=[]", "trainer.plot=false", "resume=never"])
        trainer = LocalTrainer(config)
        steps = []
        load_before = os.getloadavg()
        try:
            for step in range(1, args.steps + 1):
                tokens = _count_update_tokens(trainer)
                engine_before = trainer.llm.stats.as_dict()
                start = time.perf_counter()
                metrics = trainer.train_step(step)
                metrics["wall_s"] = time.perf_counter() - start
                metrics.update(_engine_delta(engine_before, trainer.llm.stats.as_dict()))
                # a step whose groups were all dropped (rollout.drop_uniform_groups) updates none
                update_tokens, update_rows, read = tokens.pop() if tokens else (0, 0, 0)
                metrics["update_tokens"], metrics["update_rows"] = update_tokens, update_rows
                metrics["update_tokens_read"] = read
                steps.append(metrics)
            generation = trainer.llm.stats.as_dict()
            updated = [m for m in steps if m["update_rows"]]
            if not updated:
                raise SystemExit("no step updated the model: every group was dropped "
                                 "(rollout.drop_uniform_groups); run more --steps or set it false")
            rows = round(sum(m["update_rows"] for m in updated) / len(updated))
            tokens_per_row = sum(m["update_tokens"] for m in updated) / len(updated) / rows
            trainer.llm.prefix_cache.clear()  # the engine's stored turns: not the update's
            bare = bare_update_tokens_per_s(trainer.actor, rows=rows,
                                            width=max(2, round(tokens_per_row)),
                                            micro_batch_size=config.actor.micro_batch_size)
        finally:
            trainer.close()
    result = summarize(steps, config)
    result["bare_update_tokens_per_s"] = bare
    if result["actor_update_tokens_per_s"]:
        result["actor_update_vs_bare"] = result["actor_update_tokens_per_s"] / bare
    result["generation"] = generation
    result["load_average"] = {"before": list(load_before), "after": list(os.getloadavg())}
    show(result)
    write_result(args.out, result)
    return result


def bare_update_tokens_per_s(model, *, rows: int, width: int, micro_batch_size: int) -> float:
    """Tokens/s of a bare forward + backward + AdamW step over ``rows`` random rows of ``width``
    tokens, in micro-batches as the update cuts them: the update's floor on this machine with no
    PPO bookkeeping and nothing shared. One untimed warm-up pass, then one timed (the model's
    weights change: run it last)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-9, fused=True)
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (rows, width), device=device)

    def one_step() -> float:
        start = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        for first in range(0, rows, micro_batch_size):
            logits = model(input_ids=ids[first:first + micro_batch_size], use_cache=False).logits
            logits.float().logsumexp(-1).mean().backward()
        optim.step()
        return time.perf_counter() - start

    one_step()
    return rows * width / one_step()


def _count_update_tokens(trainer: LocalTrainer) -> list[tuple[int, int, int]]:
    """Hook the update to count, per step, the tokens and rows of its batch and the tokens its
    forward passes read through the actor's embeddings (fewer where prefixes are shared)."""
    box: list[tuple[int, int, int]] = []
    real = trainer.updater.update
    read = [0]
    inside = [False]

    def count_read(module, args, output) -> None:
        if inside[0]:
            read[0] += args[0].numel()

    trainer.actor.get_input_embeddings().register_forward_hook(count_read)

    def counting(batch, timer, step=0, **options):
        mask = batch["attention_mask"]
        read[0], inside[0] = 0, True
        try:
            return real(batch, timer, step, **options)
        finally:
            inside[0] = False
            box.append((int(mask.sum()), mask.shape[0], read[0]))  # tokens, rows, tokens read

    trainer.updater.update = counting
    return box


def _engine_delta(before: dict, after: dict) -> dict:
    """The engine's work during one step: tokens generated, seconds, decode tokens/s."""
    delta = {key: after[key] - before[key] for key in
             ("generated_tokens", "generation_seconds", "prefill_seconds")}
    decode = delta["generation_seconds"] - delta["prefill_seconds"]
    return {f"engine/{key}": value for key, value in delta.items()} | {
        "engine/decode_tokens_per_s": delta["generated_tokens"] / decode if decode > 0 else 0.0}


def summarize(steps: list[dict], config) -> dict:
    total = sum(s["timing/step_s"] for s in steps)
    shares = {stage: sum(s.get(f"timing/{stage}_s", 0.0) for s in steps) / total for stage in STAGES}
    epochs = config.actor.ppo_epochs
    critic_epochs = config.critic.ppo_epochs or epochs
    tokens = sum(s["update_tokens"] for s in steps)
    actor_s = sum(s.get("timing/actor_s", 0.0) for s in steps)
    critic_s = sum(s.get("timing/critic_s", 0.0) for s in steps)
    return {
        "model": config.model.name, "device": config.device, "steps": len(steps),
        "episodes_per_step": config.train.group_num * config.train.group_size,
        "seconds_per_step": total / len(steps), "stage_share": shares,
        "stage_seconds": {stage: share * total / len(steps) for stage, share in shares.items()},
        "actor_update_tokens_per_s": tokens * epochs / actor_s if actor_s else None,
        "critic_update_tokens_per_s": tokens * critic_epochs / critic_s if critic_s else None,
        "update_tokens_per_step": tokens / len(steps),
        "update_tokens_read_per_step": sum(s["update_tokens_read"] for s in steps) / len(steps),
        "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "per_step": steps,
    }


def show(result: dict) -> None:
    table = Table(title=f"PPO step on {result['model']} ({result['device']}), "
                        f"{result['episodes_per_step']} episodes/step, "
                        f"{result['seconds_per_step']:.1f} s/step")
    table.add_column("stage")
    table.add_column("share of step", justify="right")
    table.add_column("s a step", justify="right")
    for stage, share in result["stage_share"].items():
        table.add_row(stage, f"{100 * share:.1f}%", f"{result['stage_seconds'][stage]:.2f}")
    Console().print(table)
    for role in ("actor", "critic"):
        value = result[f"{role}_update_tokens_per_s"]
        if value is not None:
            print(f"{role} update: {value:,.0f} tokens/s "
                  f"({result['update_tokens_per_step']:,.0f} tokens per step and epoch)")
    read = result["update_tokens_read_per_step"]
    print(f"the update's forward passes (all of them) read {read:,.0f} tokens a step through "
          f"the actor's embeddings; its rows hold {result['update_tokens_per_step']:,.0f}")
    if result.get("actor_update_vs_bare"):
        print(f"bare forward + backward + AdamW on the same shapes: "
              f"{result['bare_update_tokens_per_s']:,.0f} tokens/s; the actor update runs at "
              f"{result['actor_update_vs_bare']:.2f}x it (above 1: work the update avoids)")


if __name__ == "__main__":
    main()
