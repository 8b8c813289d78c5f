"""A step of the local engine on a busy machine: how much a second CPU-bound process slows it.

    python scripts/bench/busy.py                                  # embedded model, 4 settings
    python scripts/bench/busy.py --settings passive:2 passive:1   # chosen settings only
    python scripts/bench/busy.py --model tiny --repeats 1 --out /tmp/busy.json   # smoke

A laptop always runs something else. OpenMP threads that spin while they wait for work hold
their cores against that other program, and a thread it preempts stalls every barrier of a
parallel matmul: two torch processes on two cores once slowed generation about 10x.

Each setting ``POLICY:THREADS`` runs in a fresh process (OpenMP reads ``OMP_WAIT_POLICY`` once,
when torch loads it): ``default`` leaves the variable unset (libgomp's own: spin a while, then
sleep), ``active`` spins, ``passive`` sleeps at once (what ``import agentrl`` sets unless the
variable is already set); ``THREADS`` goes to ``torch.set_num_threads``. The process times a
PPO step in miniature on the model ``--repeats`` times alone, each followed by the same step
while a competitor runs (paired, so load from elsewhere reaches both sides alike): a second
process of torch matmuls at its own defaults (``--competitor torch``: a thread per core,
libgomp's waiting, as another torch program would be) or one pure-Python busy loop per core
(``--competitor python``), timed from its first computation on. The step is a batched greedy
decode (``--batch`` prompts, ``--new-tokens`` each, through ``BatchingLLM.generate_batch``)
plus one forward and backward pass over ``--batch`` rows of ``--train-tokens`` tokens. The
table shows each setting's median seconds alone and busy (decode and update apart as
``alone / busy``), and ``slowdown``: the median over the pairs of busy / alone. Fair sharing of
two cores between two processes that each want both gives 2x. The machine's load average is
read before each setting: the ratios compare settings measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = ("default:2", "active:2", "passive:2", "passive:1")
POLICIES = {"default": None, "active": "ACTIVE", "passive": "PASSIVE"}
COMPETITORS = {   # each says "ready" once it computes, so no step is timed beside its start-up
    "torch": ("import torch\ntorch.set_num_threads({cores})\na = torch.randn(768, 768)\na @ a\n"
              "print('ready', flush=True)\nwhile True:\n    a @ a\n"),
    "python": "print('ready', flush=True)\nwhile True:\n    pass\n",
}


def parse_setting(text: str) -> tuple[str, int]:
    """``POLICY:THREADS`` -> (policy, threads); an error naming the allowed values."""
    policy, _, threads = text.partition(":")
    if policy not in POLICIES or not threads.isdigit() or int(threads) < 1:
        raise argparse.ArgumentTypeError(
            f"setting {text!r}: expected POLICY:THREADS with POLICY in {sorted(POLICIES)} "
            "and THREADS an integer >= 1")
    return policy, int(threads)


def policy_env(policy: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (the environment) with ``OMP_WAIT_POLICY`` as ``policy`` says: set, or unset."""
    env = dict(os.environ if base is None else base)
    env.pop("OMP_WAIT_POLICY", None)
    if POLICIES[policy] is not None:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    return env


def competitor_env() -> dict[str, str]:
    """Another program's environment: libgomp's own waiting, no thread count inherited from
    this one (a benchmark started with ``OMP_NUM_THREADS=1`` must not shrink its rival)."""
    env = policy_env("default")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    return env


def start_competitor(kind: str, cores: int, started: list[subprocess.Popen]) -> None:
    """The competing processes, appended to ``started`` as they start (so the caller stops
    every one, even if a later start fails): one torch program on every core, or a busy loop
    per core; each killed with this process if it dies, and running once this returns."""
    from agentrl.verl.restart import die_with_parent

    for _ in range(1 if kind == "torch" else cores):
        process = subprocess.Popen([sys.executable, "-c", COMPETITORS[kind].format(cores=cores)],
                                   env=competitor_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True,
                                   preexec_fn=die_with_parent)
        started.append(process)
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} competitor did not start (exit {process.poll()})")


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def measure_worker(args: argparse.Namespace) -> dict:
    """In this process (its OpenMP policy already set by the parent): a step's seconds alone,
    then beside the competitor."""
    policy = os.environ.get("OMP_WAIT_POLICY")   # before torch: what OpenMP will start with
    import torch   # first: OpenMP reads the wait policy when torch loads it

    torch.set_num_threads(args.threads)
    from agentrl.engines import BatchingLLM, SamplingParams
    from agentrl.models import load_model

    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    llm = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=())
    vocab = min(len(tokenizer), model.config.vocab_size)
    prompts = [torch.randint(0, vocab, (args.prompt_tokens + 7 * i,)).tolist()
               for i in range(args.batch)]
    sampling = SamplingParams(greedy=True, max_new_tokens=args.new_tokens)
    rows = torch.randint(0, vocab, (args.batch, args.train_tokens))

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        llm.generate_batch(prompts, sampling)
        decoded = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(input_ids=rows, labels=rows).loss.backward()
        return decoded - start, time.perf_counter() - decoded

    step()   # warm-up
    alone, busy, pids = [], [], []
    for _ in range(args.repeats):   # paired: whatever else the machine runs, both see it
        alone.append(step())
        competitor: list[subprocess.Popen] = []
        try:
            start_competitor(args.competitor, os.cpu_count() or 1, competitor)
            busy.append(step())
        finally:
            stop(competitor)
            pids += [p.pid for p in competitor]
    return {"alone": alone, "busy": busy, "omp_wait_policy": policy,
            "threads": torch.get_num_threads(), "competitor_pids": pids}


