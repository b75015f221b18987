/* The public header as strict C99 (-std=c99 -pedantic -Wall -Wextra -Werror): it must be
 * self-contained, and a few calls through it must link and work. */
#include <dstransformer/dstransformer.h>
#include <dstransformer/dstransformer.h> /* include guard */

#include <stdio.h>
#include <string.h>

static int check(int ok, const char *what) {
    if (!ok) fprintf(stderr, "header_c99: FAILED %s (%s)\n", what, dst_last_error());
    return ok ? 0 : 1;
}

int main(void) {
    int failures = 0;
    dst_context *ctx = NULL;
    dst_layer *layer = NULL;
    dst_layer_config cfg;
    dst_tensor t;
    dst_mask mask;
    dst_param param = DST_PARAM_COUNT;
    size_t bytes = 0;
    int id = -1;

    failures += check(dst_version() == DST_VERSION_NUMBER, "dst_version() == DST_VERSION_NUMBER");
    failures += check(strcmp(dst_status_string(DST_ERR_CAPACITY), "DST_ERR_CAPACITY") == 0, "status string");
    failures += check(dst_dtype_size(DST_DTYPE_BF16) == 2, "dtype size");
    failures += check(sizeof t.shape / sizeof t.shape[0] == DST_MAX_DIMS, "DST_MAX_DIMS");
    memset(&mask, 0, sizeof mask);
    mask.kind = DST_MASK_NONE;

    failures += check(dst_context_create(DST_BACKEND_CPU, 0, &ctx) == DST_OK, "dst_context_create");
    failures += check(dst_layer_config_default(&cfg) == DST_OK, "dst_layer_config_default");
    cfg.hidden_size = 32;
    cfg.heads = 4;
    cfg.max_batch_tokens = 64;
    cfg.max_seq_len = 16;
    failures += check(dst_layer_config_validate(&cfg, DST_BACKEND_CPU) == DST_OK, "validate");
    failures += check(dst_layer_create(ctx, &cfg, &layer) == DST_OK, "dst_layer_create");
    failures += check(dst_layer_get_id(layer, &id) == DST_OK && id == 0, "layer id 0");
    failures += check(dst_layer_arena_bytes(layer, &bytes) == DST_OK && bytes > 0, "arena bytes");
    failures += check(dst_param_lookup("encoder.attn_ow", &param) == DST_OK && param == DST_PARAM_ATTN_OW, "lookup");
    failures += check(dst_layer_create(ctx, NULL, &layer) == DST_ERR_INVALID_ARGUMENT, "NULL config refused");
    failures += check(dst_last_error()[0] != '\0', "message after failure");
    dst_layer_destroy(layer);
    dst_context_destroy(ctx);
    dst_layer_destroy(NULL);
    dst_context_destroy(NULL);
    dst_saved_destroy(NULL);
    if (failures == 0) printf("header_c99: OK (libdstransformer %s)\n", dst_version_string());
    return failures == 0 ? 0 : 1;
}
