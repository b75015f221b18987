"""Philox4x32-10 counter-based random numbers in NumPy (independent reference).

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps a 128-bit counter
(c0, c1, c2, c3) and a 64-bit key (k0, k1) to four 32-bit words through 10 rounds.  One round:

    (hi0, lo0) = mulhilo(0xD2511F53, c0)        # 64-bit product split into its high and low 32-bit halves
    (hi1, lo1) = mulhilo(0xCD9E8D57, c2)
    c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
    k0 += 0x9E3779B9;  k1 += 0xBB67AE85          # Weyl key schedule, mod 2^32, after every round

All arithmetic is done in uint64 arrays holding 32-bit values: the product of two values < 2^32 fits in 64 bits
exactly, so the high/low split is a shift and a mask.  Every function is vectorised over the counters.

libdstransformer convention (docs/rng.md, "Dropout"): for a dropout site with RNG state (seed, off),
element e draws word (e & 3) of philox(counter = (e>>2 & 0xffffffff, e>>34, off & 0xffffffff, off>>32),
key = (seed & 0xffffffff, seed>>32)).  `philox_words` returns exactly these per-element words.
"""

import numpy as np

MASK32 = np.uint64(0xFFFFFFFF)
PHILOX_M0 = np.uint64(0xD2511F53)  # multiplier applied to c0
PHILOX_M1 = np.uint64(0xCD9E8D57)  # multiplier applied to c2
PHILOX_W0 = np.uint64(0x9E3779B9)  # key bump for k0 (golden ratio)
PHILOX_W1 = np.uint64(0xBB67AE85)  # key bump for k1 (sqrt(3) - 1)
ROUNDS = 10


def _u32(a):
    """Array of 32-bit values carried in uint64 (Python ints of any size are reduced mod 2^32)."""
    if isinstance(a, (int, np.integer)):
        return np.uint64(int(a) & 0xFFFFFFFF)
    return np.asarray(a, dtype=np.uint64) & MASK32


def philox4x32_10(counter, key):
    """Philox4x32-10 block function.

    counter: sequence of 4 values or arrays (broadcastable to one shape), each a 32-bit word.
    key:     sequence of 2 values or arrays, each a 32-bit word.
    Returns a tuple of 4 uint64 arrays (values < 2^32): the output words 0..3.
    """
    c0, c1, c2, c3 = (_u32(c) for c in counter)
    k0, k1 = (_u32(k) for k in key)
    shape = np.broadcast(c0, c1, c2, c3, k0, k1).shape
    c0, c1, c2, c3, k0, k1 = (np.broadcast_to(v, shape).astype(np.uint64) for v in (c0, c1, c2, c3, k0, k1))
    for _ in range(ROUNDS):
        p0 = PHILOX_M0 * c0  # < 2^64: exact in uint64
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def philox_words(seed, offset, n):
    """The 32-bit random word of every element e = 0..n-1 of a dropout site (uint64 array of length n).

    Element e uses counter (e>>2 & 0xffffffff, e>>34, offset & 0xffffffff, offset>>32) and key
    (seed & 0xffffffff, seed>>32) and takes output word number (e & 3).  Four consecutive elements therefore
    share one Philox call; we evaluate one call per block of 4 and interleave its four words.
    """
    seed = int(seed)
    offset = int(offset)
    if not (0 <= seed < 2**64 and 0 <= offset < 2**64):
        raise ValueError("seed and offset must be unsigned 64-bit values")
    n = int(n)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    nblk = (n + 3) // 4
    blk = np.arange(nblk, dtype=np.uint64)  # blk = e >> 2
    counter = (blk & MASK32, blk >> np.uint64(32), offset & 0xFFFFFFFF, offset >> 32)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    w = np.stack(philox4x32_10(counter, key), axis=1)  # [nblk, 4]: row = block, column = e & 3
    return w.reshape(-1)[:n]
