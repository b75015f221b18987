/*
 * dst-convert: converts a layer checkpoint (safetensors) between the DeepSpeed Transformer Kernel
 * layout and the Hugging Face BertLayer layout, or describes a safetensors file.
 *
 *   dst-convert [--from deepspeed|hf] [--to deepspeed|hf] [--in-prefix P] [--out-prefix P] IN OUT
 *   dst-convert --info IN
 *
 * Conversion is dst_checkpoint_convert() of the public C API (defaults: --from hf --to deepspeed, the
 * prefixes detected / kept). --info prints dst_checkpoint_describe(): the tensors' dtypes, the layers it
 * recognises and the metadata. Exit status: 0 success, 1 failure (the reason on stderr), 2 usage.
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
            "Converts a safetensors layer checkpoint between the DeepSpeed (attn_qkvw ... norm_b) and the\n"
            "Hugging Face BertLayer (attention.self.query.weight ...) names; tensors outside the layers are\n"
            "copied unchanged. Defaults: --from hf --to deepspeed; the input prefix is detected (\"\",\n"
            "\"bert.encoder.\", \"encoder.\") and kept unless --out-prefix is given.\n"
            "--info prints the tensors, the layers found and the metadata of a file.\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n",
            prog, prog);
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

/* ---- main -------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    dst_weight_layout from = DST_LAYOUT_HF_BERT, to = DST_LAYOUT_DEEPSPEED;
    const char *in_prefix = NULL, *out_prefix = NULL, *info_path = NULL;
    const char *paths[2];
    int npaths = 0, i;
    char summary[4096];
    dst_status st;

    for (i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const int has_value = i + 1 < argc;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--from") == 0 || strcmp(a, "--to") == 0) {
            if (!has_value || !parse_layout(argv[i + 1], strcmp(a, "--from") == 0 ? &from : &to)) {
                fprintf(stderr, "%s: %s needs 'deepspeed' or 'hf'\n", prog, a);
                usage(stderr);
                return 2;
            }
            ++i;
        } else if (strcmp(a, "--in-prefix") == 0 || strcmp(a, "--out-prefix") == 0) {
            if (!has_value) {
                fprintf(stderr, "%s: %s needs a value (\"\" for none)\n", prog, a);
                usage(stderr);
                return 2;
            }
            if (strcmp(a, "--in-prefix") == 0)
                in_prefix = argv[++i];
            else
                out_prefix = argv[++i];
        } else if (strcmp(a, "--info") == 0) {
            if (!has_value) {
                fprintf(stderr, "%s: --info needs a file\n", prog);
                usage(stderr);
                return 2;
            }
            info_path = argv[++i];
        } else if (a[0] == '-' && a[1] != '\0' && strcmp(a, "--") != 0) {
            fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
            usage(stderr);
            return 2;
        } else {
            if (strcmp(a, "--") == 0) {
                if (++i >= argc) break;
                a = argv[i];
            }
            if (npaths == 2) {
                fprintf(stderr, "%s: too many arguments ('%s')\n", prog, a);
                usage(stderr);
                return 2;
            }
            paths[npaths++] = a;
        }
    }
    if (info_path) {
        if (npaths != 0) {
            fprintf(stderr, "%s: --info takes one file and no other arguments\n", prog);
            usage(stderr);
            return 2;
        }
        return info(info_path);
    }
    if (npaths != 2) {
        fprintf(stderr, "%s: expected IN and OUT\n", prog);
        usage(stderr);
        return 2;
    }
    st = dst_checkpoint_convert(paths[0], from, in_prefix, paths[1], to, out_prefix, summary, sizeof summary);
    if (st != DST_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, dst_status_string(st), dst_last_error());
        return 1;
    }
    fputs(summary, stdout);
    return 0;
}
