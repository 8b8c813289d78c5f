"""The actor update with and without the shared prompt prefix, on the same batch, side by side.

    python scripts/bench/shared_prefix.py                      # embedded model, CPU preset
    OMP_NUM_THREADS=1 python scripts/bench/shared_prefix.py threads=1   # on a busy machine
    python scripts/bench/shared_prefix.py --micro-batch-sizes 2 4 8 --repeats 3
    python scripts/bench/shared_prefix.py --out /tmp/sp.json model=tiny train.group_size=2

One rollout step of the training preset (``tightSokobanAgent``, quick_train.sh's CPU default,
unless ``train.presets=...`` says otherwise; extra ``key=value`` arguments are hydra overrides
as for ``agentrl train``) gives one batch. On it, the actor's update (``PPOUpdate._epochs``:
forward + backward of every micro-batch, grad clip, AdamW) runs with
``actor.shared_prefix_tokens`` 0 (off) and on, at each micro-batch size, alternating off/on for
``--repeats`` rounds (after one untimed warm-up) so machine load hits both alike; weights and
optimizer state are restored after every run. Old log-probs are the sampler's and advantages a
fixed random draw: the cost of an update does not depend on their values. Printed and written
as JSON: seconds (median), the process's CPU seconds (steadier than wall time on a shared
machine; with ``threads=1`` they are the compute), tokens/s (the batch's real tokens, prompt
and response, over the update's seconds: what the unshared update reads), the tokens the model
actually read, the largest micro-batch's saved activations (MB, tensors autograd keeps for the
backward pass, weights excluded), and the speed-up of ``on`` over ``off`` at the same
micro-batch size and over ``off`` at the preset's. About 5 minutes on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch
from rich.console import Console
from rich.table import Table

from agentrl.cli.bench import device_name, write_result
from agentrl.config import compose_config
from agentrl.envs.splits import train_seeds
from agentrl.rollout import to_batch
from agentrl.trainers.local import LocalTrainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch-sizes", type=int, nargs="+", default=None,
                        help="micro-batch sizes to time (default: 2, 4, 8 and the preset's)")
    parser.add_argument("--shared-prefix-tokens", type=int, default=32,
                        help="actor.shared_prefix_tokens of the 'on' runs (default 32)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (off, on)")
    parser.add_argument("--out", default="bench_results/shared_prefix.json")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def rollout_batch(trainer: LocalTrainer) -> dict[str, torch.Tensor]:
    """One step's episodes as an actor-update batch (see the module docstring)."""
    config = trainer.config
    trajectories = trainer.rollout(trainer.train_presets, train_seeds(
        1, config.train.group_num, config.seed), config.train.group_size, trainer.sampling,
        desc="rollout")
    batch = to_batch(trajectories, trainer.pad_token_id, config.rollout.reward_placement)
    mask = batch["response_mask"].float()
    generator = torch.Generator().manual_seed(0)
    n = batch["responses"].shape[0]
    batch.update(row=torch.arange(n), old_logprobs=batch["rollout_log_probs"],
                 advantages=torch.randn(mask.shape, generator=generator) * mask)
    return batch


class ActivationMeter:
    """Bytes of the tensors autograd saves for the backward pass during one micro-batch's
    forward (each storage once, the model's weights excluded): the update's memory per
    micro-batch beyond the model and optimizer."""

    def __init__(self, model: torch.nn.Module):
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.largest = 0
        self._seen: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.weights:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    def wrap(self, micro_loss):
        def measured(micro, size, prefix=None):
            self._seen = {}
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                out = micro_loss(micro, size, prefix)
            self.largest = max(self.largest, sum(self._seen.values()))
            return out
        return measured


def counted_tokens(model: torch.nn.Module) -> list[int]:
    """A running count of the tokens ``model``'s embedding layer reads."""
    box = [0]
    model.get_input_embeddings().register_forward_hook(
        lambda module, args, output: box.__setitem__(0, box[0] + args[0].numel()))
    return box


