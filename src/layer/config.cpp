#include "layer/config.h"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/versioned.h"

namespace dst {

// Sizes above these limits are refused: they keep every byte count well inside 64 bits and every
// per-row index inside 32 bits for the kernels.
static constexpr int64_t kMaxHidden = 1 << 16;
static constexpr int64_t kMaxIntermediate = 1 << 18;
static constexpr int64_t kMaxTokens = int64_t(1) << 26;
static constexpr int64_t kMaxSeq = 1 << 20;

// Every layout a caller's header may have given dst_layer_config: cut after any of its fields.
static constexpr size_t kConfigSizes[] = {
    DST_PREFIX_SIZE(dst_layer_config, hidden_size),
    DST_PREFIX_SIZE(dst_layer_config, heads),
    DST_PREFIX_SIZE(dst_layer_config, intermediate_size),
    DST_PREFIX_SIZE(dst_layer_config, attn_dropout_ratio),
    DST_PREFIX_SIZE(dst_layer_config, hidden_dropout_ratio),
    DST_PREFIX_SIZE(dst_layer_config, num_hidden_layers),
    DST_PREFIX_SIZE(dst_layer_config, initializer_range),
    DST_PREFIX_SIZE(dst_layer_config, layer_norm_eps),
    DST_PREFIX_SIZE(dst_layer_config, seed),
    DST_PREFIX_SIZE(dst_layer_config, pre_layer_norm),
    DST_PREFIX_SIZE(dst_layer_config, normalize_invertible),
    DST_PREFIX_SIZE(dst_layer_config, gelu_checkpoint),
    DST_PREFIX_SIZE(dst_layer_config, attn_dropout_checkpoint),
    DST_PREFIX_SIZE(dst_layer_config, adjust_init_range),
    DST_PREFIX_SIZE(dst_layer_config, stochastic_mode),
    DST_PREFIX_SIZE(dst_layer_config, training),
    DST_PREFIX_SIZE(dst_layer_config, dtype),
    DST_PREFIX_SIZE(dst_layer_config, max_batch_tokens),
    DST_PREFIX_SIZE(dst_layer_config, max_seq_len),
    DST_PREFIX_SIZE(dst_layer_config, gelu),
    DST_PREFIX_SIZE(dst_layer_config, causal),
    DST_PREFIX_SIZE(dst_layer_config, allow_tf32),
};
static_assert(kConfigSizes[sizeof kConfigSizes / sizeof kConfigSizes[0] - 1] == sizeof(dst_layer_config),
              "a field was appended to dst_layer_config: list it in kConfigSizes");
const StructVersions kConfigVersions = {"dst_layer_config", "dst_layer_config_default", sizeof(dst_layer_config),
                                        kConfigSizes, sizeof kConfigSizes / sizeof kConfigSizes[0]};

void config_defaults(dst_layer_config *c) {
    std::memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->hidden_size = 1024;
    c->heads = 16;
    c->intermediate_size = 0;
    c->attn_dropout_ratio = 0.1f;
    c->hidden_dropout_ratio = 0.1f;
    c->num_hidden_layers = 24;
    c->initializer_range = 0.02f;
    c->layer_norm_eps = 1e-12f;
    c->seed = 42;
    c->pre_layer_norm = 1;
    c->normalize_invertible = 0;
    c->gelu_checkpoint = 0;
    c->attn_dropout_checkpoint = 0;
    c->adjust_init_range = 1;
    c->stochastic_mode = 0;
    c->training = 1;
    c->dtype = DST_DTYPE_FP32;
    c->max_batch_tokens = 8192;
    c->max_seq_len = 512;
    c->gelu = DST_GELU_ERF;
    c->causal = 0;
}

static bool ratio_ok(float p) { return std::isfinite(p) && p >= 0.0f && p < 1.0f; }

dst_status config_load(const char *fn, const dst_layer_config *in, dst_backend backend,
                       dst_layer_config *out) {
    if (!in) return set_error(DST_ERR_INVALID_ARGUMENT, "%s: config is NULL", fn);
    // A caller built against an older header has fewer fields: the rest keep their defaults.
    dst_layer_config c;
    config_defaults(&c);
    DST_TRY(versioned_copy_in(fn, "config", kConfigVersions, in, &c));

#define DST_CFG_CHECK(cond, ...) \
    if (!(cond)) return set_error(DST_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    DST_CFG_CHECK(c.hidden_size >= 1 && c.hidden_size <= kMaxHidden,
                  "%s: config->hidden_size is %d, expected 1..%lld", fn, c.hidden_size, (long long)kMaxHidden);
    DST_CFG_CHECK(c.heads >= 1 && c.heads <= c.hidden_size,
                  "%s: config->heads is %d, expected 1..hidden_size (%d)", fn, c.heads, c.hidden_size);
    DST_CFG_CHECK(c.hidden_size % c.heads == 0,
                  "%s: config->heads (%d) must divide config->hidden_size (%d)", fn, c.heads, c.hidden_size);
    DST_CFG_CHECK(c.intermediate_size >= 0 && c.intermediate_size <= kMaxIntermediate,
                  "%s: config->intermediate_size is %d, expected 0 (meaning 4*hidden_size) or 1..%lld", fn,
                  c.intermediate_size, (long long)kMaxIntermediate);
    DST_CFG_CHECK(c.intermediate_size != 0 || 4LL * c.hidden_size <= kMaxIntermediate,
                  "%s: config->intermediate_size 0 means 4*hidden_size = %lld, above the limit %lld", fn,
                  4LL * c.hidden_size, (long long)kMaxIntermediate);
    DST_CFG_CHECK(ratio_ok(c.attn_dropout_ratio),
                  "%s: config->attn_dropout_ratio is %g, expected a value in [0, 1)", fn, (double)c.attn_dropout_ratio);
    DST_CFG_CHECK(ratio_ok(c.hidden_dropout_ratio),
                  "%s: config->hidden_dropout_ratio is %g, expected a value in [0, 1)", fn,
                  (double)c.hidden_dropout_ratio);
    DST_CFG_CHECK(c.num_hidden_layers >= 1,
                  "%s: config->num_hidden_layers is %d, expected >= 1", fn, c.num_hidden_layers);
    DST_CFG_CHECK(std::isfinite(c.initializer_range) && c.initializer_range >= 0.0f,
                  "%s: config->initializer_range is %g, expected a finite value >= 0", fn,
                  (double)c.initializer_range);
    DST_CFG_CHECK(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps > 0.0f,
                  "%s: config->layer_norm_eps is %g, expected a finite value > 0", fn, (double)c.layer_norm_eps);
    DST_CFG_CHECK(is_storage_dtype(c.dtype),
                  "%s: config->dtype is %d, expected DST_DTYPE_FP32, FP16, BF16 or FP64", fn, (int)c.dtype);
    DST_CFG_CHECK(c.max_batch_tokens >= 1 && c.max_batch_tokens <= kMaxTokens,
                  "%s: config->max_batch_tokens is %lld, expected 1..%lld", fn, (long long)c.max_batch_tokens,
                  (long long)kMaxTokens);
    DST_CFG_CHECK(c.max_seq_len >= 1 && c.max_seq_len <= kMaxSeq,
                  "%s: config->max_seq_len is %d, expected 1..%lld", fn, c.max_seq_len, (long long)kMaxSeq);
    DST_CFG_CHECK(c.gelu == DST_GELU_ERF || c.gelu == DST_GELU_TANH,
                  "%s: config->gelu is %d, expected DST_GELU_ERF or DST_GELU_TANH", fn, (int)c.gelu);
#undef DST_CFG_CHECK
    if (c.intermediate_size == 0) c.intermediate_size = 4 * c.hidden_size;

    if (backend != DST_BACKEND_AUTO && backend != DST_BACKEND_CPU && backend != DST_BACKEND_CUDA)
        return set_error(DST_ERR_INVALID_ARGUMENT, "%s: backend is %d, expected a dst_backend value", fn,
                         (int)backend);
    if (backend == DST_BACKEND_CUDA) {
        // What the CUDA attention kernels run (kernels/attention_flash.cuh, kernels/attention.cuh):
        // any head size (heads wider than 128 take the generic kernels), and one launch of at most
        // 2^31 − 1 blocks (tiles of ≥ 32 queries per batch and head, bounded here by tokens × heads).
        if (c.max_batch_tokens * static_cast<int64_t>(c.heads) > 0x7fffffffLL)
            return set_error(DST_ERR_UNSUPPORTED,
                             "%s: the CUDA backend needs max_batch_tokens × heads ≤ 2^31 − 1 (%lld × %d)", fn,
                             (long long)c.max_batch_tokens, c.heads);
    }
    // Normalise booleans so that comparisons and copies are canonical.
    c.pre_layer_norm = c.pre_layer_norm != 0;
    c.normalize_invertible = c.normalize_invertible != 0;
    c.gelu_checkpoint = c.gelu_checkpoint != 0;
    c.attn_dropout_checkpoint = c.attn_dropout_checkpoint != 0;
    c.adjust_init_range = c.adjust_init_range != 0;
    c.stochastic_mode = c.stochastic_mode != 0;
    c.training = c.training != 0;
    c.causal = c.causal != 0;
    c.allow_tf32 = c.allow_tf32 != 0;
    if (out) *out = c;
    return DST_OK;
}

Dims config_dims(const dst_layer_config &cfg) {
    Dims d;
    d.H = cfg.hidden_size;
    d.heads = cfg.heads;
    d.d = cfg.hidden_size / cfg.heads;
    d.I = cfg.intermediate_size != 0 ? cfg.intermediate_size : 4LL * cfg.hidden_size;
    return d;
}

}  // namespace dst
