"""The radix prefix cache: matching, splitting, insert ownership, locks, LRU eviction, counters."""

from __future__ import annotations

import random

import pytest
import torch

from kernelloop.engine.radix_cache import PrefixMatch, RadixCache, RadixNode


class Pool:
    """Fake token-to-KV allocator: catches double frees, frees of unknown slots and leaks."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.size = size
        self.free: list[int] = list(range(size - 1, -1, -1))
        self.free_set: set[int] = set(self.free)
        self.freed_log: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        assert n <= len(self.free), "pool exhausted"
        out = [self.free.pop() for _ in range(n)]
        self.free_set.difference_update(out)
        return torch.tensor(out, dtype=torch.int64)

    def release(self, slots: torch.Tensor) -> None:
        assert slots.dtype == torch.int64
        for s in slots.tolist():
            assert 0 <= s < self.size, f"unknown slot {s}"
            assert s not in self.free_set, f"slot {s} freed twice"
            self.free_set.add(s)
            self.free.append(s)
            self.freed_log.append(s)


def slots(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def walk(cache: RadixCache) -> list[RadixNode]:
    """Every node, the retired trees' too (RadixCache.invalidate)."""
    out, stack = [], [cache.root, *cache._retired]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def cached_slots(cache: RadixCache) -> list[int]:
    return [s for n in walk(cache) for s in n.value.tolist()]


def check_invariants(cache: RadixCache) -> None:
    """Brute-force recount of the tree against the cache's counters and structure."""
    evictable = protected = 0
    leaves = set()
    for node in walk(cache):
        for first, child in node.children.items():
            assert child.parent is node
            assert child.key and child.key[0] == first
            assert len(child.value) == len(child.key)
            assert child.lock_ref <= node.lock_ref or node.parent is None
        if node.parent is None:
            continue
        assert node.lock_ref >= 0
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if not node.children:
                leaves.add(node)
    assert cache.evictable_size() == evictable
    assert cache.protected_size() == protected
    assert cache.total_size() == evictable + protected
    assert cache._leaves == leaves
    all_slots = cached_slots(cache)
    assert len(all_slots) == len(set(all_slots)), "a slot appears in two nodes"


def test_match_on_empty_cache():
    cache = RadixCache(lambda s: None)
    m = cache.match_prefix([1, 2, 3])
    assert isinstance(m, PrefixMatch)
    assert m.slots.dtype == torch.int64 and m.slots.numel() == 0 and len(m) == 0
    assert m.node is cache.root
    assert cache.match_prefix([]).slots.numel() == 0
    assert (cache.hit_tokens, cache.queried_tokens, cache.hit_rate) == (0, 3, 0.0)
    check_invariants(cache)


def test_full_and_partial_match_with_split():
    cache = RadixCache(lambda s: None)
    assert cache.insert([1, 2, 3, 4, 5], slots(10, 11, 12, 13, 14)) == 0
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).slots.tolist() == [10, 11, 12, 13, 14]
    assert cache.match_prefix([7, 1]).slots.tolist() == []
    assert len(walk(cache)) == 2  # root + one edge: no split yet
    m = cache.match_prefix([1, 2, 3, 9])  # ends inside the edge: split after 3 tokens
    assert m.slots.tolist() == [10, 11, 12]
    assert m.node.key == (1, 2, 3) and m.node.value.tolist() == [10, 11, 12]
    (lower,) = m.node.children.values()
    assert lower.key == (4, 5) and lower.value.tolist() == [13, 14] and lower.parent is m.node
    assert len(walk(cache)) == 3
    assert cache.match_prefix(torch.tensor([1, 2, 3, 4, 5])).slots.tolist() == [10, 11, 12, 13, 14]
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == [10, 11, 12, 13]
    assert cache.total_size() == 5
    check_invariants(cache)


