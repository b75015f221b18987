// Cases of the model ops (dstransformer.h, group modelops) shared by the CPU suite (tests/cpu/
// test_model_ops.cpp: formulas, finite differences, bad input) and the CUDA suite (tests/cuda/
// test_cuda_model_ops.cpp: CUDA against the CPU twin). A case holds named host tensors (inputs with
// fixed-seed random content, outputs poisoned with NaN) and the call; run_case() runs it on a context,
// through device copies when the context is a CUDA one, and returns every tensor afterwards.
// Public API only.
#ifndef DST_TESTS_COMMON_MODEL_OPS_CASES_H
#define DST_TESTS_COMMON_MODEL_OPS_CASES_H

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../cpu/test_util.h"

namespace dsttest {

inline HostTensor clone(const HostTensor &t) {
    HostTensor c(t.dtype(), t.shape());
    if (t.nbytes()) std::memcpy(c.data(), t.data(), t.nbytes());
    return c;
}

struct OpSlot {
    std::string name;
    HostTensor t;
    bool out = false;      // compared after the call (poisoned first unless `keep` is set)
    bool keep = false;     // an output with meaningful initial content (accumulate)
    bool present = true;   // false: passed as NULL
};

struct ModelOpCase {
    std::string name;
    dst_dtype dt = DST_DTYPE_FP32;
    std::vector<OpSlot> slots;
    // Views of the slots (NULL entries for absent ones), in slot order.
    std::function<dst_status(dst_context *, std::vector<dst_tensor *> &)> call;
    double tol_scale = 1.0;
    int slot(const std::string &n) const {
        for (size_t i = 0; i < slots.size(); ++i)
            if (slots[i].name == n) return static_cast<int>(i);
        return -1;
    }
};

// Runs `c` on `ctx`; on_device: every tensor is copied to the context's memory and back.
inline dst_status run_case(dst_context *ctx, const ModelOpCase &c, bool on_device, std::vector<HostTensor> *result,
                           std::string *err) {
    std::vector<HostTensor> host;
    for (const OpSlot &s : c.slots) {
        host.push_back(clone(s.t));
        if (s.out && !s.keep) host.back().poison();
    }
    std::vector<dst_tensor> views(host.size());
    std::vector<void *> dev(host.size(), nullptr);
    for (size_t i = 0; i < host.size(); ++i) {
        views[i] = host[i].view();
        if (on_device && c.slots[i].present) {
            if (dst_malloc(ctx, host[i].nbytes(), &dev[i]) != DST_OK ||
                dst_memcpy(ctx, dev[i], host[i].data(), host[i].nbytes(), DST_COPY_HOST_TO_CONTEXT) != DST_OK) {
                *err = dst_last_error();
                return DST_ERR_BACKEND;
            }
            views[i].data = dev[i];
        }
    }
    std::vector<dst_tensor *> ptrs(host.size());
    for (size_t i = 0; i < host.size(); ++i) ptrs[i] = c.slots[i].present ? &views[i] : nullptr;
    const dst_status st = c.call(ctx, ptrs);
    if (st != DST_OK) *err = dst_last_error();
    for (size_t i = 0; i < host.size(); ++i)
        if (dev[i]) {
            if (st == DST_OK) dst_memcpy(ctx, host[i].data(), dev[i], host[i].nbytes(), DST_COPY_CONTEXT_TO_HOST);
            dst_free(ctx, dev[i]);
        }
    *result = std::move(host);
    return st;
}

// ---- random content ------------------------------------------------------------------------------
inline HostTensor rand_float(Rng &r, dst_dtype dt, std::vector<int64_t> shape, double std = 1.0) {
    HostTensor t(dt, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std * r.normal());
    return t;
}
inline HostTensor rand_ints(Rng &r, std::vector<int64_t> shape, int64_t lo, int64_t hi) {
    HostTensor t(DST_DTYPE_INT32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(lo + r.below(hi - lo)));
    return t;
}
// `m` distinct values of [0, n) in random order.
inline HostTensor distinct_ints(Rng &r, int64_t m, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(r.below(i + 1))]);
    HostTensor t(DST_DTYPE_INT32, {m});
    for (int64_t i = 0; i < m; ++i) t.set(i, static_cast<double>(v[static_cast<size_t>(i)]));
    return t;
}
inline OpSlot in(const std::string &n, HostTensor t) { return OpSlot{n, std::move(t), false, false, true}; }
inline OpSlot out(const std::string &n, HostTensor t) { return OpSlot{n, std::move(t), true, false, true}; }
inline OpSlot inout(const std::string &n, HostTensor t) { return OpSlot{n, std::move(t), true, true, true}; }
inline OpSlot absent(const std::string &n, dst_dtype dt) { return OpSlot{n, HostTensor(dt, {1}), false, false, false}; }

inline dst_dtype stat_of(dst_dtype dt) { return dt == DST_DTYPE_FP64 ? DST_DTYPE_FP64 : DST_DTYPE_FP32; }

