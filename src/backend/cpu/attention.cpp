// Fused attention over a QKV activation [B, S, 3H] (Q, K, V blocks of H columns, head h at columns
// h·d…h·d+d−1 of each block), one (batch, head) pair per parallel task:
//   s_ij = scale·q_i·k_j + mask(b, j)   (−inf for j ≥ len[b] or, when causal, j > i),
//   lse_i = m_i + log Σ_j exp(s_ij − m_i) with m_i = max_j s_ij,  P_ij = exp(s_ij − lse_i)
//   (rows whose max is −inf: P = 0, lse = −inf), P̃ = P·keep·scale_drop, ctx_i = Σ_j P̃_ij v_j.
// Backward (docs/ops/attention.md): dV = P̃ᵀ·dctx, dP = (dctx·Vᵀ)·keep·scale_drop,
// D_i = dctx_i·ctx_i, dS = P⊙(dP − D), dQ = scale·dS·K, dK = scale·dSᵀ·Q, with P recomputed from
// qkv, the mask and lse. Dropout element index
// ((b·heads + h)·S + i)·S + j. Every sum runs in a fixed order inside one task: deterministic.
// Packed layout (AttentionParams::packed_tokens): sequence b's len[b] rows follow those of the
// sequences before it; only those rows are read, computed and written (a padded query row of the
// padded layout computes on its own, so the packed rows get the padded layout's values).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"

namespace dst {
namespace {

using cpu::compute_t;
using cpu::load;
using cpu::store;

// Where sequence b's tokens are in the buffers: rows b·S … b·S + S − 1 (padded), or its len[b] rows
// after the earlier sequences' (packed).
struct Rows {
    std::vector<int64_t> start;  // packed: B + 1 prefix sums of the lengths; empty when padded
    int64_t S;
    explicit Rows(const AttentionParams &p) : S(p.seq) {
        if (p.packed_tokens <= 0) return;
        const int32_t *len = static_cast<const int32_t *>(p.mask);
        start.assign(static_cast<size_t>(p.batch + 1), 0);
        for (int64_t b = 0; b < p.batch; ++b) start[size_t(b + 1)] = start[size_t(b)] + len[b];
    }
    int64_t row0(int64_t b) const { return start.empty() ? b * S : start[size_t(b)]; }
    int64_t rows(int64_t b) const { return start.empty() ? S : start[size_t(b + 1)] - start[size_t(b)]; }
};

// One (batch, head) pair: its Q, K, V as compute-type [S, d] copies in the caller's scratch (3·S·d
// elements), and the score rule.
template <typename T>
struct Head {
    using C = compute_t<T>;
    const AttentionParams &p;
    int64_t b, h, S, d, H3;
    int64_t row0, rows;  // the buffers' row of token 0 of sequence b, and its rows (S when padded)
    C *q, *k, *v;

    Head(const AttentionParams &ap, const void *qkv, const Rows &layout, int64_t bi, int64_t hi, C *scratch)
        : p(ap), b(bi), h(hi), S(ap.seq), d(ap.head_dim), H3(3 * ap.hidden), row0(layout.row0(bi)),
          rows(layout.rows(bi)), q(scratch), k(scratch + S * d), v(scratch + 2 * S * d) {
        if (rows < S) std::fill(q, q + 3 * S * d, C(0));  // packed: keys past the sequence are masked
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t t = 0; t < d; ++t) {
                q[i * d + t] = load<T>(qkv, col(i, 0, t));
                k[i * d + t] = load<T>(qkv, col(i, 1, t));
                v[i * d + t] = load<T>(qkv, col(i, 2, t));
            }
    }
    // Offset of element t of block blk (0 Q, 1 K, 2 V) of token i in a [tokens, 3H] buffer.
    int64_t col(int64_t i, int blk, int64_t t) const {
        return (row0 + i) * H3 + blk * p.hidden + h * d + t;
    }
    // Offset of element t of token i in a [tokens, H] buffer.
    int64_t ctx_at(int64_t i, int64_t t) const { return (row0 + i) * p.hidden + h * d + t; }
    int64_t row_index(int64_t i) const { return (b * p.heads + h) * S + i; }