def time_update(trainer: LocalTrainer, batch, micro: int, share: int, tokens: list[int]) -> dict:
    """One actor update at this micro-batch size and sharing, then back to the same state."""
    actor = dataclasses.replace(trainer.config.actor, micro_batch_size=micro,
                                shared_prefix_tokens=share)
    trainer.config = trainer.updater.config = dataclasses.replace(trainer.config, actor=actor)
    params = [p for p in trainer.actor.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    optim_state = copy.deepcopy(trainer.actor_optim.state_dict())
    meter = ActivationMeter(trainer.actor)
    read_before = tokens[0]
    start, cpu_start = time.perf_counter(), time.process_time()
    updater = trainer.updater
    _, skipped = updater._epochs(batch, meter.wrap(updater._actor_micro), trainer.actor_optim,
                                 params, actor.grad_clip, 1, "actor")
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    trainer.actor_optim.load_state_dict(optim_state)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds,
            "tokens_read": tokens[0] - read_before, "skipped": skipped,
            "activation_mb": meter.largest / 2**20}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as run_dir:
        config = compose_config([
            "train.presets=[tightSokobanAgent]", "val.presets=[tightSokobanAgent]",
            *args.overrides, f"run_dir={run_dir}", "trainer.logger=[]", "trainer.plot=false",
            "resume=never"])
        trainer = LocalTrainer(config)
        try:
            batch = rollout_batch(trainer)
            preset_micro = config.actor.micro_batch_size
            sizes = args.micro_batch_sizes or sorted({2, 4, 8, preset_micro})
            tokens = counted_tokens(trainer.actor)
            time_update(trainer, batch, sizes[0], 0, tokens)  # warm-up: allocator, kernels
            runs: dict[tuple[int, int], list[dict]] = {}
            for _ in range(args.repeats):
                for micro in sizes:
                    for share in (0, args.shared_prefix_tokens):
                        runs.setdefault((micro, share), []).append(
                            time_update(trainer, batch, micro, share, tokens))
        finally:
            trainer.close()
    real_tokens = int(batch["attention_mask"].sum())
    rows = []
    for (micro, share), results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rows.append({"micro_batch_size": micro, "shared_prefix_tokens": share,
                     "seconds_median": round(seconds, 3),
                     "seconds": [round(r["seconds"], 3) for r in results],
                     "cpu_seconds_median": round(statistics.median(
                         r["cpu_seconds"] for r in results), 3),
                     "tokens_per_s": round(real_tokens / seconds, 1),
                     "tokens_read": results[0]["tokens_read"],
                     "activation_mb": round(results[0]["activation_mb"], 1)})
    key = lambda r: (r["micro_batch_size"], r["shared_prefix_tokens"])  # noqa: E731
    seconds = {key(r): r["seconds_median"] for r in rows}
    cpu = {key(r): r["cpu_seconds_median"] for r in rows}
    baseline = seconds.get((preset_micro, 0))
    for row in rows:
        off = (row["micro_batch_size"], 0)
        row["speedup_same_micro"] = round(seconds[off] / row["seconds_median"], 2)
        row["cpu_speedup_same_micro"] = round(cpu[off] / row["cpu_seconds_median"], 2)
        row["speedup_vs_preset_off"] = (round(baseline / row["seconds_median"], 2)
                                        if baseline else None)
    result = {
        "model": config.model.name, "presets": list(config.train.presets),
        "rows_in_batch": int(batch["responses"].shape[0]),
        "groups": f"{config.train.group_num} x {config.train.group_size}",
        "batch_tokens": real_tokens,
        "prompt_tokens_mean": round(float(batch["attention_mask"][:, :batch["prompts"].shape[1]]
                                          .sum(1).float().mean()), 1),
        "response_tokens_mean": round(float(batch["attention_mask"][:, batch["prompts"].shape[1]:]
                                            .sum(1).float().mean()), 1),
        "preset_micro_batch_size": preset_micro, "repeats": args.repeats, "runs": rows,
        "torch_threads": torch.get_num_threads(), "device_name": device_name(config.device),
    }
    show(result)
    write_result(args.out, result)
    return result


def show(result: dict) -> None:
    table = Table(title=f"actor update on {result['model']}, {result['presets']}: "
                        f"{result['rows_in_batch']} rows ({result['groups']}), "
                        f"{result['batch_tokens']} tokens (prompt ~{result['prompt_tokens_mean']}, "
                        f"response ~{result['response_tokens_mean']} a row)")
    for column in ("micro", "shared prefix", "seconds (median)", "CPU s", "tokens/s", "tokens read",
                   "activations MB", "x same micro", "x same micro (CPU s)",
                   f"x micro {result['preset_micro_batch_size']} off"):
        table.add_column(column, justify="right")
    for row in result["runs"]:
        table.add_row(str(row["micro_batch_size"]),
                      "on" if row["shared_prefix_tokens"] else "off",
                      f"{row['seconds_median']:.2f}", f"{row['cpu_seconds_median']:.2f}",
                      f"{row['tokens_per_s']:,.0f}",
                      str(row["tokens_read"]), f"{row['activation_mb']:.0f}",
                      f"{row['speedup_same_micro']:.2f}x", f"{row['cpu_speedup_same_micro']:.2f}x",
                      "" if row["speedup_vs_preset_off"] is None
                      else f"{row['speedup_vs_preset_off']:.2f}x")
    Console(width=max(140, Console().width)).print(table)


if __name__ == "__main__":
    main()
