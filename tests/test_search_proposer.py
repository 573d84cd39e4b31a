"""The search proposer (agent/proposers/search.py) and its templates (agent/proposers/templates/).

CPU, Triton interpreter: the first proposals of every op are run against the reference on test and
held-back shapes in all three dtypes; the search order (seeding, feedback, exhaustion) is checked on
rendered sources only.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelloop.agent.proposers.base import TuneContext
from kernelloop.agent.proposers.search import SearchProposer, neighbour_distance
from kernelloop.agent.proposers.templates import HEADER_PREFIX, OP_NAMES, config_of, module_for, parse_header
from kernelloop.kernels.candidate.loader import load_kernel
from kernelloop.kernels.candidate.static_check import static_check
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.device import CPU, CUDA, Device
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry.entry import sha256_text
from kernelloop.kernels.registry.loader import load_forward
from kernelloop.sandbox.inside.replay import kernels_from_source
from kernelloop.sandbox.inside.worker import load_module

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_ctx(op: str, device: Device = CPU, shapes: tuple | None = None, **changes) -> TuneContext:
    spec = get_op(op)
    ctx = TuneContext(
        spec=spec, dtype="float32", device=device,
        shapes=tuple(spec.test_shapes[2:4]) if shapes is None else shapes,
        best_source=None, baseline_source="", roofline={}, failures=(),
    )
    return dataclasses.replace(ctx, **changes)


def config(source: str) -> dict:
    header = parse_header(source)
    assert header is not None
    return config_of(header)


@pytest.mark.parametrize("op", OP_NAMES)
def test_first_proposals_are_valid_and_correct(op):
    spec = get_op(op)
    ctx = make_ctx(op)
    proposals = SearchProposer().propose(ctx, [], 3)
    assert len(proposals) == 3
    assert len({sha256_text(p.source) for p in proposals}) == 3
    assert len({p.label for p in proposals}) == 3
    shapes = list(ctx.shapes) + list(get_op(op).held_back[:2])
    for i, p in enumerate(proposals):
        assert p.proposer == "search" and p.model is None and p.label.startswith(op)
        first = p.source.splitlines()[0]
        assert first.startswith(HEADER_PREFIX)
        header = parse_header(p.source)
        assert header["op"] == op and list(header)[:2] == ["op", "template"]
        assert "import kernels" not in p.source and "from kernels" not in p.source
        result = static_check(p.source, spec.arg_names)
        assert result.ok, (p.label, result.reason)
        forward = load_forward(p.source, sha256_text(p.source), p.label)
        for shape in shapes:
            for dtype in DTYPES:
                r = check_impl(spec, forward, shape, dtype, seed=7 + i)
                assert r.ok, f"{p.label}: {r}"


@pytest.mark.parametrize("op", OP_NAMES)
def test_every_config_renders_a_statically_valid_module(op):
    # The full GPU space without shape filtering: every template and every parameter value.
    spec = get_op(op)
    module = module_for(op)
    configs = SearchProposer().configs(make_ctx(op, device=CUDA, shapes=()))
    assert configs
    assert {c["template"] for c in configs} == set(module.DOMAINS)
    sources = set()
    for params in configs:
        source = module.render(params)
        assert config(source) == params
        result = static_check(source, spec.arg_names)
        assert result.ok, (params, result.reason)
        _, constants = load_module(source, "template.py")
        assert kernels_from_source(source, constants), params  # its kernels rebuild for the sandbox's replay
        sources.add(source)
    assert len(sources) == len(configs)
    with pytest.raises(ValueError):
        module.render({**configs[0], "num_warps": 3})


def test_space_is_narrowed_by_shapes_and_device():
    big = make_ctx("rmsnorm", device=CUDA, shapes=({"tokens": 4, "hidden": 8192},))
    small = make_ctx("rmsnorm", device=CUDA, shapes=({"tokens": 4, "hidden": 64},))
    sp = SearchProposer()
    big_t = {c["template"] for c in sp.configs(big)}
    assert {"row", "chunked"} <= big_t
    assert "chunked" not in {c["template"] for c in sp.configs(small)}  # one chunk would cover the row
    huge = make_ctx("rmsnorm", device=CUDA, shapes=({"tokens": 2, "hidden": 100_000},))
    assert {c["template"] for c in sp.configs(huge)} == {"chunked"}  # a whole row would not fit
    cpu = sp.configs(make_ctx("rmsnorm", device=CPU, shapes=big.shapes))
    for template in ("row", "multirow", "chunked"):  # the interpreter ignores warps: no sweep there
        assert len({c["num_warps"] for c in cpu if c["template"] == template}) == 1


@pytest.mark.parametrize("op", OP_NAMES)
def test_best_source_seeds_its_neighbours(op):
    ctx = make_ctx(op, device=CUDA)
    module = module_for(op)
    space = SearchProposer().configs(ctx)
    # a config with several neighbours in the space
    center = max(space, key=lambda c: sum(neighbour_distance(module.DOMAINS, c, o) is not None for o in space))
    neighbours = [o for o in space if neighbour_distance(module.DOMAINS, center, o) is not None]
    assert len(neighbours) >= 2
    seeded = dataclasses.replace(ctx, best_source=module.render(center))
    proposals = SearchProposer().propose(seeded, [], len(neighbours))
    got = [config(p.source) for p in proposals]
    assert center not in got
    assert sorted(map(str, got)) == sorted(map(str, neighbours))
    # nearest values first
    dists = [neighbour_distance(module.DOMAINS, center, g)[0] for g in got]
    assert dists == sorted(dists)


def test_header_is_found_in_an_edited_best_source():
    module = module_for("silu_mul")
    params = {"template": "grid2d", "block": 512, "num_warps": 4}
    edited = "# an LLM touched this\n" + module.render(params) + "\n# trailing note\n"
    ctx = make_ctx("silu_mul", device=CUDA, best_source=edited)
    first = SearchProposer().propose(ctx, [], 1)[0]
    assert neighbour_distance(module.DOMAINS, params, config(first.source)) is not None


def verdict(correct: bool, speedup: float | None = None, failure: str | None = None) -> dict:
    return {"correct": correct, "accepted": bool(speedup and speedup > 1.03), "speedup": speedup,
            "failure": failure, "reason": ""}


def test_feedback_steers_to_the_fastest_correct_config():
    ctx = make_ctx("silu_mul", device=CUDA)
    module = module_for("silu_mul")
    sp = SearchProposer()
    first = sp.propose(ctx, [], 6)
    fast, slow = first[4], first[0]
    feedback = [(slow, verdict(True, 0.8)), (fast, verdict(True, 1.4))]
    nxt = sp.propose(ctx, feedback, 3)
    assert nxt
    for p in nxt:
        assert neighbour_distance(module.DOMAINS, config(fast.source), config(p.source)) is not None
    seen = {sha256_text(p.source) for p in first}
    assert not seen & {sha256_text(p.source) for p in nxt}


def test_failed_template_is_deprioritised():
    ctx = make_ctx("rmsnorm", device=CUDA)
    sp = SearchProposer()
    first = sp.propose(ctx, [], 3)
    assert [config(p.source)["template"] for p in first] == ["row", "multirow", "chunked"]
    bad = first[1]  # multirow
    rest = sp.propose(ctx, [(bad, verdict(False, failure="mismatch"))], 1000)
    templates = [config(p.source)["template"] for p in rest]
    assert "multirow" in templates
    k = templates.index("multirow")
    assert set(templates[k:]) == {"multirow"}
    # the same from history (ctx.failures), but a not-faster entry says nothing against its template
    fresh = SearchProposer()
    hist = make_ctx("rmsnorm", device=CUDA, failures=(
        {"source": bad.source, "failure": "mismatch", "reason": "x"},
        {"source": first[2].source, "failure": "not-faster", "reason": "y"},
    ))
    order = [config(p.source)["template"] for p in fresh.propose(hist, [], 1000)]
    k = order.index("multirow")
    assert order[0] == "row" and "chunked" in order[:k] and set(order[k:]) == {"multirow"}


@pytest.mark.parametrize("op", OP_NAMES)
def test_exhaustion_and_no_repeats(op):
    ctx = make_ctx(op)
    sp = SearchProposer()
    size = len(sp.configs(ctx))
    excluded = sp.propose(make_ctx(op), [], 1)[0]  # proposed once: never again
    ctx = dataclasses.replace(ctx, failures=({"source": "not ours", "failure": "static", "reason": ""},))
    seen = {sha256_text(excluded.source)}
    feedback = [(excluded, verdict(True, 1.1))]
    while True:
        batch = sp.propose(ctx, feedback, 4)
        if not batch:
            break
        assert len(batch) <= 4
        for p in batch:
            digest = sha256_text(p.source)
            assert digest not in seen
            seen.add(digest)
            feedback.append((p, verdict(True, 1.0)))
    assert len(seen) == size
    assert sp.propose(ctx, feedback, 4) == []
    assert SearchProposer().propose(ctx, feedback, 4) == []  # a fresh object honours feedback too
    assert SearchProposer().propose(make_ctx(op), [], 0) == []


def test_unknown_op_gives_nothing():
    unknown = dataclasses.replace(get_op("rmsnorm"), name="softmax")  # an op the search has no template for
    ctx = dataclasses.replace(make_ctx("rmsnorm"), spec=unknown)
    assert SearchProposer().propose(ctx, [], 3) == []


def test_seed_reorders_reproducibly():
    ctx = make_ctx("decode_attention", device=CUDA)
    a = [p.label for p in SearchProposer(seed=1).propose(ctx, [], 10)]
    b = [p.label for p in SearchProposer(seed=1).propose(ctx, [], 10)]
    c = [p.label for p in SearchProposer(seed=0).propose(ctx, [], 10)]
    assert a == b and a != c


def test_on_a_gpu_configs_that_do_not_fit_it_are_skipped(monkeypatch):
    """On a GPU each pick is compiled for it first; a config with a problem (spills, too much shared
    memory, no compile) is skipped and the next one taken, so n proposals still come back."""
    from kernelloop.agent.proposers import search

    checked = []

    def problems(source, op, shapes, dtype, target):  # noqa: ANN001
        checked.append((config(source), target))
        return ["_tile_kernel: spills 672 bytes of registers on sm90"] if config(source)["template"] == "multirow" else []

    monkeypatch.setattr(search, "triton_interpreted", lambda: False)
    monkeypatch.setattr(search, "device_target", lambda: "sm90")
    monkeypatch.setattr(search, "source_problems", problems)
    sp = SearchProposer()
    got = sp.propose(make_ctx("rmsnorm", device=CUDA), [], 6)
    assert len(got) == 6 and all(config(p.source)["template"] != "multirow" for p in got)
    assert sp.skipped and all("spills" in why for _, why in sp.skipped)
    assert {t for _, t in checked} == {"sm90"}
    again = sp.propose(make_ctx("rmsnorm", device=CUDA), [], 50)  # skipped configs are not retried
    assert not {p.label for p in again} & {label for label, _ in sp.skipped}


# -- linear and extend_attention ---------------------------------------------------------------------

CONFIGS = {  # one config of each template; splitk and splitkv split at some battery shapes
    "linear tiled": ("linear", {"template": "tiled", "block_m": 32, "block_n": 64, "block_k": 32, "group_m": 4,
                                "num_warps": 4, "num_stages": 3}),
    "linear splitk": ("linear", {"template": "splitk", "block_m": 16, "block_n": 32, "block_k": 64, "max_splits": 16,
                                 "num_warps": 4, "num_stages": 4}),
    "extend flash": ("extend_attention", {"template": "flash", "block_m": 64, "block_n": 16, "num_warps": 4,
                                          "num_stages": 1}),
    "extend splitkv": ("extend_attention", {"template": "splitkv", "block_m": 64, "block_n": 32, "max_splits": 8,
                                            "min_split_tokens": 16, "num_warps": 4, "num_stages": 2}),
}
SECOND_KERNEL = {"linear": "_reduce_kernel", "extend_attention": "_merge_kernel"}  # launched only when split


class Counting:
    """Stands in for a kernel in a loaded module's globals: counts `kernel[grid](...)` launches."""

    def __init__(self, kernel) -> None:  # noqa: ANN001
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        self.launches += 1
        return self.kernel[grid]


