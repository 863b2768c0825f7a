"""Dropout's random bits (docs/numerics.md, "Dropout"): element g takes word g mod 4 of Philox4x32-10 at
counter (lo32(g div 4), hi32(g div 4), 0, 0), key (lo32(seed), hi32(seed)), and is kept iff
(word >> 8) >= floor(p * 2^24).

The definition is checked three ways: a numpy implementation written apart from interface/numerics.py
(uint64 products, no shared code) against Random123's published known answers; the interface's
dropout_bits against it, groups straddling rows and 32-bit carries included; and one kernel's keep masks
on every target that runs here against it, bit for bit, for seven thresholds of one runtime p (one build
per target), with a 64-bit seed and an offset that is not a multiple of 4 and crosses 2^34, where g div 4
carries into its high word. tests/cuda/test_cuda_numerics.py checks all 32 bits of the device core (compiled
for the host) against numerics.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hk_portable as hk
from hk_portable import GL, RT, f32
from hk_portable.interface import UnsupportedError
from hk_portable.interface.numerics import dropout_bits, dropout_keep, dropout_threshold
from hk_portable.runtime import registry

M32 = np.uint64(0xFFFFFFFF)


def np_philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., SC11) on uint64 arrays holding uint32 values: four uint32 arrays."""
    c = [np.asarray(v, dtype=np.uint64) & M32 for v in counter]
    k0, k1 = (np.asarray(v, dtype=np.uint64) & M32 for v in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
        p0 = np.uint64(0xD2511F53) * c[0]           # < 2^64: exact in uint64
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M32]
    return c


def np_dropout_bits(seed: int, g: np.ndarray) -> np.ndarray:
    """The numerics page's bits of elements g (uint64), written from the page, not from numerics.py."""
    g = np.asarray(g, dtype=np.uint64)
    q = g >> np.uint64(2)
    zero = np.zeros_like(q)
    words = np.stack(np_philox4x32_10((q & M32, q >> np.uint64(32), zero, zero), (seed & 0xFFFFFFFF, seed >> 32)))
    return np.take_along_axis(words, (g & np.uint64(3)).astype(np.int64)[None], 0)[0]


# Random123's known-answer vectors for philox4x32_10 (its kat_vectors, as TensorFlow's XLA stateful random
# test cites them from Random123-Boost libs/random/test/test_philox.cpp)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_the_numpy_philox_gives_the_random123_known_answers(counter, key, expected):
    assert tuple(int(w) for w in np_philox4x32_10(counter, key)) == expected


def _as_int64(g: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(g, dtype=np.uint64).view(np.int64))


@pytest.mark.parametrize("seed", [0, 0x9E3779B97F4A7C15, 2**64 - 1])
def test_interface_bits_are_word_g_mod_4_of_call_g_div_4(seed):
    edges = [0, 2**32 - 5, 2**34 - 7, 2**63 - 3, 2**64 - 9]      # 32-bit carries of g and of g div 4, sign
    g = np.concatenate([np.arange(e, e + 9, dtype=np.uint64) for e in edges]
                       + [np.random.default_rng(1).integers(0, 2**63, 4000, dtype=np.uint64) * np.uint64(2)])
    got = dropout_bits(seed, _as_int64(g)).numpy().astype(np.uint64)
    assert np.array_equal(got, np_dropout_bits(seed, g))


def test_the_four_elements_of_a_group_are_the_four_words_of_one_call():
    q = 12345
    words = np_philox4x32_10((q, 0, 0, 0), (7, 0))
    got = dropout_bits(7, torch.arange(4 * q, 4 * q + 4))
    assert [int(w) for w in got] == [int(w) for w in words]


def test_the_keep_test_and_threshold():
    g = np.arange(2**34 - 4099, 2**34 + 4099, dtype=np.uint64)
    bits = np_dropout_bits(5, g)
    for p in (0.0, 0.1, 0.5, 1.0):
        want = (bits >> np.uint64(8)) >= np.uint64(dropout_threshold(p))
        assert np.array_equal(dropout_keep(p, 5, _as_int64(g)).numpy(), want)
    assert dropout_threshold(1.0) == 2**24 and dropout_threshold(0.5) == 2**23