def test_insert_sharing_prefix_returns_shared_length():
    cache = RadixCache(lambda s: None)
    assert cache.insert([1, 2, 3, 4], slots(0, 1, 2, 3)) == 0
    assert cache.insert([1, 2, 3, 9, 9], slots(20, 21, 22, 23, 24)) == 3
    assert cache.insert([1, 2], slots(30, 31)) == 2  # already cached inside an edge
    assert cache.insert([1, 2, 3, 4], slots(40, 41, 42, 43)) == 4
    assert cache.insert([], slots()) == 0
    assert cache.total_size() == 6
    # The cache kept its own slots for the shared prefix and took the new tail.
    assert cache.match_prefix([1, 2, 3, 9, 9]).slots.tolist() == [0, 1, 2, 23, 24]
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == [0, 1, 2, 3]
    check_invariants(cache)
    with pytest.raises(ValueError):
        cache.insert([1, 2], slots(1))


def test_insert_ownership_no_leak_no_double_free():
    pool = Pool(64)
    cache = RadixCache(pool.release)
    seqs = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 7], [9], [1, 2, 3, 4, 5], [9, 8, 7, 6]]
    for seq in seqs:
        m = cache.match_prefix(seq)
        cache.lock(m.node)
        full = torch.cat([m.slots, pool.alloc(len(seq) - len(m))])
        k = cache.insert(seq, full)
        assert k >= len(m)
        pool.release(full[len(m):k])  # the caller's duplicates; the cache took full[k:]
        cache.unlock(m.node)
        check_invariants(cache)
    assert sorted(cached_slots(cache)) == sorted(set(range(64)) - pool.free_set)
    assert cache.evict(10**9) == 10
    assert len(pool.free_set) == 64 and cache.total_size() == 0
    check_invariants(cache)


