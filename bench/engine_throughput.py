"""Engine throughput on CPU: `python -m bench.engine_throughput [--max-tokens N] [--out-dir DIR]`.

With the embedded model (float32, reference torch ops), measured in one run:
- output tokens/s at 1 and at 16 concurrent requests, against transformers' `generate()` on the
  same checkpoint: one request at a time, and the 16 prompts as one left-padded batch;
- the same through HTTP as clients see it: `engine serve` in its own process, 1 or 16 concurrent
  clients, streaming and not, each round alternated with the in-process run (the HTTP/in-process
  ratio is the server layer's cost);
- a shared-prefix workload (16 chat requests behind one long system prompt; the first arrives
  alone, the other 15 together, as agent traffic does) with a cold prefix cache on and off: hit
  rate, prompt tokens actually computed, tokens/s.
- a burst (bench/burst.py): `--burst` clients at once over HTTP, one request each (prompts of 16-64
  tokens, `--burst-tokens` new), streamed and not, mixed steps off and on, and the same prompts given to
  the in-process engine, against transformers' padded batch; and
  TTFT p50/p99 and the running streams' inter-token p99 while such a burst arrives, against their
  steady state. `--burst-only` runs just these rows.
Every request generates exactly `--max-tokens` tokens (EOS ignored), so all rows do equal work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Sequence

import torch

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.sampling import SamplingParams

from bench import burst as bursts
from bench.http_load import EngineServer, PlannedRequest, send_all
from bench.report import print_table, write_report

TOPICS = ["the red fox", "a small boat", "the old tree", "my sister", "the blue car", "a tall tower", "the cat",
          "our garden", "the river", "a green bird", "the library", "the baker", "a snowy hill", "the moon",
          "the market", "a quiet road"]


def chat_prompt(engine: Engine, system: str, question: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                 {"role": "user", "content": question}])
    return engine.tokenizer.encode(text, add_special_tokens=False)


MIXED_CHUNK = 128  # tokens per mixed step in the burst rows: a burst's prefill spread over a few steps
REPEATS = 3  # each row is the best of this many runs: the least-disturbed one on a shared machine
# Pause before each burst: torch's OpenMP workers spin for a while after a parallel region, and a
# process's spinning threads would take cores from the next row's run (another process's, or this one's).
SETTLE_S = 0.25
LONE_REQUESTS = 10  # per repeat: requests sent one at a time, for the TTFT of a request that arrives alone
BURST_REPEATS = 7  # a burst takes ~0.1 s: more repeats, so each row's best is a quiet moment's


def best_of(run) -> tuple[float, int]:
    results = [run() for _ in range(REPEATS)]
    return min(results)


def run_engine(engine: Engine, prompts: list[list[int]], max_tokens: int, staggered: bool = False) -> tuple[float, int]:
    """All prompts at once, or (staggered) the first alone and then the rest, as agent traffic arrives."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    groups = [prompts[:1], prompts[1:]] if staggered else [prompts]
    reqs = [r for group in groups for r in engine.generate(group, params)]
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(r.output_ids) for r in reqs)


