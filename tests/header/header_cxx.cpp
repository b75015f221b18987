// The public header from C++ (built as C++11 and as C++17 with -pedantic -Wall -Wextra -Werror):
// extern "C" linkage, no C-only constructs, usable with RAII.
#include <dstransformer/dstransformer.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

#if defined(DST_EXPECT_CXX_STD)
#if DST_EXPECT_CXX_STD == 11
static_assert(__cplusplus >= 201103L && __cplusplus < 201402L, "built as C++11");
#elif DST_EXPECT_CXX_STD == 17
static_assert(__cplusplus >= 201703L, "built as C++17");
#endif
#endif

static_assert(std::is_standard_layout<dst_layer_config>::value, "config is a C struct");
static_assert(std::is_standard_layout<dst_tensor>::value, "tensor is a C struct");
static_assert(DST_OK == 0, "DST_OK is 0");

namespace {
struct CtxDel { void operator()(dst_context *c) const { dst_context_destroy(c); } };
struct LayerDel { void operator()(dst_layer *l) const { dst_layer_destroy(l); } };
int failures = 0;
void check(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "header_cxx: FAILED %s (%s)\n", what, dst_last_error());
        ++failures;
    }
}
}  // namespace

int main() {
    check(dst_version() == DST_VERSION_NUMBER, "version");
    dst_context *raw = nullptr;
    check(dst_context_create(DST_BACKEND_CPU, 0, &raw) == DST_OK, "context");
    std::unique_ptr<dst_context, CtxDel> ctx(raw);
    dst_layer_config cfg;
    check(dst_layer_config_default(&cfg) == DST_OK, "default");
    check(cfg.struct_size == sizeof(dst_layer_config), "struct_size");
    cfg.hidden_size = 16;
    cfg.heads = 2;
    cfg.dtype = DST_DTYPE_FP64;
    cfg.max_batch_tokens = 32;
    cfg.max_seq_len = 8;
    dst_layer *lraw = nullptr;
    check(dst_layer_create(ctx.get(), &cfg, &lraw) == DST_OK, "layer");
    std::unique_ptr<dst_layer, LayerDel> layer(lraw);
    dst_param_info info;
    check(dst_layer_param_info(layer.get(), DST_PARAM_INTER_W, &info) == DST_OK, "param_info");
    check(info.shape[0] == 64 && info.shape[1] == 16, "inter_w shape [4H, H]");
    double gamma[16];
    check(dst_layer_get_param(layer.get(), "norm_w", gamma, DST_DTYPE_FP64, 16) == DST_OK, "get_param");
    check(gamma[0] == 1.0 && gamma[15] == 1.0, "gamma init 1");
    check(dst_context_create(static_cast<dst_backend>(42), 0, &raw) == DST_ERR_INVALID_ARGUMENT, "bad backend");
    check(std::strlen(dst_last_error()) > 0, "message");
    if (failures == 0) std::printf("header_cxx (C++%ld): OK\n", static_cast<long>(__cplusplus));
    return failures == 0 ? 0 : 1;
}