# ------------------------------------------------------------------------------ the bits on every target
TR = TC = 32
SHAPE = (37, 70)                  # ragged tiles; 70 per row, so groups straddle rows and tile edges
SEED = 0xDEADBEEF12345678
OFFSET = 2**34 - 2 * 70 - 3       # odd; row 2's groups cross g = 2^34, where g div 4 reaches 2^32
TARGETS = ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated", "hip:gfx950:emulated"]


@hk.kernel(name="dropout_bits_probe")
def _probe(x: GL[2], y: GL[2], p: float, seed_lo: int, seed_hi: int, off_lo: int, off_hi: int):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, TR, TC], x, (m, n))
    keep = hk.dropout_mask(t, p, (seed_lo, seed_hi), (off_lo, off_hi), m * TR, n * TC, x.shape[1])
    hk.store(y, hk.where(keep, t, 0.0), (m, n))


def _i32(w: int) -> int:
    """A 32-bit word as the int32 with its bits (the runtime scalars' encoding of 64-bit halves)."""
    return w - 2**32 if w >= 2**31 else w


def _skip_unless_runs(spec: str):
    if spec == "reference":
        return
    name, arch, _ = spec.split(":")
    if name not in registry.names():
        pytest.skip(f"the {name} backend is not installed")
    if not hk.get_backend(name).target(arch, emulated=True).has("run"):
        pytest.skip(f"{spec} cannot run here")


@pytest.mark.parametrize("spec", TARGETS)
def test_the_keep_masks_are_the_same_bits_on_every_target(spec):
    _skip_unless_runs(spec)
    M, N = SHAPE
    g = OFFSET + np.arange(M, dtype=np.uint64)[:, None] * np.uint64(N) + np.arange(N, dtype=np.uint64)[None]
    word = np_dropout_bits(SEED, g) >> np.uint64(8)
    x = torch.ones(SHAPE)
    args = [_i32(SEED & 0xFFFFFFFF), _i32(SEED >> 32), _i32(OFFSET & 0xFFFFFFFF), _i32(OFFSET >> 32)]
    for p in [k / 8 for k in range(1, 8)]:     # seven thresholds: the top three bits of each element's word
        y = torch.full(SHAPE, float("nan"))
        _probe(x, y, p, *args, grid=(2, 3), backend=spec)
        want = torch.from_numpy(word >= np.uint64(dropout_threshold(p)))
        assert torch.equal(y == 1.0, want), f"{spec}, p={p}: {int((y.eq(1.0) != want).sum())} elements differ"


@hk.kernel(name="dropout_bits_narrow_tiles")
def _narrow(x: GL[2], y: GL[2], p: float, seed_lo: int, seed_hi: int, off_lo: int, off_hi: int):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, 3, 5], x, (m, n))
    keep = hk.dropout_mask(t, p, (seed_lo, seed_hi), (off_lo, off_hi), m * 3, n * 5, x.shape[1])
    hk.store(y, hk.where(keep, t, 0.0), (m, n))


@pytest.mark.parametrize("spec", TARGETS)
def test_tiles_that_cut_groups_give_each_element_its_word_of_the_shared_call(spec):
    """3x5 tiles over 7x23 (odd row stride, odd offset): groups are cut by tile edges and by rows; each element
    still takes word g mod 4 of call g div 4, whichever tile holds it. cuda's register tiles are multiples of
    16 x 8, so there the case above cuts groups with its offset and row stride instead."""
    _skip_unless_runs(spec)
    M, N = 7, 23
    g = OFFSET + np.arange(M, dtype=np.uint64)[:, None] * np.uint64(N) + np.arange(N, dtype=np.uint64)[None]
    word = np_dropout_bits(SEED, g) >> np.uint64(8)
    args = [_i32(SEED & 0xFFFFFFFF), _i32(SEED >> 32), _i32(OFFSET & 0xFFFFFFFF), _i32(OFFSET >> 32)]
    y = torch.full((M, N), float("nan"))
    try:
        _narrow(torch.ones(M, N), y, 0.5, *args, grid=(3, 5), backend=spec)
    except UnsupportedError as e:
        pytest.skip(str(e))
    assert torch.equal(y == 1.0, torch.from_numpy(word >= np.uint64(2**23)))
