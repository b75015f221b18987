/* A program that uses an installed libdstransformer: built by the install tests once with the
 * flags of `pkg-config --cflags --libs dstransformer`, once through find_package(dstransformer). */
#include <stdio.h>
#include <string.h>

#include <dstransformer/dstransformer.h>

int main(void)
{
    char expected[32];
    dst_context *ctx = NULL;
    dst_backend backend = DST_BACKEND_AUTO;
    dst_status st;

    sprintf(expected, "%d.%d.%d", DST_VERSION_MAJOR, DST_VERSION_MINOR, DST_VERSION_PATCH);
    if (strcmp(dst_version_string(), expected) != 0 || dst_version() != DST_VERSION_NUMBER) {
        fprintf(stderr, "consumer: header %s but library %s (%d)\n", expected, dst_version_string(),
                dst_version());
        return 1;
    }
    st = dst_context_create(DST_BACKEND_CPU, 0, &ctx);
    if (st != DST_OK) {
        fprintf(stderr, "consumer: dst_context_create: %s: %s\n", dst_status_string(st), dst_last_error());
        return 1;
    }
    st = dst_context_get_backend(ctx, &backend);
    if (st != DST_OK || backend != DST_BACKEND_CPU) {
        fprintf(stderr, "consumer: dst_context_get_backend: %s: %s\n", dst_status_string(st),
                dst_last_error());
        dst_context_destroy(ctx);
        return 1;
    }
    dst_context_destroy(ctx);
    dst_context_destroy(NULL); /* accepted, no effect */
    printf("consumer ok: libdstransformer %s, CPU context created and destroyed\n", dst_version_string());
    return 0;
}
