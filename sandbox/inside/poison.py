"""What fresh memory holds in the sandbox, and the guard zones around it in the replay.

Poison: every allocation made during a judged call (in the runner, and again in the replay) is
filled with a pattern drawn for that allocation from os.urandom: NaN, zeros, random bits, a large
finite value, normal noise (integers: -1, zeros, random bits, the type's extreme). The runner and
the replay draw independently, so a kernel that reads memory it never wrote gives different bits in
the two (refused: the replay must match bit for bit), and no fixed pattern tells the judge from the
engine, which never poisons (real allocations are often zeros, or stale data). The replayer draws
from a seed of its own that it restarts before each replay (`repeat_from`): two replays of one record
poison alike, so replays that differ from each other are a nondeterministic kernel, and replays that
agree with each other but not with the runner are a result made outside the launches.

Guard zones (replay only): each buffer made during the call lives inside a larger allocation with
`guard_bytes` of random bytes before and after it; `Guarded.intact()` says whether a kernel wrote
there. On a GPU, where no address is checked, that is what catches a store past an allocation.
"""

from __future__ import annotations

import os
import random

import torch

# pattern -> weight; zeros are rarer: both processes drawing them for one trial is the case a kernel
# reading unwritten memory could pass by (it reads zeros, as real allocations often are).
FLOAT_PATTERNS = {"nan": 2, "zeros": 1, "bits": 2, "large": 1, "normal": 2}
INT_PATTERNS = {"minus_one": 2, "zeros": 1, "bits": 3, "extreme": 2}
BOOL_PATTERNS = {"false": 1, "true": 1, "bits": 2}
_GENERATORS: dict[tuple[int, str], torch.Generator] = {}
_REPEAT: random.Random | None = None  # set by `repeat_from`: draws follow a sequence, else os.urandom


def _seed() -> int:
    return _REPEAT.getrandbits(63) if _REPEAT is not None else fresh_seed()


def fresh_seed() -> int:
    """A seed from os.urandom, whatever mode the draws are in."""
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)


def repeat_from(seed: int) -> None:
    """Draw, from now on in this process, the sequence `seed` gives (patterns and random bytes alike)."""
    global _REPEAT
    _REPEAT = random.Random(seed)


def _generator(device: torch.device) -> torch.Generator:
    """A generator per process and device, seeded from os.urandom in this process (never inherited
    from the fork server, so no two processes draw alike)."""
    key = (os.getpid(), str(device))
    if key not in _GENERATORS:
        _GENERATORS[key] = torch.Generator(device=device).manual_seed(_seed())
    elif _REPEAT is not None:
        _GENERATORS[key].manual_seed(_seed())
    return _GENERATORS[key]


def draw(patterns: dict[str, int]) -> str:
    pick = _seed() % sum(patterns.values())
    for name, weight in patterns.items():
        if pick < weight:
            return name
        pick -= weight
    raise AssertionError("unreachable")


def random_bytes(t: torch.Tensor, gen: torch.Generator) -> None:
    """Fill a flat uint8 tensor with random bytes: 8 at a time where it can (16x faster on CPU)."""
    bulk = t.numel() // 8 * 8 if t.data_ptr() % 8 == 0 else 0
    if bulk:
        t[:bulk].view(torch.int64).random_(-(1 << 63), (1 << 63) - 1, generator=gen)
    if bulk < t.numel():
        t[bulk:].random_(0, 256, generator=gen)


def _flat(storage: torch.UntypedStorage, dtype: torch.dtype, byte_offset: int, nbytes: int) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=storage.device).set_(
        storage, byte_offset // dtype.itemsize, (nbytes // dtype.itemsize,), (1,))


def fill(storage: torch.UntypedStorage, dtype: torch.dtype, byte_offset: int = 0, nbytes: int | None = None) -> str:
    """Poison `nbytes` of `storage` from `byte_offset` (default: all of it) as `dtype` data, with a
    pattern drawn now. Returns the pattern's name."""
    nbytes = storage.nbytes() - byte_offset if nbytes is None else nbytes
    if nbytes <= 0:
        return "empty"
    gen = _generator(storage.device)
    if dtype == torch.bool:
        name = draw(BOOL_PATTERNS)
        t = _flat(storage, torch.bool, byte_offset, nbytes)
        if name == "bits":
            t.view(torch.uint8).random_(0, 2, generator=gen)
        else:
            t.fill_(name == "true")
        return name
    floating = dtype.is_floating_point
    name = draw(FLOAT_PATTERNS if floating else INT_PATTERNS)
    if name == "bits":
        random_bytes(_flat(storage, torch.uint8, byte_offset, nbytes), gen)
        return name
    t = _flat(storage, dtype, byte_offset, nbytes)
    if name == "normal":
        t.normal_(generator=gen)
    elif name == "zeros":
        t.zero_()
    elif name == "nan":
        t.fill_(float("nan"))
    elif name == "large":
        scale = 0.5 + (_seed() % 1000) / 2000  # (0.5 .. 1) of the largest finite value, either sign
        t.fill_(torch.finfo(dtype).max * scale * (1 if _seed() & 1 else -1))
    elif name == "minus_one":
        t.fill_(-1)
    else:  # extreme
        info = torch.iinfo(dtype)
        t.fill_(info.max if _seed() & 1 else info.min)
    return name


def poison(t: torch.Tensor) -> None:
    """Poison the whole storage behind a fresh allocation."""
    fill(t.untyped_storage(), t.dtype)


def guard_bytes(nbytes: int) -> int:
    """The guard on each side of an allocation of `nbytes`: between 4 KiB and 64 KiB, a multiple of 256
    (keeps every alignment a kernel may rely on)."""
    return min(64 << 10, max(4 << 10, (nbytes + 255) // 256 * 256))


class Guarded:
    """A buffer of `nbytes` inside an allocation with a random guard zone on each side.

    `storage` is the whole allocation; the buffer starts `base` bytes into it."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes, self.base = nbytes, guard_bytes(nbytes)
        whole = torch.empty(2 * self.base + nbytes, dtype=torch.uint8, device=device)
        self.storage = whole.untyped_storage()
        self.pattern = torch.empty((2, self.base), dtype=torch.uint8, device=device)
        random_bytes(self.pattern.view(-1), _generator(whole.device))
        self._guards().copy_(self.pattern)

    def _guards(self) -> torch.Tensor:
        """Both guard zones as one [2, guard] view (one copy, one comparison)."""
        whole = torch.empty(0, dtype=torch.uint8, device=self.storage.device).set_(self.storage)
        return whole.as_strided((2, self.base), (self.base + self.nbytes, 1))

    def address(self) -> int:
        return self.storage.data_ptr() + self.base

    def intact(self) -> tuple[bool, int]:
        """(whether both guards hold their pattern, the byte offset from the buffer's start of the first
        changed guard byte: negative before it, >= nbytes after it)."""
        changed = self._guards() != self.pattern
        if not bool(changed.any()):
            return True, 0
        i = int(changed.view(-1).nonzero()[0])
        return False, (i - self.base if i < self.base else self.nbytes + i - self.base)