def summarize(setting: str, times: dict, load: float) -> dict:
    """Median seconds of a step (decode + update) alone and busy, and the slowdown: the median
    of the paired ratios (each busy step over the step alone just before it)."""
    def median(runs, part=None):
        return statistics.median(sum(r) if part is None else r[part] for r in runs)

    alone, busy = median(times["alone"]), median(times["busy"])
    ratios = [sum(b) / sum(a) for a, b in zip(times["alone"], times["busy"])]
    return {"setting": setting, "load_before": load, "omp_wait_policy": times["omp_wait_policy"],
            "threads": times["threads"], "competitor_pids": times["competitor_pids"],
            "alone_s": round(alone, 3), "busy_s": round(busy, 3),
            "decode_alone_s": round(median(times["alone"], 0), 3),
            "decode_busy_s": round(median(times["busy"], 0), 3),
            "update_alone_s": round(median(times["alone"], 1), 3),
            "update_busy_s": round(median(times["busy"], 1), 3),
            "slowdown": round(statistics.median(ratios), 2),
            "runs": {"alone": times["alone"], "busy": times["busy"]}}


def run_setting(setting: str, args: argparse.Namespace) -> dict:
    """One setting in a fresh process, so its wait policy is the one OpenMP starts with."""
    policy, threads = parse_setting(setting)
    command = [sys.executable, __file__, "--worker", "--threads", str(threads),
               "--model", args.model, "--repeats", str(args.repeats), "--batch", str(args.batch),
               "--new-tokens", str(args.new_tokens), "--train-tokens", str(args.train_tokens),
               "--prompt-tokens", str(args.prompt_tokens), "--competitor", args.competitor]
    load = os.getloadavg()[0]
    done = subprocess.run(command, env=policy_env(policy), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"setting {setting} failed:\n{done.stderr[-3000:]}")
    return summarize(setting, json.loads(done.stdout.strip().splitlines()[-1]), load)


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("policy:threads", "alone s", "busy s", "slowdown", "decode s",
                   "update s", "load"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["setting"], f"{row['alone_s']:.2f}", f"{row['busy_s']:.2f}",
                      f"{row['slowdown']:.2f}x",
                      f"{row['decode_alone_s']:.2f} / {row['decode_busy_s']:.2f}",
                      f"{row['update_alone_s']:.2f} / {row['update_busy_s']:.2f}",
                      f"{row['load_before']:.2f}")
    Console().print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), type=str,
                        help=f"POLICY:THREADS, POLICY in {sorted(POLICIES)} (default: "
                             f"{' '.join(SETTINGS)})")
    parser.add_argument("--model", default="embedded", help="model preset (default embedded)")
    parser.add_argument("--competitor", choices=sorted(COMPETITORS), default="torch",
                        help="the competing process (default torch)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps alone and busy")
    parser.add_argument("--batch", type=int, default=8, help="prompts decoded / rows trained")
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens decoded per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=120, help="shortest prompt")
    parser.add_argument("--train-tokens", type=int, default=192, help="tokens a trained row")
    parser.add_argument("--out", default="bench_results/busy.json", help="JSON output")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("repeats", "batch", "new_tokens", "prompt_tokens", "train_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for setting in args.settings:
        try:
            parse_setting(setting)
        except argparse.ArgumentTypeError as error:
            parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure_worker(args)))
        return None
    rows = [run_setting(setting, args) for setting in args.settings]
    print_table(rows, f"A step beside a {args.competitor} competitor ({args.model}, "
                      f"{os.cpu_count()} cores)")
    from agentrl.cli.bench import device_name, write_result

    result = {"benchmark": "busy", "model": args.model, "cpu": device_name("cpu"),
              "cores": os.cpu_count(), "competitor": args.competitor, "batch": args.batch,
              "new_tokens": args.new_tokens, "train_tokens": args.train_tokens, "rows": rows}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
