"""Radix-tree prefix cache over token ids (page size 1), in the style of SGLang's RadixCache."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class RadixNode:
    """One edge of the tree: `key` token ids whose KV lives in `value` slots (same length)."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access", "id")
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], value: torch.Tensor, parent: RadixNode | None,
                 lock_ref: int = 0, last_access: int = 0) -> None:
        self.key = key
        self.value = value
        self.children: dict[int, RadixNode] = {}
        self.parent = parent
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.id = next(RadixNode._ids)  # creation order: LRU tie-break

    def __repr__(self) -> str:
        return f"RadixNode(id={self.id}, len={len(self.key)}, ref={self.lock_ref}, t={self.last_access})"


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix: its KV slots (int64, possibly empty) and the node ending it."""

    slots: torch.Tensor
    node: RadixNode

    def __len__(self) -> int:
        return len(self.slots)


def _as_key(tokens: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    return tuple(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)


def _common_len(key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of `key` and `tokens[start:]`; O(len) with a C fast path."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == tokens[start:start + n]:
        return n
    i = 0
    while key[i] == tokens[start + i]:
        i += 1
    return i


class RadixCache:
    """Prefix cache: a radix tree whose root-to-node paths are cached token sequences.

    Invariants (checked by tests/test_engine_radix_cache.py after every operation):
    - Every non-root node has a non-empty `key` and `len(value) == len(key)`; children are keyed
      by the first token of their key, so siblings never share a first token.
    - Slot ownership: every slot in some node's `value` is owned by the cache and appears in exactly
      one node. It leaves the cache only through `free_slots` (on `evict` or `reset`), exactly once.
    - `lock_ref` of a node is the number of `lock` calls on it or on any descendant not yet undone
      by `unlock`; so a node's ref is >= each child's. A node with ref > 0 is never evicted.
    - `evictable_size()` = tokens in non-root nodes with ref == 0, `protected_size()` = tokens in
      nodes with ref > 0; `total_size()` is their sum. All three are O(1) counters.
    - `_leaves` holds exactly the evictable leaves: non-root, no children, ref == 0.
    - LRU time is a monotonic operation counter (`_clock`), not wall time.
    - After `invalidate`, nodes that were locked hang from a retired root: never matched again, still
      counted, unlocked and evicted like the rest (a node is a root exactly when its parent is None).
    """

    def __init__(self, free_slots: Callable[[torch.Tensor], None], *, disabled: bool = False) -> None:
        self.free_slots = free_slots
        self.disabled = disabled
        self.reset(free=False)

    # ---- state -------------------------------------------------------------------------------

    def reset(self, *, free: bool = True) -> None:
        """Drop every cached sequence (and the hit counters). With `free`, return all cached slots
        through `free_slots` first; refused while any node is locked (requests still use them)."""
        if free:
            if self.protected_size():
                raise RuntimeError(f"reset with {self.protected_size()} locked tokens")
            slots = [n.value for n in self._nodes() if n.parent is not None]
            if slots:
                self.free_slots(torch.cat(slots))
        self.root = RadixNode((), _EMPTY, None)
        self._retired: list[RadixNode] = []  # roots of trees `invalidate` took out of matching
        self._leaves: set[RadixNode] = set()
        self._evictable = 0
        self._protected = 0
        self._clock = 0
        self.hit_tokens = 0
        self.queried_tokens = 0

    def invalidate(self) -> int:
        """Never match anything cached so far again (the kernels changed: that KV was computed by
        others). Unlocked sequences are freed now; the ones requests still hold leave matching at once
        and are freed by eviction once released. Returns the tokens freed now."""
        freed = self.evict(self._evictable)
        if self.root.children:  # all locked: in-flight requests' prefixes
            self._retired.append(self.root)
            self.root = RadixNode((), _EMPTY, None)
        return freed

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    # ---- lookup and insertion ----------------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int] | torch.Tensor, *, count: bool = True) -> PrefixMatch:
        """Longest cached prefix of `tokens`. A match ending inside an edge splits that node so the
        returned node ends exactly at the match. Touches the path (LRU) and, with `count`, counts
        queried and hit tokens (off for the scheduler's own look-ups of what it just inserted)."""
        key = _as_key(tokens)
        if count:
            self.queried_tokens += len(key)
        if self.disabled or not key:
            return PrefixMatch(_EMPTY, self.root)
        self._clock += 1
        node, pos, values = self.root, 0, []
        while pos < len(key) and (child := node.children.get(key[pos])) is not None:
            n = _common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self._clock
            values.append(child.value)
            node, pos = child, pos + n
        if count:
            self.hit_tokens += pos
        return PrefixMatch(torch.cat(values) if values else _EMPTY, node)

    def insert(self, tokens: Sequence[int] | torch.Tensor, slots: torch.Tensor) -> int:
        """Cache `tokens` whose KV lives in `slots` (one slot per token); return `k`, how many
        leading tokens were already cached.

        Ownership: the cache takes `slots[k:]`. `slots[:k]` stay the caller's: for i < k the cache
        keeps its own slot, so the caller frees `slots[:k]` except those it got from this cache
        (via `match_prefix`), i.e. typically `slots[len(prefix):k]`. When disabled the cache takes
        every slot and frees it at once (returns 0), so callers need no special case.
        """
        key = _as_key(tokens)
        if len(slots) != len(key):
            raise ValueError(f"{len(key)} tokens but {len(slots)} slots")
        if self.disabled:
            if len(key):
                self.free_slots(slots)
            return 0
        self._clock += 1
        node, pos = self.root, 0
        while pos < len(key) and (child := node.children.get(key[pos])) is not None:
            n = _common_len(child.key, key, pos)
            child.last_access = self._clock
            pos += n
            if n < len(child.key):
                if pos == len(key):
                    return pos  # ends inside an edge: already cached, nothing to add
                child = self._split(child, n)
            node = child
        if pos < len(key):
            leaf = RadixNode(key[pos:], slots[pos:].to(torch.int64).clone(), node,
                             last_access=self._clock)
            node.children[key[pos]] = leaf
            self._evictable += len(leaf.key)
            self._refresh(leaf)
            self._refresh(node)
        return pos

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Cut `child`'s edge after `n` tokens; return the new upper node (same ref and time)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = RadixNode(child.key[:n], child.value[:n], parent, child.lock_ref, child.last_access)
        parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper  # sizes unchanged; `child` keeps its leaf status, `upper` has a child

    # ---- locking and eviction ----------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect the path root..node from eviction (one reference on each node)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            self._refresh(node)
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        """Undo one `lock(node)` (also on a node `invalidate` retired)."""
        while node.parent is not None:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of unlocked {node!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            self._refresh(node)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Evict least-recently-used unlocked leaves (a parent left childless becomes one) until at
        least `num_tokens` slots were freed or nothing is evictable; return the number freed."""
        if self.disabled or num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        count = 0
        while count < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            self._leaves.discard(node)
            self._evictable -= len(node.key)
            count += len(node.key)
            freed.append(node.value)
            node.parent = None
            self._refresh(parent)
            if parent in self._leaves:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        if freed:
            self.free_slots(torch.cat(freed))
        return count

    def _refresh(self, node: RadixNode) -> None:
        if node.parent is not None and not node.children and node.lock_ref == 0:
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    def _nodes(self) -> list[RadixNode]:
        """Every node, of the live tree and of the retired ones (whose roots are kept while they hold any)."""
        self._retired = [r for r in self._retired if r.children]
        out, stack = [], [self.root, *self._retired]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
