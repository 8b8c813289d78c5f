"""Generation speed of the local engine: tokens/s at batch 1 vs batch N, same prompts.

    python scripts/bench/generate.py                               # embedded model, CPU
    python scripts/bench/generate.py --device cuda --batch-sizes 1 16 64
    python scripts/bench/generate.py --model tiny --max-new-tokens 32 --out /tmp/gen.json

Every prompt is a chat-formatted game-like request of ~100-150 tokens. Each batch size decodes
the same ``--prompts`` prompts, in chunks of that size, through ``BatchingLLM.generate_batch``
(the decode loop ``generate`` uses, without asyncio timing noise). Decoding is greedy with no
stop tokens, so every prompt yields exactly ``--max-new-tokens`` tokens and every batch size
does the same work. One warm-up chunk per batch size is not timed. tokens/s counts generated
tokens over all generation time (prefill included: with ~80-170-token prompts and 32 new tokens
the prefill is a large share); decode tokens/s leaves the prefill out. Expect about 10 minutes on 2 CPU cores with defaults
(batch 1 dominates).
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from agentrl.bench_cli import device_name, write_result
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.models import load_model

TOPICS = ["Sokoban", "Tetris", "BlocksWorld", "TextWorld"]


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


def bench(llm: BatchingLLM, prompts, batch_size: int, sampling: SamplingParams) -> dict:
    llm.generate_batch(prompts[:batch_size], sampling)  # warm-up, not timed
    llm.reset_stats()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        llm.generate_batch(prompts[i : i + batch_size], sampling)
    seconds = time.perf_counter() - start
    stats = llm.stats
    steps = sampling.max_new_tokens - 1  # the first token comes from the prefill logits
    return {
        "batch_size": batch_size,
        "prompts": len(prompts),
        "generated_tokens": stats.generated_tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(stats.generated_tokens / seconds, 1),
        "prefill_seconds": round(stats.prefill_seconds, 3),
        "decode_tokens_per_second": round(stats.decode_tokens_per_second, 1),
        "ms_per_decode_step": round(
            1000 * (stats.generation_seconds - stats.prefill_seconds) / (stats.batches * steps), 2
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="a load_model name")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompts", type=int, default=16, help="prompts decoded per batch size")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default="bench_results/generate.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    load_seconds = time.perf_counter() - start
    llm = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=())
    prompts = make_prompts(tokenizer, args.prompts)
    sampling = SamplingParams(greedy=True, max_new_tokens=args.max_new_tokens)
    rows = [bench(llm, prompts, size, sampling) for size in args.batch_sizes]
    llm.close()

    base = rows[0]["tokens_per_second"]
    table = Table(title=f"{args.model} on {args.device}: {args.max_new_tokens} new tokens/prompt")
    columns = ("batch", "tokens", "s", "prefill s", "tok/s", "decode tok/s", "ms/step", "speed-up")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["batch_size"]),
            str(row["generated_tokens"]),
            f"{row['seconds']:.2f}",
            f"{row['prefill_seconds']:.2f}",
            f"{row['tokens_per_second']:.1f}",
            f"{row['decode_tokens_per_second']:.1f}",
            f"{row['ms_per_decode_step']:.1f}",
            f"{row['tokens_per_second'] / base:.2f}x",
        )
    Console().print(table)
    lengths = [len(p) for p in prompts]
    result = {
        "rows": rows,
        "args": vars(args),
        "load_seconds": round(load_seconds, 2),
        "prompt_tokens": {"min": min(lengths), "max": max(lengths)},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device_name": device_name(args.device),
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