// ---- the op cases ----------------------------------------------------------------------------------
// Slots: ids, types, word, position, type, out.
inline ModelOpCase embedding_fwd_case(dst_dtype dt, int64_t B, int64_t S, int64_t H, int64_t V, int64_t P, int64_t T,
                                      bool with_types, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "embedding_fwd";
    c.dt = dt;
    c.slots.push_back(in("ids", rand_ints(r, {B, S}, 0, V)));
    c.slots.push_back(with_types ? in("types", rand_ints(r, {B, S}, 0, T)) : absent("types", DST_DTYPE_INT32));
    c.slots.push_back(in("word", rand_float(r, dt, {V, H})));
    c.slots.push_back(in("position", rand_float(r, dt, {P, H})));
    c.slots.push_back(in("type", rand_float(r, dt, {T, H})));
    c.slots.push_back(out("out", HostTensor(dt, {B, S, H})));
    c.call = [](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_embedding_forward(ctx, v[0], v[1], v[2], v[3], v[4], v[5]);
    };
    return c;
}

// Slots: dout, ids, types, dword, dposition, dtype. Ids drawn from a few rows so that rows repeat.
inline ModelOpCase embedding_bwd_case(dst_dtype dt, int64_t B, int64_t S, int64_t H, int64_t V, int64_t P, int64_t T,
                                      bool with_types, bool accumulate, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "embedding_bwd";
    c.dt = dt;
    c.slots.push_back(in("dout", rand_float(r, dt, {B, S, H})));
    HostTensor ids = rand_ints(r, {B, S}, 0, V);
    for (int64_t i = 0; i < ids.numel(); i += 3) ids.set(i, static_cast<double>(r.below(std::min<int64_t>(V, 4))));
    c.slots.push_back(in("ids", std::move(ids)));
    c.slots.push_back(with_types ? in("types", rand_ints(r, {B, S}, 0, T)) : absent("types", DST_DTYPE_INT32));
    if (accumulate) {
        c.slots.push_back(inout("dword", rand_float(r, dt, {V, H})));
        c.slots.push_back(inout("dposition", rand_float(r, dt, {P, H})));
        c.slots.push_back(inout("dtype", rand_float(r, dt, {T, H})));
    } else {
        c.slots.push_back(out("dword", HostTensor(dt, {V, H})));
        c.slots.push_back(out("dposition", HostTensor(dt, {P, H})));
        c.slots.push_back(out("dtype", HostTensor(dt, {T, H})));
    }
    const dst_grad_mode mode = accumulate ? DST_GRAD_ACCUMULATE : DST_GRAD_WRITE;
    c.call = [mode](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_embedding_backward(ctx, v[0], v[1], v[2], v[3], v[4], v[5], mode);
    };
    return c;
}

// Slots: x, w, b, y, pre_act.
inline ModelOpCase dense_fwd_case(dst_dtype dt, int64_t N, int64_t K, int64_t M, dst_activation act, bool bias,
                                  uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "dense_fwd";
    c.dt = dt;
    c.slots.push_back(in("x", rand_float(r, dt, {N, K})));
    c.slots.push_back(in("w", rand_float(r, dt, {M, K}, 1.0 / std::sqrt(static_cast<double>(K)))));
    c.slots.push_back(bias ? in("b", rand_float(r, dt, {M}, 0.3)) : absent("b", dt));
    c.slots.push_back(out("y", HostTensor(dt, {N, M})));
    c.slots.push_back(out("pre_act", HostTensor(dt, {N, M})));
    c.call = [act](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_dense_forward(ctx, v[0], v[1], v[2], act, v[3], v[4]);
    };
    return c;
}

// Slots: dy, x, w, pre_act, dx, dw, db.
inline ModelOpCase dense_bwd_case(dst_dtype dt, int64_t N, int64_t K, int64_t M, dst_activation act, bool accumulate,
                                  uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "dense_bwd";
    c.dt = dt;
    c.slots.push_back(in("dy", rand_float(r, dt, {N, M})));
    c.slots.push_back(in("x", rand_float(r, dt, {N, K})));
    c.slots.push_back(in("w", rand_float(r, dt, {M, K}, 1.0 / std::sqrt(static_cast<double>(K)))));
    c.slots.push_back(act == DST_ACTIVATION_NONE ? absent("pre_act", dt) : in("pre_act", rand_float(r, dt, {N, M})));
    c.slots.push_back(out("dx", HostTensor(dt, {N, K})));
    c.slots.push_back(accumulate ? inout("dw", rand_float(r, dt, {M, K})) : out("dw", HostTensor(dt, {M, K})));
    c.slots.push_back(accumulate ? inout("db", rand_float(r, dt, {M})) : out("db", HostTensor(dt, {M})));
    const dst_grad_mode mode = accumulate ? DST_GRAD_ACCUMULATE : DST_GRAD_WRITE;
    c.call = [act, mode](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_dense_backward(ctx, v[0], v[1], v[2], v[3], act, v[4], v[5], v[6], mode);
    };
    return c;
}