def run_hf(model, prompts: list[list[int]], max_tokens: int, batched: bool, pad_id: int) -> tuple[float, int]:
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_id)
    start = time.perf_counter()
    with torch.no_grad():
        if batched:
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            model.generate(ids, attention_mask=mask, **kwargs)
        else:
            for p in prompts:
                model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kwargs)
    return time.perf_counter() - start, len(prompts) * max_tokens


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--burst", type=int, default=16, help="clients in the burst rows (default 16)")
    parser.add_argument("--burst-tokens", type=int, default=32, help="new tokens per burst request (default 32)")
    parser.add_argument("--burst-only", action="store_true", help="run only the burst rows")
    args = parser.parse_args(argv)
    from transformers import LlamaForCausalLM

    engine = Engine(EngineConfig())
    hf = LlamaForCausalLM.from_pretrained(engine.model_dir, dtype=torch.float32).eval()
    pad = engine.tokenizer.eos_token_ids and min(engine.tokenizer.eos_token_ids) or 0
    prompts = [chat_prompt(engine, "You are a helpful assistant.", f"Tell me about {t}.") for t in TOPICS]
    rows = []

    def row(workload: str, system: str, seconds: float, tokens: int, **extra) -> None:
        rows.append({"workload": workload, "system": system, "seconds": round(seconds, 2),
                     "output tokens": tokens, "tokens/s": round(tokens / seconds, 1), **extra})
        print(f"{workload:>22} {system:<32} {tokens / seconds:8.1f} tok/s", file=sys.stderr, flush=True)

    burst_notes = burst_rows(engine, hf, pad, args.burst, args.burst_tokens, row)
    if args.burst_only:
        return finish(rows, burst_notes, engine, args)

    engine.generate([prompts[0]], SamplingParams(max_tokens=2, temperature=0))  # warm-up
    with EngineServer(threads=torch.get_num_threads()) as base:
        send_all(base, [PlannedRequest(0.0, prompts[0], 2)])  # warm-up
        for n in (1, 16):
            planned = [PlannedRequest(0.0, p, args.max_tokens) for p in prompts[:n]]
            runs = {"kernelloop engine": [], "engine serve, HTTP": [], "engine serve, HTTP streaming": []}
            for _ in range(REPEATS):  # alternated, so a busy moment of the machine hits all three
                runs["kernelloop engine"].append(run_engine(engine, prompts[:n], args.max_tokens))
                for stream in (False, True):
                    seconds, results = send_all(base, planned, stream=stream)
                    runs[f"engine serve, HTTP{' streaming' if stream else ''}"].append(
                        (seconds, sum(r.output_tokens for r in results)))
            for system, results in runs.items():
                row(f"{n} concurrent", system, *min(results))
    for n in (1, 16):
        batch = prompts[:n]
        row(f"{n} concurrent", "transformers generate, one by one",
            *best_of(lambda batch=batch: run_hf(hf, batch, args.max_tokens, False, pad)))
        if n > 1:
            row(f"{n} concurrent", "transformers generate, padded batch",
                *best_of(lambda batch=batch: run_hf(hf, batch, args.max_tokens, True, pad)))

    system = " ".join(["You are a careful assistant who answers questions about places, animals and people."] * 6)
    shared = [chat_prompt(engine, system, f"Tell me about {t}.") for t in TOPICS]
    for cache_on in (True, False):
        eng = Engine(EngineConfig(prefix_cache=cache_on))  # a cold cache
        hits0, looked0 = eng.cache.hit_tokens, eng.cache.queried_tokens
        computed0 = eng.stats["prompt_tokens"] - eng.stats["cached_prompt_tokens"]
        seconds, tokens = run_engine(eng, shared, args.max_tokens, staggered=True)
        looked = eng.cache.queried_tokens - looked0
        hit_rate = (eng.cache.hit_tokens - hits0) / looked if looked else 0.0
        computed = eng.stats["prompt_tokens"] - eng.stats["cached_prompt_tokens"] - computed0
        row("16 shared-prefix", f"engine, prefix cache {'on' if cache_on else 'off'}", seconds, tokens,
            **{"hit rate": round(hit_rate, 3), "prompt tokens computed": computed})

    return finish(rows, burst_notes, engine, args, prompts, shared)