def predicted_split(op: str, params: dict, shape: dict) -> bool:
    module = module_for(op)
    if op == "linear":
        return module.split_plan(params, shape["tokens"], shape["n"], shape["k"])[0] > 1
    return module.splits_for(params, shape) > 1


@pytest.mark.parametrize("name", list(CONFIGS))
def test_new_templates_pass_the_battery(name):
    op, params = CONFIGS[name]
    spec = get_op(op)
    source = module_for(op).render(params)
    loaded = load_kernel(source, spec.arg_names)  # unchecked forward: the test swaps a kernel in its module
    forward = loaded.own_forward
    counter = Counting(loaded.namespace[SECOND_KERNEL[op]])
    loaded.namespace[SECOND_KERNEL[op]] = counter
    splits = 0
    for i, case in enumerate(spec.battery(CPU)):
        for dtype in (torch.float32,) if case.variant else (torch.float32, torch.bfloat16):  # as the sandbox rotates
            before = counter.launches
            r = check_impl(spec, forward, case.shape, dtype, seed=11 + i, variant=case.variant or None)
            assert r.ok, f"{name} {case}: {r}"
            split = counter.launches > before
            assert split == predicted_split(op, params, case.shape), (name, case.shape)  # the space's model holds
            splits += split
    assert (splits > 0) == (params["template"] in ("splitk", "splitkv"))


