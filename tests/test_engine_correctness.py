"""Greedy outputs and logprobs equal transformers' own model (Llama, Qwen2, Qwen3, Mistral) on the same
checkpoint (float32, CPU): single requests, concurrent ones (batching must not change a result), shared prefixes (the
cache must not change a result), chunked prefill and retraction under a small KV budget. Each with
the reference ops (torch) and with the baseline Triton kernels (interpreter), which must serve
every op: every projection, both attentions, the norms, rope and silu_mul."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelloop.engine.engine import Engine, EngineConfig, InvalidRequest
from kernelloop.engine.sampling import SamplingParams
from kernelloop.engine.scheduler import SchedulerConfig

from tests.hf_checkpoints import VARIANTS, family_of, make_checkpoint

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3)
KERNELS = ["reference", "baseline"]
# Mistral computes with Llama's ops, and qwen3-bias's bias path is qwen2's: their baseline runs would add no call site.
SINGLE = [(v, k) for v in VARIANTS for k in KERNELS
          if k == "reference" or (family_of(v) != "mistral" and v != "qwen3-bias")]
# Batched requests sharing a cached prefix, per family.
SHARED = [(v, k) for v in ("mqa-untied", "qwen2", "qwen3", "mistral") for k in KERNELS
          if k == "reference" or family_of(v) != "mistral"]


def greedy(kernels: str) -> SamplingParams:
    """Fewer tokens through the interpreter (a second or so per forward): the prefill and two decodes."""
    return GREEDY if kernels == "reference" else dataclasses.replace(GREEDY, max_tokens=3)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {v: make_checkpoint(root / v, v, shard=(v in ("gqa", "qwen3"))) for v in VARIANTS}


@pytest.fixture(scope="module")
def hf_models(checkpoints):
    from transformers import AutoModelForCausalLM

    return {v: AutoModelForCausalLM.from_pretrained(p).eval() for v, p in checkpoints.items()}


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    ids = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, ids)]
    return ids, logprobs


def prompts(n: int, seed: int, lengths=(5, 17, 9, 30, 1, 12)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 211, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def served_by(engine: Engine, kernels: str) -> set[str]:
    """The ops that some variant other than `kernels` served (a baseline that raised falls back)."""
    return {op for op, used in engine.kernels.variants_in_use().items() if used and set(used.values()) != {kernels}}


def assert_matches_hf(model, reqs, prompt_list, n=GREEDY.max_tokens):
    for prompt, req in zip(prompt_list, reqs):
        ids, logprobs = hf_greedy(model, prompt, n)
        assert req.output_ids == ids, f"prompt of {len(prompt)} tokens"
        assert [lp.logprob for lp in req.logprobs] == pytest.approx(logprobs, abs=1e-4)
        for lp in req.logprobs:  # the top alternatives are sorted and contain the greedy choice
            assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id


@pytest.mark.parametrize("variant,kernels", SINGLE)
def test_single_requests_match_transformers(checkpoints, hf_models, variant, kernels):
    engine = Engine(EngineConfig(model=str(checkpoints[variant]), kernels=kernels))
    ps = prompts(3 if kernels == "reference" else 2, seed=1)  # 5, 17 (> one 16-token tile), 9 tokens
    reqs = [engine.generate([p], greedy(kernels))[0] for p in ps]
    assert_matches_hf(hf_models[variant], reqs, ps, n=greedy(kernels).max_tokens)
    assert served_by(engine, kernels) == set()
    assert {"linear", "extend_attention", "decode_attention"} <= set(engine.kernels.variants_in_use())


def count_mixed_steps(engine: Engine) -> list[int]:
    """A one-element list counting the engine's mixed (prefill + decode) steps from now on."""
    count, schedule = [0], engine.scheduler.schedule

    def counting():
        batch = schedule()
        count[0] += batch is not None and batch.mode == "mixed"
        return batch

    engine.scheduler.schedule = counting
    return count