def burst_rows(engine: Engine, hf, pad: int, n: int, new: int, row) -> list[str]:
    """The burst rows (bench/burst.py): the in-process engine, `engine serve` with mixed steps off and on, each
    over HTTP not streamed and streamed, alternated with transformers' padded batch on the same fresh prompts
    each repeat; returns the notes (ratios in this run)."""
    vocab, threads = engine.model_config.vocab_size, torch.get_num_threads()
    mixed_flags = ("--mixed-chunk", "--chunked-prefill-size", str(MIXED_CHUNK))
    servers = {"engine serve": (), f"engine serve {' '.join(mixed_flags)}": mixed_flags}
    http = {f"{name}, HTTP{' streaming' if stream else ''}": (name, stream) for name in servers for stream in (False, True)}
    inproc, hf_name = "kernelloop engine, in-process", "transformers generate, padded batch"
    runs: dict[str, list[tuple[float, int]]] = {m: [] for m in [inproc, *http, hf_name]}
    client_cpu: dict[str, list[float]] = {m: [] for m in http}  # this process's CPU seconds per HTTP burst
    under: dict[str, list[bursts.UnderBurst]] = {m: [] for m in servers}
    lone: dict[str, list[float]] = {m: [] for m in servers}
    with EngineServer(threads=threads) as plain, EngineServer(threads=threads, extra=mixed_flags) as mixed:
        bases = dict(zip(servers, (plain, mixed)))
        for base in bases.values():
            bursts.http_burst(base, bursts.burst_prompts(n, vocab, seed=99), 4)  # warm-up
        run_engine(engine, bursts.burst_prompts(n, vocab, seed=99), 4)
        for repeat in range(BURST_REPEATS):
            batch = bursts.burst_prompts(n, vocab, seed=repeat)
            for system, (name, stream) in http.items():
                time.sleep(SETTLE_S)
                cpu = time.process_time()
                seconds, tokens, _ = bursts.http_burst(bases[name], batch, new, stream)  # own prefix caches
                client_cpu[system].append(time.process_time() - cpu)
                runs[system].append((seconds, tokens))
            time.sleep(SETTLE_S)
            runs[inproc].append(run_engine(engine, batch, new))
            time.sleep(SETTLE_S)
            runs[hf_name].append(bursts.hf_padded_batch(hf, batch, new, pad))
            for name, base in bases.items() if repeat < REPEATS else ():
                lone[name] += bursts.lone_ttfts(base, vocab, LONE_REQUESTS, seed=3000 + repeat)
                running = bursts.burst_prompts(4, vocab, seed=1000 + repeat)
                arriving = bursts.burst_prompts(n, vocab, seed=2000 + repeat)
                under[name].append(bursts.streams_under_burst(base, running, arriving, new, at=0.5))
    for system, results in runs.items():
        row(f"burst of {n}", system, *min(results))
    hf_rate = max(t / s for s, t in runs[hf_name])
    notes = []
    for system in [inproc, *http]:
        rate = max(t / s for s, t in runs[system])
        cpu = f" (the client's CPU: {1000 * statistics.median(client_cpu[system]):.0f} ms a burst)" if system in http else ""
        notes.append(f"burst of {n}: {system} / transformers padded batch = {rate / hf_rate:.2f}x{cpu}")
    for name, results in under.items():
        mid = sorted(results, key=lambda u: u.itl_p99_burst)[len(results) // 2]  # the median repeat
        notes.append(f"streams under a burst of {n}, {name}: TTFT p50 {mid.ttft_p50 * 1000:.0f} ms, "
                     f"p99 {mid.ttft_p99 * 1000:.0f} ms; running streams' inter-token p99 "
                     f"{mid.itl_p99_burst * 1000:.0f} ms during the burst vs {mid.itl_p99_steady * 1000:.0f} ms "
                     f"steady ({mid.itl_p99_burst / mid.itl_p99_steady:.2f}x; median of {len(results)} repeats)")
        notes.append(f"a lone request, {name}: TTFT p50 {statistics.median(lone[name]) * 1000:.1f} ms "
                     f"({len(lone[name])} requests of 16-64 tokens, one at a time)")
    return notes


def finish(rows: list[dict], burst_notes: list[str], engine: Engine, args, prompts=None, shared=None) -> int:
    """Print the table and ratios, write the report."""
    if prompts is None:
        print_table(rows)
        print("\n".join(burst_notes))
        notes = burst_notes + [f"Embedded model at {engine.model_dir}; float32; reference torch ops; burst prompts "
                               f"{bursts.PROMPT_LENGTHS[0]}-{bursts.PROMPT_LENGTHS[1]} random tokens, {args.burst_tokens} "
                               f"new tokens each, EOS ignored; each burst row is the best of {BURST_REPEATS} bursts, the systems alternated, "
                               f"a {SETTLE_S} s pause before each.", f"torch threads: {torch.get_num_threads()}."]
        path = write_report("engine-burst", "Engine burst over HTTP vs transformers", rows, device="cpu", notes=notes,
                            out_dir=args.out_dir, interpreter_timings=False)
        print(f"wrote {path}")
        return 0
    by = {(r["workload"], r["system"]): r["tokens/s"] for r in rows}
    http = [f"{n} concurrent: HTTP{s} / in-process = {by[(f'{n} concurrent', 'engine serve, HTTP' + s)] / by[(f'{n} concurrent', 'kernelloop engine')]:.2f}x"
            for n in (1, 16) for s in ("", " streaming")]
    ratios = http + [
        f"1 concurrent: engine / transformers = {by[('1 concurrent', 'kernelloop engine')] / by[('1 concurrent', 'transformers generate, one by one')]:.2f}x",
        f"16 concurrent: engine / transformers one by one = {by[('16 concurrent', 'kernelloop engine')] / by[('16 concurrent', 'transformers generate, one by one')]:.2f}x",
        f"16 concurrent: engine / transformers padded batch = {by[('16 concurrent', 'kernelloop engine')] / by[('16 concurrent', 'transformers generate, padded batch')]:.2f}x",
        f"shared prefix: cache on / off = {by[('16 shared-prefix', 'engine, prefix cache on')] / by[('16 shared-prefix', 'engine, prefix cache off')]:.2f}x",
    ]
    ratios += burst_notes
    print_table(rows)
    print("\n".join(ratios))
    notes = ratios + [
        f"Embedded model at {engine.model_dir}; float32; engine kernels: reference torch ops; {args.max_tokens} output tokens per request, EOS ignored.",
        f"Prompt lengths {min(map(len, prompts))}-{max(map(len, prompts))} tokens; shared-prefix prompts {len(shared[0])} tokens.",
        f"torch threads: {torch.get_num_threads()}.",
    ]
    path = write_report("engine-throughput", "Engine throughput on CPU vs transformers", rows, device="cpu",
                        notes=notes, out_dir=args.out_dir, interpreter_timings=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