PLANTED = {
    "linear drops the K tail": ("linear tiled", "    for k0 in range(k_lo, k_hi, BLOCK_K):\n",
                                "    for k0 in range(k_lo, k_hi - BLOCK_K + 1, BLOCK_K):\n"),
    "linear drops the last K of every tile": ("linear splitk", "        mask_k = offs_k < k_hi - k0\n",
                                            "        mask_k = offs_k < tl.minimum(k_hi - k0, BLOCK_K - 1)\n"),
    "linear reduce skips the last split": ("linear splitk", "    for _ in range(splits):\n",
                                           "    for _ in range(splits - 1):\n"),
    "extend causal mask j < i": ("extend flash", "causal = (offs_n[None, :] <= tok[:, None])",
                                 "causal = (offs_n[None, :] < tok[:, None])"),
    "extend prefix end off by one": ("extend splitkv", "        mask_n = offs_n < p_hi\n",
                                     "        mask_n = offs_n < p_hi - 1\n"),
    "extend new tokens from the pool": ("extend flash", "k = tl.load(k_ptr + (q_start + offs_n)",
                                        "k = tl.load(kb_ptr + (q_start + offs_n)"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_wrong_template_variants_fail(name):
    config, good, bad = PLANTED[name]
    op, params = CONFIGS[config]
    spec = get_op(op)
    source = module_for(op).render(params)
    assert good in source
    wrong = source.replace(good, bad)
    forward = load_forward(wrong, sha256_text(wrong), name)
    results = [check_impl(spec, forward, shape, torch.float32, seed=5) for shape in spec.test_shapes]
    failed = [r for r in results if not r.ok]
    assert failed, f"{name} passed every test shape"
    assert all("outside atol" in r.reason for r in failed), failed[0]