@pytest.mark.parametrize("kernels,mixed", [("reference", False), ("baseline", False), ("reference", True)])
def test_concurrent_requests_match_transformers(checkpoints, hf_models, kernels, mixed):
    # A small prefill budget and chunk size mix chunked prefills, multi-request extends and decodes;
    # mixed: the prefills of the requests admitted as others finish run in the decodes' forwards.
    sched = SchedulerConfig(max_running_requests=4, max_prefill_tokens=24, chunk_size=10, mixed=mixed)
    engine = Engine(EngineConfig(model=str(checkpoints["gqa"]), scheduler=sched, kernels=kernels))
    mixed_steps = count_mixed_steps(engine)
    ps = prompts(7, seed=2)
    n = greedy(kernels).max_tokens
    reqs = engine.generate(ps, greedy(kernels))
    assert engine.stats["forwards"] < 7 * (n + 4), "requests were not batched"
    assert (mixed_steps[0] > 0) == mixed
    assert_matches_hf(hf_models["gqa"], reqs, ps, n=n)
    assert served_by(engine, kernels) == set()


@pytest.mark.parametrize("variant,kernels", SHARED)
def test_shared_prefixes_hit_the_cache_without_changing_results(checkpoints, hf_models, variant, kernels):
    engine = Engine(EngineConfig(model=str(checkpoints[variant]), kernels=kernels))
    system = prompts(1, seed=3, lengths=(40,))[0]
    ps = [system + tail for tail in prompts(4, seed=4, lengths=(3, 6, 1, 9))]
    first = engine.generate(ps[:1], greedy(kernels))
    rest = engine.generate(ps[1:], greedy(kernels))
    assert first[0].cached_tokens == 0
    assert all(r.cached_tokens >= 40 for r in rest)
    assert engine.cache.hit_tokens >= 120
    assert_matches_hf(hf_models[variant], first + rest, ps, n=greedy(kernels).max_tokens)
    assert served_by(engine, kernels) == set()


@pytest.mark.parametrize("mixed", [False, True])
def test_retraction_under_a_tiny_kv_budget_keeps_results(checkpoints, hf_models, mixed):
    config = EngineConfig(model=str(checkpoints["gqa"]), scheduler=SchedulerConfig(max_running_requests=6, mixed=mixed))
    per_slot = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, head_dim 16, float32
    engine = Engine(dataclasses.replace(config, kv_cache_bytes=per_slot * 70))
    mixed_steps = count_mixed_steps(engine)
    ps = prompts(6, seed=5, lengths=(20, 18, 15, 22, 19, 17))
    reqs = engine.generate(ps, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3))
    assert sum(r.retractions for r in reqs) > 0, "the budget was meant to force retraction"
    assert (mixed_steps[0] > 0) == mixed, "retracted requests resume in mixed steps"
    assert all(r.finish_reason == "length" and len(r.output_ids) == 12 for r in reqs)
    assert_matches_hf(hf_models["gqa"], reqs, ps, n=12)
    assert engine.allocator.available() + engine.cache.total_size() == engine.allocator.num_slots - 1, "slots leaked"


def test_stops_and_limits(checkpoints):
    engine = Engine(EngineConfig(model=str(checkpoints["gqa"])))
    p = prompts(1, seed=7)[0]
    free = engine.generate([p], GREEDY)[0]
    stop_at = free.output_ids[2]
    stopped = engine.generate([p], dataclasses.replace(GREEDY, stop_token_ids=[stop_at]))[0]
    assert stopped.finish_reason == "stop" and stopped.output_ids == free.output_ids[:free.output_ids.index(stop_at) + 1]
    text = engine.tokenizer.decode(free.output_ids)
    word = text.split()[3]
    by_string = engine.generate([p], dataclasses.replace(GREEDY, stop=[word]))[0]
    assert by_string.finish_reason == "stop" and by_string.stop_text == word
    with pytest.raises(InvalidRequest, match="at most"):
        engine.add_request([5] * engine.max_context, GREEDY)
    with pytest.raises(InvalidRequest, match="token ids"):
        engine.add_request([5, 10_000], GREEDY)