// Slots: src, index, dst (gather); src, index, dst (scatter).
inline ModelOpCase gather_case(dst_dtype dt, int64_t N, int64_t M, int64_t H, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "gather_rows";
    c.dt = dt;
    c.slots.push_back(in("src", rand_float(r, dt, {N, H})));
    c.slots.push_back(in("index", rand_ints(r, {M}, 0, N)));
    c.slots.push_back(out("dst", HostTensor(dt, {M, H})));
    c.call = [](dst_context *ctx, std::vector<dst_tensor *> &v) { return dst_gather_rows(ctx, v[0], v[1], v[2]); };
    return c;
}
inline ModelOpCase scatter_case(dst_dtype dt, int64_t N, int64_t M, int64_t H, bool accumulate, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "scatter_rows";
    c.dt = dt;
    c.slots.push_back(in("src", rand_float(r, dt, {M, H})));
    c.slots.push_back(in("index", distinct_ints(r, M, N)));
    c.slots.push_back(accumulate ? inout("dst", rand_float(r, dt, {N, H})) : out("dst", HostTensor(dt, {N, H})));
    const dst_grad_mode mode = accumulate ? DST_GRAD_ACCUMULATE : DST_GRAD_WRITE;
    c.call = [mode](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_scatter_rows(ctx, v[0], v[1], v[2], mode);
    };
    return c;
}

// Slots: x, rows, w, b, labels, loss, counts, dx, dw, db. About a fifth of the labels are −1.
// Logits are O(3) so that the softmax is neither flat nor one-hot.
inline ModelOpCase cross_entropy_case(dst_dtype dt, int64_t N, int64_t M, int64_t H, int64_t V, bool with_rows,
                                      bool bias, bool grads, bool accumulate, double grad_scale, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "linear_cross_entropy";
    c.dt = dt;
    const int64_t X = with_rows ? N : M;
    c.slots.push_back(in("x", rand_float(r, dt, {X, H})));
    c.slots.push_back(with_rows ? in("rows", distinct_ints(r, M, N)) : absent("rows", DST_DTYPE_INT32));
    c.slots.push_back(in("w", rand_float(r, dt, {V, H}, 3.0 / std::sqrt(static_cast<double>(H)))));
    c.slots.push_back(bias ? in("b", rand_float(r, dt, {V}, 0.5)) : absent("b", dt));
    HostTensor labels = rand_ints(r, {M}, 0, V);
    for (int64_t i = 0; i < M; ++i)
        if (r.below(5) == 0) labels.set(i, -1);
    c.slots.push_back(in("labels", std::move(labels)));
    c.slots.push_back(out("loss", HostTensor(stat_of(dt), {1})));
    c.slots.push_back(out("counts", HostTensor(DST_DTYPE_INT32, {2})));
    if (grads) {
        c.slots.push_back(out("dx", HostTensor(dt, {X, H})));
        c.slots.push_back(accumulate ? inout("dw", rand_float(r, dt, {V, H})) : out("dw", HostTensor(dt, {V, H})));
        if (bias) c.slots.push_back(accumulate ? inout("db", rand_float(r, dt, {V})) : out("db", HostTensor(dt, {V})));
        else c.slots.push_back(absent("db", dt));
    } else {
        c.slots.push_back(absent("dx", dt));
        c.slots.push_back(absent("dw", dt));
        c.slots.push_back(absent("db", dt));
    }
    const dst_grad_mode mode = accumulate ? DST_GRAD_ACCUMULATE : DST_GRAD_WRITE;
    const float gs = static_cast<float>(grad_scale);
    c.call = [gs, mode](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_linear_cross_entropy(ctx, v[0], v[1], v[2], v[3], v[4], gs, v[5], v[6], v[7], v[8], v[9], mode);
    };
    return c;
}

// Slots: x, y. The context's RNG state is set to (seed 1234, offset 77) first, so that every backend
// draws the same mask.
inline ModelOpCase dropout_fwd_case(dst_dtype dt, std::vector<int64_t> shape, float p, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "dropout_fwd";
    c.dt = dt;
    c.slots.push_back(in("x", rand_float(r, dt, shape)));
    c.slots.push_back(out("y", HostTensor(dt, shape)));
    c.call = [p](dst_context *ctx, std::vector<dst_tensor *> &v) {
        const dst_status st = dst_context_set_rng_state(ctx, 1234, 77);
        if (st != DST_OK) return st;
        return dst_dropout_forward(ctx, v[0], p, v[1], nullptr, nullptr);
    };
    return c;
}

// Slots: dy, dx; the mask of (seed 1234, offset 77).
inline ModelOpCase dropout_bwd_case(dst_dtype dt, std::vector<int64_t> shape, float p, uint64_t seed) {
    Rng r(seed);
    ModelOpCase c;
    c.name = "dropout_bwd";
    c.dt = dt;
    c.slots.push_back(in("dy", rand_float(r, dt, shape)));
    c.slots.push_back(out("dx", HostTensor(dt, shape)));
    c.call = [p](dst_context *ctx, std::vector<dst_tensor *> &v) {
        return dst_dropout_backward(ctx, v[0], p, 1234, 77, v[1]);
    };
    return c;
}

}  // namespace dsttest

#endif  // DST_TESTS_COMMON_MODEL_OPS_CASES_H
