// Counter-based Philox4x32-10 random numbers, shared by the CPU backend and the CUDA kernels so that
// both draw bit-identical streams for the same (seed, offset, element).
//
// Streams used by the library (docs/rng.md):
//   dropout:  key = seed, counter = {e >> 2 (64-bit, low word first), offset (64-bit, low word first)},
//             element e takes output word (e & 3); it is kept when word >= threshold(p).
//   init:     key = seed, counter = {e (64-bit), param_id, 0x494E4954}; words 0 and 1 feed Box-Muller.
//   graph dropout: a layer's training forward made while its stream captures a CUDA graph draws
//             its sites from key graph_dropout_seed(seed) with offset {k, n} (low word k, the site's
//             number 0, 1 or 2; high word n, taken from the context's device counter when the forward
//             runs), so every replay draws new masks (DropoutSite::offset_hi).
#ifndef DST_KERNELS_PHILOX_H
#define DST_KERNELS_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define DST_HD __host__ __device__ __forceinline__
#else
#define DST_HD inline
#endif

namespace dst {

struct Philox4 {
    uint32_t v[4];
};

DST_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t &hi, uint32_t &lo) {
    const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
    hi = static_cast<uint32_t>(p >> 32);
    lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 (Salmon et al., SC'11) on counter c with key k.
DST_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(M0, c.v[0], hi0, lo0);
        philox_mulhilo(M1, c.v[2], hi1, lo1);
        Philox4 n;
        n.v[0] = hi1 ^ c.v[1] ^ k0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ c.v[3] ^ k1;
        n.v[3] = lo0;
        c = n;
        k0 += W0;
        k1 += W1;
    }
    return c;
}

// The four 32-bit words for dropout group g = e >> 2 of a site with the given offset.
DST_HD Philox4 philox_dropout_block(uint64_t seed, uint64_t offset, uint64_t group) {
    Philox4 c;
    c.v[0] = static_cast<uint32_t>(group);
    c.v[1] = static_cast<uint32_t>(group >> 32);
    c.v[2] = static_cast<uint32_t>(offset);
    c.v[3] = static_cast<uint32_t>(offset >> 32);
    return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// True when element e of a dropout site survives. threshold = dropout_threshold(p).
DST_HD bool philox_dropout_keep(uint64_t seed, uint64_t offset, uint64_t e, uint32_t threshold) {
    const Philox4 r = philox_dropout_block(seed, offset, e >> 2);
    // A select, not r.v[e & 3]: a run-time index would put r in local memory on the GPU.
    const uint32_t k = static_cast<uint32_t>(e & 3);
    const uint32_t w = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
    return w >= threshold;
}

// The offset a site draws with: `offset`, or with offset_hi (backend memory, read when the op runs)
// the offset whose low word is offset's and whose high word is *offset_hi.
DST_HD uint64_t dropout_offset(uint64_t offset, const uint32_t *offset_hi) {
    return offset_hi ? (offset & 0xFFFFFFFFull) | (static_cast<uint64_t>(*offset_hi) << 32) : offset;
}

// The key of the graph dropout stream: the context's seed with its bits changed by a fixed word, so
// that captured calls never draw a counter the context's host offsets draw.
constexpr uint64_t kGraphDropoutSeedXor = 0x6772617068445354ull;  // "graphDST"
inline uint64_t graph_dropout_seed(uint64_t seed) { return seed ^ kGraphDropoutSeedXor; }

// One dropout site: keep element e iff philox_dropout_keep(seed, offset, e, threshold);
// kept elements are scaled by `scale` = 1/(1-p). threshold == 0 means no dropout (identity).
// With a row map (rows != nullptr, the elementwise ops of packed layer calls): the buffer holds
// rows of row_len elements, and element c of buffer row r is element rows[r]·row_len + c of the
// site (its place in the padded layout), so packed and padded calls drop the same elements.
struct DropoutSite {
    uint64_t seed = 0;
    uint64_t offset = 0;
    uint32_t threshold = 0;
    double scale = 1.0;
    const int32_t *rows = nullptr;  // backend memory; nullptr: element e is the buffer's element e
    int64_t row_len = 0;
    // Backend memory, or nullptr: the high word of the offset, read when the op runs (a training
    // forward captured into a CUDA graph, whose replays each take a new one); offset < 2^32 then.
    const uint32_t *offset_hi = nullptr;
    bool active() const { return threshold != 0; }
    // The offset the site draws with (reads *offset_hi: only where that memory is readable).
    DST_HD uint64_t offset_now() const { return dropout_offset(offset, offset_hi); }
};

// Integer threshold for drop probability p in [0, 1): a word u is kept iff u / 2^32 >= p,
// i.e. u >= ceil(p * 2^32). Computed on the host in double so every backend uses the same value.
inline uint32_t dropout_threshold(double p) {
    if (!(p > 0.0)) return 0u;
    double t = p * 4294967296.0;
    uint64_t ti = static_cast<uint64_t>(t);
    if (static_cast<double>(ti) < t) ++ti;
    return ti > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<uint32_t>(ti);
}

}  // namespace dst

#endif  // DST_KERNELS_PHILOX_H
