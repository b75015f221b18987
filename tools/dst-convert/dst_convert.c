/*
 * dst-convert: converts a layer checkpoint (safetensors) between the DeepSpeed Transformer Kernel
 * layout and the Hugging Face BertLayer layout, or describes a safetensors file.
 *
 *   dst-convert [--from deepspeed|hf] [--to deepspeed|hf] [--in-prefix P] [--out-prefix P] IN OUT
 *   dst-convert --info IN
 *   dst-convert --version | --help
 *
 * Conversion is dst_checkpoint_convert() of the public C API (defaults: --from hf --to deepspeed, the
 * prefixes detected / kept). --info prints dst_checkpoint_describe(): sizes, every tensor with its dtype
 * and shape, the layers it recognises and the metadata. Exit status: 0 success, 1 failure (the reason on
 * stderr), 2 usage error (the message names the argument).
 * C99; uses nothing of the library but its public header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstransformer/dstransformer.h"

static const char *prog = "dst-convert";

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s [--from deepspeed|hf] [--to deepspeed|hf] [--in-prefix P] [--out-prefix P] IN OUT\n"
            "       %s --info IN\n"
            "       %s --version | --help\n"
            "Converts a safetensors layer checkpoint between the DeepSpeed (attn_qkvw ... norm_b) and the\n"
            "Hugging Face BertLayer (attention.self.query.weight ...) names; tensors outside the layers are\n"
            "copied unchanged. Defaults: --from hf --to deepspeed; the input prefix is detected (\"\",\n"
            "\"bert.encoder.\", \"encoder.\") and kept unless --out-prefix is given.\n"
            "--info prints a file's sizes, every tensor with its dtype and shape, the layers found and the\n"
            "metadata. --version prints the versions of the program and of the library it loaded.\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n",
            prog, prog, prog);
}

static int parse_layout(const char *s, dst_weight_layout *out) {
    if (strcmp(s, "deepspeed") == 0 || strcmp(s, "ds") == 0) {
        *out = DST_LAYOUT_DEEPSPEED;
        return 1;
    }
    if (strcmp(s, "hf") == 0 || strcmp(s, "hf_bert") == 0) {
        *out = DST_LAYOUT_HF_BERT;
        return 1;
    }
    return 0;
}

/* --info: the library's description of the file (dst_checkpoint_describe), grown to fit. */
static int info(const char *path) {
    size_t cap = 1 << 14, len = 0;
    char *text = NULL;
    for (;;) {
        char *grown = (char *)realloc(text, cap);
        dst_status st;
        if (!grown) {
            free(text);
            fprintf(stderr, "%s: out of memory\n", prog);
            return 1;
        }
        text = grown;
        st = dst_checkpoint_describe(path, text, cap, &len);
        if (st != DST_OK) {
            fprintf(stderr, "%s: %s: %s\n", prog, dst_status_string(st), dst_last_error());
            free(text);
            return 1;
        }
        if (len < cap) break;
        cap = len + 1;
    }
    fputs(text, stdout);
    free(text);
    return 0;
}

/* A usage error: the message (naming the argument), then how to get the usage. */
static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help' for the usage.\n", prog);
    return 2;
}

/* ---- main -------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    dst_weight_layout from = DST_LAYOUT_HF_BERT, to = DST_LAYOUT_DEEPSPEED;
    const char *in_prefix = NULL, *out_prefix = NULL, *info_path = NULL;
    const char *paths[2];
    int npaths = 0, i;
    char summary[4096];
    dst_status st;

    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    for (i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const int has_value = i + 1 < argc;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("%s %d.%d.%d (libdstransformer %s)\n", prog, DST_VERSION_MAJOR, DST_VERSION_MINOR,
                   DST_VERSION_PATCH, dst_version_string());
            return 0;
        } else if (strcmp(a, "--from") == 0 || strcmp(a, "--to") == 0) {
            if (!has_value) return usage_error("%s needs a layout: 'deepspeed' or 'hf'", a);
            if (!parse_layout(argv[i + 1], strcmp(a, "--from") == 0 ? &from : &to)) {
                fprintf(stderr, "%s: %s: unknown layout '%s' (expected 'deepspeed' or 'hf')\n", prog, a, argv[i + 1]);
                fprintf(stderr, "Try '%s --help' for the usage.\n", prog);
                return 2;
            }
            ++i;
        } else if (strcmp(a, "--in-prefix") == 0 || strcmp(a, "--out-prefix") == 0) {
            if (!has_value) return usage_error("%s needs a value (\"\" for none)", a);
            if (strcmp(a, "--in-prefix") == 0)
                in_prefix = argv[++i];
            else
                out_prefix = argv[++i];
        } else if (strcmp(a, "--info") == 0) {
            if (!has_value) return usage_error("%s needs a file", a);
            if (info_path) return usage_error("--info given twice (second: '%s')", argv[i + 1]);
            info_path = argv[++i];
        } else if (a[0] == '-' && a[1] != '\0' && strcmp(a, "--") != 0) {
            return usage_error("unknown option '%s'", a);
        } else {
            if (strcmp(a, "--") == 0) {
                if (++i >= argc) break;
                a = argv[i];
            }
            if (npaths == 2) return usage_error("too many arguments: '%s' after IN and OUT", a);
            paths[npaths++] = a;
        }
    }
    if (info_path) {
        if (npaths != 0) return usage_error("--info takes one file; unexpected argument '%s'", paths[0]);
        return info(info_path);
    }
    if (npaths == 0) return usage_error("%s", "missing IN and OUT (or --info IN)");
    if (npaths == 1) return usage_error("missing OUT after IN '%s'", paths[0]);
    st = dst_checkpoint_convert(paths[0], from, in_prefix, paths[1], to, out_prefix, summary, sizeof summary);
    if (st != DST_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, dst_status_string(st), dst_last_error());
        return 1;
    }
    fputs(summary, stdout);
    return 0;
}