def test_lock_prevents_eviction_unlock_allows():
    pool = Pool(16)
    cache = RadixCache(pool.release)
    cache.insert([1, 2, 3], pool.alloc(3))
    cache.insert([1, 2, 4, 5], pool.alloc(4))  # shares [1, 2]: caller frees its 2 duplicates
    pool.release(torch.tensor([3, 4]))
    m = cache.match_prefix([1, 2, 4, 5])
    cache.lock(m.node)
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    check_invariants(cache)
    assert cache.evict(100) == 1  # only the unlocked [3] leaf
    assert cache.total_size() == 4 and cache.match_prefix([1, 2, 4, 5]).slots.numel() == 4
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.protected_size() == 4  # still one reference
    cache.unlock(m.node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    with pytest.raises(RuntimeError):
        cache.unlock(m.node)
    assert cache.evict(100) == 4
    assert len(pool.free_set) == 16
    check_invariants(cache)


def test_lru_order():
    freed: list[list[int]] = []
    cache = RadixCache(lambda s: freed.append(s.tolist()))
    cache.insert([1, 1], slots(0, 1))
    cache.insert([2, 2], slots(2, 3))
    cache.insert([3, 3], slots(4, 5))
    assert cache.evict(1) == 2 and freed == [[0, 1]]  # oldest first
    cache.match_prefix([2, 2])  # touch [2, 2]: [3, 3] is now the oldest
    assert cache.evict(1) == 2 and freed[-1] == [4, 5]
    cache.insert([4], slots(6))
    cache.match_prefix([2, 2])
    assert cache.evict(1) == 1 and freed[-1] == [6]
    check_invariants(cache)


def test_evicting_leaf_makes_parent_evictable():
    freed: list[list[int]] = []
    cache = RadixCache(lambda s: freed.append(s.tolist()))
    cache.insert([1, 2, 3], slots(0, 1, 2))
    assert cache.insert([1, 2, 3, 4, 5], slots(9, 9, 9, 3, 4)) == 3
    assert len(cache._leaves) == 1
    assert cache.evict(1) == 2 and freed == [[3, 4]]  # leaf first, parent not needed yet
    check_invariants(cache)
    assert cache._leaves == {cache.root.children[1]}
    assert cache.evict(1) == 3 and freed[-1] == [0, 1, 2]
    # In one call: the parent joins the heap as soon as its last child goes.
    cache.insert([5, 6], slots(0, 1))
    cache.insert([5, 6, 7], slots(0, 1, 2))
    cache.insert([5, 6, 8], slots(0, 1, 3))
    assert cache.evict(5) == 4 and sorted(freed[-1]) == [0, 1, 2, 3]
    assert cache.total_size() == 0
    check_invariants(cache)


def test_hit_rate_counters():
    cache = RadixCache(lambda s: None)
    cache.match_prefix([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4], slots(0, 1, 2, 3))
    cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.match_prefix([1, 2, 9, 9, 9, 9])
    assert (cache.hit_tokens, cache.queried_tokens) == (6, 16)
    assert cache.hit_rate == pytest.approx(6 / 16)


def test_disabled_is_a_no_op_cache():
    pool = Pool(8)
    cache = RadixCache(pool.release, disabled=True)
    s = pool.alloc(4)
    assert cache.insert([1, 2, 3, 4], s) == 0  # takes every slot and frees it at once
    assert len(pool.free_set) == 8
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.slots.numel() == 0 and m.node is cache.root
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.evict(10) == 0 and cache.total_size() == 0
    assert (cache.hit_tokens, cache.queried_tokens) == (0, 4)


def test_reset_frees_everything_and_refuses_while_locked():
    pool = Pool(8)
    cache = RadixCache(pool.release)
    cache.insert([1, 2, 3], pool.alloc(3))
    cache.insert([1, 5], torch.cat([slots(0), pool.alloc(1)]))  # slot 0 came from the cache
    m = cache.match_prefix([1, 2])
    cache.lock(m.node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.unlock(m.node)
    cache.reset()
    assert len(pool.free_set) == 8 and cache.total_size() == 0 and cache.queried_tokens == 0
    assert cache.match_prefix([1, 2]).slots.numel() == 0
    check_invariants(cache)


def test_long_sequence_8k():
    cache = RadixCache(lambda s: None)
    rng = random.Random(1)
    seq = [rng.randrange(32000) for _ in range(8192)]
    cache.insert(seq, torch.arange(8192))
    assert torch.equal(cache.match_prefix(seq).slots, torch.arange(8192))
    other = seq[:4000] + [-1] * 4192
    assert cache.insert(other, torch.arange(8192, 16384)) == 4000
    assert cache.match_prefix(other).slots[3998:4002].tolist() == [3998, 3999, 12192, 12193]
    # Many requests sharing a long system prompt, each with its own tail.
    for i in range(200):
        tail = [-2 - i]
        assert cache.insert(seq[:6000] + tail, torch.cat([torch.arange(6000), slots(30000 + i)])) == 6000
        assert cache.match_prefix(seq[:6000] + tail).slots[-1].item() == 30000 + i
    assert cache.total_size() == 8192 + 4192 + 200
    check_invariants(cache)
    assert cache.evict(10**9) == 8192 + 4192 + 200
    check_invariants(cache)


def test_randomized_against_brute_force():
    rng = random.Random(1234)
    pool = Pool(400)
    cache = RadixCache(pool.release)
    meaning: dict[int, tuple[int, ...]] = {}  # slot -> the token prefix whose last KV it holds
    running: list[tuple[list[int], PrefixMatch, torch.Tensor]] = []
    corpus: list[list[int]] = [[]]

    def private_slots() -> set[int]:
        return {s for _, m, full in running for s in full[len(m):].tolist()}

    for _ in range(3000):
        op = rng.random()
        if op < 0.40 and len(running) < 8:  # admit a request: match, lock, allocate the rest
            base = rng.choice(corpus)
            seq = base[: rng.randint(0, len(base))] + [rng.randrange(3) for _ in range(rng.randint(0, 12))]
            if not seq:
                continue
            m = cache.match_prefix(seq)
            for i, s in enumerate(m.slots.tolist()):
                assert meaning[s] == tuple(seq[: i + 1]), "matched slot holds another prefix's KV"
            cache.lock(m.node)
            need = len(seq) - len(m)
            if need > len(pool.free):
                cache.evict(need - len(pool.free))
            if need > len(pool.free):
                cache.unlock(m.node)
                continue
            new = pool.alloc(need)
            for i, s in enumerate(new.tolist()):
                meaning[s] = tuple(seq[: len(m) + i + 1])
            running.append((seq, m, torch.cat([m.slots, new])))
        elif op < 0.75 and running:  # finish a request: insert, free duplicates, unlock
            seq, m, full = running.pop(rng.randrange(len(running)))
            k = cache.insert(seq, full)
            assert len(m) <= k <= len(seq)
            pool.release(full[len(m):k])
            cache.unlock(m.node)
            corpus.append(seq)
        elif op < 0.85 and running:  # abort a request: nothing cached, free its own slots
            seq, m, full = running.pop(rng.randrange(len(running)))
            pool.release(full[len(m):])
            cache.unlock(m.node)
        elif op < 0.95:
            before = cache.evictable_size()
            want = rng.randint(1, 30)
            got = cache.evict(want)
            # Unlocked nodes have only unlocked descendants, so all of them are evictable.
            assert got >= want or cache.evictable_size() == 0
            assert cache.evictable_size() == before - got
        else:
            seq = rng.choice(corpus)
            m = cache.match_prefix(seq)
            for i, s in enumerate(m.slots.tolist()):
                assert meaning[s] == tuple(seq[: i + 1])
        check_invariants(cache)
        # Every slot is in exactly one place: free, cached, or private to a running request.
        cached, private = cached_slots(cache), private_slots()
        assert len(cached) + len(private) + len(pool.free_set) == pool.size
        assert not (set(cached) & private) and not (set(cached) & pool.free_set)
        # Locks: each node's ref equals the number of running requests whose node is in its subtree.
        refs: dict[int, int] = {}
        for _, m, _ in running:
            n = m.node
            while n is not cache.root:
                refs[id(n)] = refs.get(id(n), 0) + 1
                n = n.parent
        for node in walk(cache)[1:]:
            assert node.lock_ref == refs.get(id(node), 0)
    for _seq, m, full in running:
        pool.release(full[len(m):])
        cache.unlock(m.node)
    cache.evict(10**9)
    assert cache.total_size() == 0 and len(pool.free_set) == pool.size
    assert cache.queried_tokens > cache.hit_tokens > 0


def test_invalidate_frees_what_is_free_and_never_matches_what_requests_hold():
    pool = Pool(64)
    cache = RadixCache(pool.release)
    held, free = pool.alloc(4), pool.alloc(3)
    cache.insert([1, 2, 3, 4], held)
    cache.insert([7, 8, 9], free)
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)  # a request in flight holds [1, 2, 3, 4]
    assert cache.invalidate() == 3 and sorted(pool.freed_log) == free.tolist()
    check_invariants(cache)
    assert cache.match_prefix([1, 2, 3, 4]).slots.numel() == 0  # held, but no longer matched
    assert cache.match_prefix([7, 8, 9]).slots.numel() == 0
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    fresh = pool.alloc(4)  # the same prompt computed again by the new kernels is cached anew
    assert cache.insert([1, 2, 3, 4], fresh) == 0
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == fresh.tolist()
    check_invariants(cache)
    cache.unlock(node)  # the request finishes: its old prefix becomes evictable, then freed
    check_invariants(cache)
    assert cache.evictable_size() == 8
    assert cache.evict(8) == 8 and set(pool.freed_log) == set(free.tolist() + held.tolist() + fresh.tolist())
    check_invariants(cache)
    assert cache.total_size() == 0 and cache._nodes() == [cache.root]


def test_reset_after_invalidate_frees_the_retired_trees_too():
    pool = Pool(64)
    cache = RadixCache(pool.release)
    held = pool.alloc(2)
    cache.insert([5, 6], held)
    node = cache.match_prefix([5, 6]).node
    cache.lock(node)
    cache.invalidate()
    with pytest.raises(RuntimeError):
        cache.reset()  # a request still holds it
    cache.unlock(node)
    cache.reset()
    assert sorted(pool.freed_log) == held.tolist() and cache.total_size() == 0
