"""An agent-shaped workload against `engine serve` and against transformers used as a server without
continuous batching must be: `python -m bench.agent_workload [--model smollm2] [--out-dir DIR]`.

The workload (seeded): profiler.workload's agent traffic (three shared system prompts, conversations
continued turn by turn, varied question and output lengths), arriving staggered (exponential gaps at
`--rate` per second); EOS is ignored so both systems generate the same tokens.

- kernelloop: `engine serve` in its own process, each request streamed over HTTP at its arrival
  time (continuous batching, prefix cache); TTFT is when the first token reaches the client.
- transformers: the same model and tokens in this process, served in fixed batches: when idle it
  takes up to `--batch-size` waiting requests, left-pads them and runs `generate()` to the longest
  output; TTFT is when the batch's first token is produced (generous: no HTTP, no streaming cost).
Both sides run with the same torch thread count and malloc settings (engine/cpu_allocator.py).
One stream: the first requests one at a time. `--serve "LABEL=ARGS"` (repeatable) adds the engine's rows once
more per extra `engine serve` configuration (e.g. `--serve "mixed=--mixed-chunk --chunked-prefill-size 128"`),
measured in the same run so their ratios compare.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import time
from typing import Callable, Sequence

import torch

from kernelloop.profiler.workload import agent_workload

from bench.http_load import EngineServer, PlannedRequest, RequestResult, send_all, send_one_by_one
from bench.report import print_table, write_report

OUTPUT_LENGTHS = (8, 64)  # each request's output length is drawn from this range


def build_workload(encode_chat: Callable[[list[dict[str, str]]], list[int]], n: int, rate: float,
                   seed: int) -> list[PlannedRequest]:
    """profiler.workload's agent traffic (3 shared system prompts, conversations that continue, varied
    question and output lengths) as token ids, arriving from t=0 with exponential gaps at `rate`/s."""
    rng = random.Random(seed)
    at, planned = 0.0, []
    for req in agent_workload(n, seed, OUTPUT_LENGTHS):
        planned.append(PlannedRequest(round(at, 4), encode_chat(req.messages), req.max_tokens))
        at += rng.expovariate(rate)
    return planned


class _FirstToken:
    """A generate() streamer that only notes when the first new token of a batch is produced."""

    def __init__(self) -> None:
        self.calls, self.first = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first put is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def run_transformers(model, requests: Sequence[PlannedRequest], batch_size: int,
                     pad_id: int) -> tuple[float, list[RequestResult]]:
    """Serve `requests` at their arrival times in static padded batches; (makespan, results)."""
    t0, order, results = time.perf_counter(), sorted(range(len(requests)), key=lambda i: requests[i].at), {}
    while order:
        now = time.perf_counter() - t0
        waiting = [i for i in order if requests[i].at <= now]
        if not waiting:
            time.sleep(requests[order[0]].at - now)
            continue
        batch = waiting[:batch_size]
        order = [i for i in order if i not in batch]
        width, new = max(len(requests[i].prompt_ids) for i in batch), max(requests[i].max_tokens for i in batch)
        ids = torch.tensor([[pad_id] * (width - len(requests[i].prompt_ids)) + requests[i].prompt_ids for i in batch])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(requests[i].prompt_ids) for i in batch])[:, None]).long()
        streamer = _FirstToken()
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad_id, streamer=streamer)
        done = time.perf_counter()
        for i in batch:
            sent = t0 + requests[i].at
            results[i] = RequestResult(requests[i].at, (streamer.first or done) - sent, done - sent, requests[i].max_tokens)
    return time.perf_counter() - t0, [results[i] for i in range(len(requests))]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summarize(workload: str, system: str, seconds: float, results: list[RequestResult]) -> dict:
    tokens = sum(r.output_tokens for r in results)
    ttfts = [r.ttft * 1000 for r in results]
    return {"workload": workload, "system": system, "requests": len(results), "output tokens": tokens,
            "seconds": round(seconds, 2), "output tokens/s": round(tokens / seconds, 1),
            "requests/s": round(len(results) / seconds, 2), "TTFT p50 ms": round(percentile(ttfts, 50), 1),
            "TTFT p99 ms": round(percentile(ttfts, 99), 1)}


def parse_serve(text: str, parser: argparse.ArgumentParser) -> tuple[str, list[str]]:
    """"LABEL=ARGS" -> (label, engine serve arguments)."""
    label, sep, rest = text.partition("=")
    if not sep or not label.strip():
        parser.error(f"--serve wants LABEL=ARGS, not {text!r}")
    return label.strip(), shlex.split(rest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_workload", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or directory (default: the embedded model)")
    # Defaults: arrivals faster than a static-batch server keeps up with (the case continuous batching
    # is for), still spread over seconds: 64 at 48/s on the embedded model, 32 at 2/s otherwise.
    parser.add_argument("--requests", type=int, default=None, help="requests (default: 64 embedded, 32 otherwise)")
    parser.add_argument("--rate", type=float, default=None, help="arrivals per second (default: 48 embedded, 2 otherwise)")
    parser.add_argument("--batch-size", type=int, default=8, help="transformers' static batch size")
    parser.add_argument("--one-stream", type=int, default=4, help="requests sent one at a time for the one-stream rows")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, both sides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve", action="append", default=[], metavar="LABEL=ARGS",
                        help="also measure engine serve with these extra arguments (repeatable)")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    configs = [("", [])] + [parse_serve(text, parser) for text in args.serve]
    from transformers import LlamaForCausalLM

    from kernelloop.engine.cpu_allocator import keep_freed_memory
    from kernelloop.engine.model_source import resolve_model_dir
    from kernelloop.engine.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # the engine's malloc settings for transformers too: only the serving differs
    model_dir = resolve_model_dir(args.model)
    tok = Tokenizer.from_dir(model_dir)
    rate = args.rate or (48.0 if args.model is None else 2.0)
    n_requests = args.requests or (64 if args.model is None else 32)

    def encode_chat(messages: list[dict[str, str]]) -> list[int]:
        return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)

    requests = build_workload(encode_chat, n_requests, rate, args.seed)
    name = args.model or "embedded"
    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = min(tok.eos_token_ids) if tok.eos_token_ids else 0
    rows = []

    def add(row: dict) -> None:
        rows.append(row)
        print(f"{row['workload']:>12} {row['system']:<40} {row['output tokens/s']:8.1f} tok/s  "
              f"TTFT p99 {row['TTFT p99 ms']} ms", file=sys.stderr, flush=True)

    solo = requests[:args.one_stream]
    for label, extra in configs:
        system = "kernelloop engine serve (HTTP)" + (f" [{label}]" if label else "")
        with EngineServer(args.model, threads=args.threads, extra=extra) as base:
            send_all(base, [PlannedRequest(0.0, r.prompt_ids[-8:], 4) for r in requests[:2]])  # warm-up; no shared prefix
            add(summarize("one stream", system, *send_one_by_one(base, solo)))
            add(summarize("staggered", system, *send_all(base, requests)))
    run_transformers(hf, [PlannedRequest(0.0, r.prompt_ids[-8:], 4) for r in requests[:2]], args.batch_size, pad)  # warm-up
    start, results = time.perf_counter(), [run_transformers(hf, [PlannedRequest(0.0, r.prompt_ids, r.max_tokens)], 1, pad)[1][0]
                                          for r in solo]
    add(summarize("one stream", "transformers generate", time.perf_counter() - start, results))
    add(summarize("staggered", f"transformers, static batches of {args.batch_size}",
                  *run_transformers(hf, requests, args.batch_size, pad)))

    hf_one, hf_stag = rows[-2], rows[-1]
    one_ratio = rows[0]["output tokens/s"] / hf_one["output tokens/s"]
    stag_ratio = rows[1]["output tokens/s"] / hf_stag["output tokens/s"]
    p99_ratio = rows[1]["TTFT p99 ms"] / hf_stag["TTFT p99 ms"]
    verdicts = [
        f"one stream: engine / transformers = {one_ratio:.2f}x (target >= 1.0: {'met' if one_ratio >= 1.0 else 'NOT met'})",
        f"staggered: engine / transformers throughput = {stag_ratio:.2f}x (target >= 2.0: {'met' if stag_ratio >= 2.0 else 'NOT met'})",
        f"staggered: engine / transformers TTFT p99 = {p99_ratio:.2f}x (target < 1.0: {'met' if p99_ratio < 1.0 else 'NOT met'})",
    ]
    for i, (label, extra) in enumerate(configs[1:], 1):
        one, stag = rows[2 * i], rows[2 * i + 1]
        verdicts.append(f"[{label}] (`engine serve {' '.join(extra)}`) / default: one stream "
                        f"{one['output tokens/s'] / rows[0]['output tokens/s']:.2f}x, staggered "
                        f"{stag['output tokens/s'] / rows[1]['output tokens/s']:.2f}x tokens/s, TTFT p50 "
                        f"{stag['TTFT p50 ms'] / rows[1]['TTFT p50 ms']:.2f}x, p99 {stag['TTFT p99 ms'] / rows[1]['TTFT p99 ms']:.2f}x")
    print_table(rows)
    print("\n".join(verdicts))
    lengths = [len(r.prompt_ids) for r in requests]
    notes = verdicts + [
        f"Model {name} ({model_dir}); float32 both sides; engine kernels: the CPU default (reference torch ops); "
        f"torch threads {args.threads} both sides.",
        f"{len(requests)} requests over {requests[-1].at:.1f} s (rate {rate}/s, seed {args.seed}); prompts "
        f"{min(lengths)}-{max(lengths)} tokens (profiler.workload: 3 shared system prompts, continued "
        f"conversations); outputs {OUTPUT_LENGTHS[0]}-{OUTPUT_LENGTHS[1]} tokens, EOS ignored.",
        "Each row is one run on a shared machine; compare ratios within this report only.",
    ]
    path = write_report(f"agent-workload-{name}", f"Agent-shaped workload: {name}, engine serve vs transformers",
                        rows, device="cpu", notes=notes, out_dir=args.out_dir, interpreter_timings=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