    // Scores of row i into s[0..S).
    void scores(int64_t i, C *s) const {
        const C ninf = -std::numeric_limits<C>::infinity();
        const C scale = C(p.scale);
        int64_t len = S;
        if (p.mask_kind == DST_MASK_KEY_LENGTHS) len = static_cast<const int32_t *>(p.mask)[b];
        for (int64_t j = 0; j < S; ++j) {
            if (j >= len || (p.causal && j > i)) {
                s[j] = ninf;
                continue;
            }
            C acc = 0;
            for (int64_t t = 0; t < d; ++t) acc += q[i * d + t] * k[j * d + t];
            s[j] = scale * acc;
            if (p.mask_kind == DST_MASK_ADDITIVE) s[j] += C(cpu::load_any(p.mask_dtype, p.mask, b * S + j));
        }
    }
};

template <typename T>
dst_status attention_fwd_t(const AttentionParams &p, const void *qkv, void *ctx, void *lse, int nt) {
    using C = compute_t<T>;
    const int64_t pairs = p.batch * p.heads;
    const C ninf = -std::numeric_limits<C>::infinity();
    const C dscale = C(p.dropout.scale);
    const int64_t per = 3 * p.seq * p.head_dim + p.seq + p.head_dim;  // scratch per thread
    std::vector<C> work(static_cast<size_t>(per * nt));
    const Rows layout(p);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < pairs; ++bh) {
        C *w = work.data() + per * omp_get_thread_num();
        const Head<T> hd(p, qkv, layout, bh / p.heads, bh % p.heads, w);
        const int64_t S = hd.S, d = hd.d;
        C *s = w + 3 * S * d, *acc = s + S;
        cpu::DropoutStream drop(p.dropout);
        for (int64_t i = 0; i < hd.rows; ++i) {
            hd.scores(i, s);
            C mx = ninf;
            for (int64_t j = 0; j < S; ++j) mx = s[j] > mx ? s[j] : mx;
            C l = ninf;
            if (mx != ninf) {
                C sum = 0;
                for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - mx);
                l = mx + std::log(sum);
            }
            const int64_t row = hd.row_index(i);
            if (lse) static_cast<C *>(lse)[row] = l;
            std::fill(acc, acc + d, C(0));
            for (int64_t j = 0; j < S; ++j) {
                const C pj = l == ninf ? C(0) : std::exp(s[j] - l);
                const C pt = drop.keep(static_cast<uint64_t>(row * S + j)) ? pj * dscale : C(0);
                if (pt == C(0)) continue;
                for (int64_t t = 0; t < d; ++t) acc[t] += pt * hd.v[j * d + t];
            }
            for (int64_t t = 0; t < d; ++t) store<T>(ctx, hd.ctx_at(i, t), acc[t]);
        }
    }
    return DST_OK;
}

template <typename T>
dst_status attention_bwd_t(const AttentionParams &p, const void *qkv, const void *ctx, const void *dctx,
                           const void *lse, void *dqkv, int nt) {
    using C = compute_t<T>;
    const int64_t pairs = p.batch * p.heads;
    const C ninf = -std::numeric_limits<C>::infinity();
    const C dscale = C(p.dropout.scale), scale = C(p.scale);
    const int64_t per = 5 * p.seq * p.head_dim + p.seq + 2 * p.head_dim;  // scratch per thread
    std::vector<C> work(static_cast<size_t>(per * nt));
    const Rows layout(p);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < pairs; ++bh) {
        C *w = work.data() + per * omp_get_thread_num();
        const Head<T> hd(p, qkv, layout, bh / p.heads, bh % p.heads, w);
        const int64_t S = hd.S, d = hd.d;
        C *dk = w + 3 * S * d, *dv = dk + S * d, *P = dv + S * d, *go = P + S, *dq = go + d;
        std::fill(dk, dk + 2 * S * d, C(0));
        cpu::DropoutStream drop(p.dropout);
        for (int64_t i = 0; i < hd.rows; ++i) {
            const int64_t row = hd.row_index(i);
            const C l = static_cast<const C *>(lse)[row];
            hd.scores(i, P);
            for (int64_t j = 0; j < S; ++j) P[j] = l == ninf ? C(0) : std::exp(P[j] - l);
            C D = 0;
            for (int64_t t = 0; t < d; ++t) {
                go[t] = load<T>(dctx, hd.ctx_at(i, t));
                D += go[t] * load<T>(ctx, hd.ctx_at(i, t));
                dq[t] = 0;
            }
            for (int64_t j = 0; j < S; ++j) {
                const C f = drop.keep(static_cast<uint64_t>(row * S + j)) ? dscale : C(0);
                if (P[j] == C(0)) continue;
                const C pt = P[j] * f;
                C dpt = 0;  // dP̃_ij = dctx_i·v_j
                for (int64_t t = 0; t < d; ++t) {
                    dv[j * d + t] += pt * go[t];
                    dpt += go[t] * hd.v[j * d + t];
                }
                const C ds = P[j] * (dpt * f - D);
                for (int64_t t = 0; t < d; ++t) {
                    dq[t] += ds * hd.k[j * d + t];
                    dk[j * d + t] += ds * hd.q[i * d + t];
                }
            }
            for (int64_t t = 0; t < d; ++t) store<T>(dqkv, hd.col(i, 0, t), scale * dq[t]);
        }
        for (int64_t j = 0; j < hd.rows; ++j)
            for (int64_t t = 0; t < d; ++t) {
                store<T>(dqkv, hd.col(j, 1, t), scale * dk[j * d + t]);
                store<T>(dqkv, hd.col(j, 2, t), dv[j * d + t]);
            }
    }
    return DST_OK;
}

}  // namespace

dst_status CpuBackend::attention_fwd(dst_dtype dt, const AttentionParams &p, const void *qkv, void *ctx,
                                     void *lse) {
    const int nt = num_threads();
    return cpu::dispatch(dt, "attention_fwd", [&](auto tag) {
        return attention_fwd_t<decltype(tag)>(p, qkv, ctx, lse, nt);
    });
}

dst_status CpuBackend::attention_bwd(dst_dtype dt, const AttentionParams &p, const void *qkv,
                                     const void *ctx, const void *dctx, const void *lse, void *dqkv) {
    if (!lse) return set_error(DST_ERR_INVALID_ARGUMENT, "cpu backend: attention_bwd needs the forward's lse");
    const int nt = num_threads();
    return cpu::dispatch(dt, "attention_bwd", [&](auto tag) {
        return attention_bwd_t<decltype(tag)>(p, qkv, ctx, dctx, lse, dqkv, nt);
    });
}

}  // namespace dst
