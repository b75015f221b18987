/*
 * dst-convert: converts a layer checkpoint (safetensors) between the DeepSpeed Transformer Kernel
 * layout and the Hugging Face BertLayer layout, or describes a safetensors file.
 *
 *   dst-convert [--from deepspeed|hf] [--to deepspeed|hf] [--in-prefix P] [--out-prefix P] IN OUT
 *   dst-convert --info IN
 *
 * Conversion is dst_checkpoint_convert() of the public C API (defaults: --from hf --to deepspeed, the
 * prefixes detected / kept). --info reads only the JSON header and prints the tensors' dtypes, the layers
 * it recognises and the metadata. Exit status: 0 success, 1 failure (the reason on stderr), 2 usage.
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

/* ---- --info: a small reader of the safetensors JSON header ------------------------------------- */

typedef struct {
    char *name;
    char *dtype;
    unsigned long long begin, end;
    int ndim;
} tensor_t;

typedef struct {
    char *key;
    char *value;
} meta_t;

typedef struct {
    const char *p, *end;
    const char *error;
} parser_t;

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    return q;
}

static void skip_ws(parser_t *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int expect(parser_t *ps, char c) {
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    if (!ps->error) ps->error = "unexpected character";
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(char *out, size_t *n, unsigned long cp) {
    if (cp < 0x80) {
        out[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | (cp >> 6));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | (cp >> 12));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | (cp >> 18));
        out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A JSON string, decoded into a malloc'ed NUL-terminated buffer (NULL on error). */
static char *parse_string(parser_t *ps) {
    char *out;
    size_t n = 0;
    if (!expect(ps, '"')) return NULL;
    /* The decoded text is never longer than the escaped one (4 UTF-8 bytes for a 6- or 12-byte escape). */
    out = (char *)xrealloc(NULL, (size_t)(ps->end - ps->p) + 1);
    while (ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if ((unsigned char)c < 0x20) break;
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        if (ps->p >= ps->end) break;
        c = *ps->p++;
        switch (c) {
        case '"': case '\\': case '/': out[n++] = c; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned long cp = 0;
            int i;
            if (ps->end - ps->p < 4) goto bad;
            for (i = 0; i < 4; ++i) {
                const int h = hexval(*ps->p++);
                if (h < 0) goto bad;
                cp = cp * 16 + (unsigned long)h;
            }
            if (cp >= 0xD800 && cp < 0xDC00 && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                unsigned long lo = 0;
                int ok = 1;
                for (i = 0; i < 4; ++i) {
                    const int h = hexval(ps->p[2 + i]);
                    if (h < 0) ok = 0;
                    lo = lo * 16 + (unsigned long)(h < 0 ? 0 : h);
                }
                if (ok && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    ps->p += 6;
                }
            }
            put_utf8(out, &n, cp);
            break;
        }
        default: goto bad;
        }
    }
    if (ps->p < ps->end && *ps->p == '"') {
        ps->p++;
        out[n] = '\0';
        return out;
    }
bad:
    free(out);
    if (!ps->error) ps->error = "malformed string";
    return NULL;
}

/* A non-negative integer; returns 0 on error. */
static int parse_count(parser_t *ps, unsigned long long *v) {
    const char *start;
    skip_ws(ps);
    start = ps->p;
    *v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        const unsigned d = (unsigned)(*ps->p - '0');
        if (*v > (~0ULL - d) / 10) {
            ps->error = "integer too large";
            return 0;
        }
        *v = *v * 10 + d;
        ps->p++;
    }
    if (ps->p == start) {
        if (!ps->error) ps->error = "expected a non-negative integer";
        return 0;
    }
    return 1;
}

static int skip_value(parser_t *ps, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end || depth > 32) {
        if (!ps->error) ps->error = "unexpected end or nesting too deep";
        return 0;
    }
    if (*ps->p == '"') {
        char *s = parse_string(ps);
        free(s);
        return s != NULL;
    }
    if (*ps->p == '{' || *ps->p == '[') {
        const char close = *ps->p == '{' ? '}' : ']';
        const int obj = close == '}';
        ps->p++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 1;
        }
        for (;;) {
            if (obj) {
                char *k = parse_string(ps);
                if (!k) return 0;
                free(k);
                if (!expect(ps, ':')) return 0;
            }
            if (!skip_value(ps, depth + 1)) return 0;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            return expect(ps, close);
        }
    }
    /* number, true, false, null */
    {
        const char *start = ps->p;
        while (ps->p < ps->end && strchr("+-.0123456789eEtrufalsn", *ps->p)) ps->p++;
        if (ps->p == start) {
            ps->error = "unexpected character";
            return 0;
        }
    }
    return 1;
}

/* Parses one tensor entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static int parse_entry(parser_t *ps, tensor_t *t) {
    if (!expect(ps, '{')) return 0;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 1;
    }
    for (;;) {
        char *k = parse_string(ps);
        if (!k || !expect(ps, ':')) {
            free(k);
            return 0;
        }
        if (strcmp(k, "dtype") == 0) {
            free(t->dtype);
            t->dtype = parse_string(ps);
            if (!t->dtype) {
                free(k);
                return 0;
            }
        } else if (strcmp(k, "shape") == 0 || strcmp(k, "data_offsets") == 0) {
            const int is_shape = k[0] == 's';
            int count = 0;
            if (!expect(ps, '[')) {
                free(k);
                return 0;
            }
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
            } else {
                for (;;) {
                    unsigned long long v;
                    if (!parse_count(ps, &v)) {
                        free(k);
                        return 0;
                    }
                    if (!is_shape && count == 0) t->begin = v;
                    if (!is_shape && count == 1) t->end = v;
                    count++;
                    skip_ws(ps);
                    if (ps->p < ps->end && *ps->p == ',') {
                        ps->p++;
                        continue;
                    }
                    if (!expect(ps, ']')) {
                        free(k);
                        return 0;
                    }
                    break;
                }
            }
            if (is_shape) t->ndim = count;
        } else if (!skip_value(ps, 1)) {
            free(k);
            return 0;
        }
        free(k);
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        return expect(ps, '}');
    }
}

static const char *const ds_suffixes[] = {"attn_qkvw", "attn_qkvb", "attn_ow",  "attn_ob", "attn_nw", "attn_nb",
                                          "inter_w",   "inter_b",   "output_w", "output_b", "norm_w", "norm_b"};
static const char *const hf_suffixes[] = {
    "attention.self.query.weight",   "attention.self.query.bias",    "attention.self.key.weight",
    "attention.self.key.bias",       "attention.self.value.weight",  "attention.self.value.bias",
    "attention.output.dense.weight", "attention.output.dense.bias",  "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias", "intermediate.dense.weight",  "intermediate.dense.bias",
    "output.dense.weight",           "output.dense.bias",            "output.LayerNorm.weight",
    "output.LayerNorm.bias"};

/* Recognises "[grad.]<prefix>layer.<i>.<suffix>": returns 1 (DeepSpeed) or 2 (HF), 0 for other names. */
static int classify(const char *name, size_t *prefix_begin, size_t *prefix_len, long *index, int *grad) {
    const char *s = name;
    const char *pos;
    size_t i;
    *grad = strncmp(s, "grad.", 5) == 0;
    if (*grad) s += 5;
    for (pos = strstr(s, "layer."); pos; pos = strstr(pos + 1, "layer.")) {
        const char *d = pos + 6, *q = d;
        long idx = 0;
        if (pos != s && pos[-1] != '.') continue;
        while (*q >= '0' && *q <= '9' && q - d < 7) idx = idx * 10 + (*q++ - '0');
        if (q == d || *q != '.') continue;
        for (i = 0; i < sizeof ds_suffixes / sizeof *ds_suffixes; ++i)
            if (strcmp(q + 1, ds_suffixes[i]) == 0) goto found_ds;
        for (i = 0; i < sizeof hf_suffixes / sizeof *hf_suffixes; ++i)
            if (strcmp(q + 1, hf_suffixes[i]) == 0) goto found_hf;
        continue;
    found_ds:
        *prefix_begin = (size_t)(s - name);
        *prefix_len = (size_t)(pos - s);
        *index = idx;
        return 1;
    found_hf:
        *prefix_begin = (size_t)(s - name);
        *prefix_len = (size_t)(pos - s);
        *index = idx;
        return 2;
    }
    return 0;
}

typedef struct {
    char *prefix;
    int layout; /* 1 DeepSpeed, 2 HF */
    int grad;
    long *indices;
    size_t n_indices;
    size_t n_tensors;
} group_t;

static int info(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    unsigned long long hlen = 0, fsize;
    char *json;
    parser_t ps;
    tensor_t *tensors = NULL;
    meta_t *meta = NULL;
    group_t *groups = NULL;
    size_t nt = 0, nm = 0, ng = 0, i, j, other = 0;
    int k, rc = 1;

    if (!f) {
        fprintf(stderr, "%s: cannot open '%s': ", prog, path);
        perror(NULL);
        return 1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) < 0) {
        fprintf(stderr, "%s: '%s' is not a seekable file\n", prog, path);
        fclose(f);
        return 1;
    }
    fsize = (unsigned long long)ftell(f);
    rewind(f);
    if (fsize < 8 || fread(len8, 1, 8, f) != 8) {
        fprintf(stderr, "%s: '%s' is too short for a safetensors file\n", prog, path);
        fclose(f);
        return 1;
    }
    for (k = 7; k >= 0; --k) hlen = (hlen << 8) | len8[k];
    if (hlen > fsize - 8 || hlen > (100ULL << 20) || hlen < 2) {
        fprintf(stderr, "%s: '%s': header length %llu does not fit the file (%llu bytes)\n", prog, path, hlen, fsize);
        fclose(f);
        return 1;
    }
    json = (char *)xrealloc(NULL, (size_t)hlen);
    if (fread(json, 1, (size_t)hlen, f) != (size_t)hlen) {
        fprintf(stderr, "%s: cannot read the header of '%s'\n", prog, path);
        free(json);
        fclose(f);
        return 1;
    }
    fclose(f);

    ps.p = json;
    ps.end = json + hlen;
    ps.error = NULL;
    if (!expect(&ps, '{')) goto malformed;
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == '}') {
        ps.p++;
    } else {
        for (;;) {
            char *key = parse_string(&ps);
            if (!key || !expect(&ps, ':')) {
                free(key);
                goto malformed;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (!expect(&ps, '{')) goto malformed;
                skip_ws(&ps);
                if (ps.p < ps.end && *ps.p == '}') {
                    ps.p++;
                } else {
                    for (;;) {
                        char *mk = parse_string(&ps), *mv;
                        if (!mk || !expect(&ps, ':')) {
                            free(mk);
                            goto malformed;
                        }
                        mv = parse_string(&ps);
                        if (!mv) {
                            free(mk);
                            goto malformed;
                        }
                        meta = (meta_t *)xrealloc(meta, (nm + 1) * sizeof *meta);
                        meta[nm].key = mk;
                        meta[nm].value = mv;
                        nm++;
                        skip_ws(&ps);
                        if (ps.p < ps.end && *ps.p == ',') {
                            ps.p++;
                            continue;
                        }
                        if (!expect(&ps, '}')) goto malformed;
                        break;
                    }
                }
            } else {
                tensors = (tensor_t *)xrealloc(tensors, (nt + 1) * sizeof *tensors);
                memset(&tensors[nt], 0, sizeof *tensors);
                tensors[nt].name = key;
                nt++;
                if (!parse_entry(&ps, &tensors[nt - 1])) goto malformed;
                if (!tensors[nt - 1].dtype) {
                    ps.error = "a tensor entry has no dtype";
                    goto malformed;
                }
            }
            skip_ws(&ps);
            if (ps.p < ps.end && *ps.p == ',') {
                ps.p++;
                continue;
            }
            if (!expect(&ps, '}')) goto malformed;
            break;
        }
    }

    printf("file: %s (%llu bytes, header %llu bytes, data %llu bytes)\n", path, fsize, hlen, fsize - 8 - hlen);
    printf("tensors: %lu\n", (unsigned long)nt);
    /* dtypes and their counts */
    printf("dtypes:");
    for (i = 0; i < nt; ++i) {
        size_t count = 0;
        int seen = 0;
        for (j = 0; j < i; ++j)
            if (strcmp(tensors[j].dtype, tensors[i].dtype) == 0) seen = 1;
        if (seen) continue;
        for (j = i; j < nt; ++j)
            if (strcmp(tensors[j].dtype, tensors[i].dtype) == 0) count++;
        printf(" %s x%lu", tensors[i].dtype, (unsigned long)count);
    }
    printf("\n");
    /* layers, grouped by (prefix, layout, gradient) */
    for (i = 0; i < nt; ++i) {
        size_t pb, pl, g;
        long idx;
        int grad;
        const int lay = classify(tensors[i].name, &pb, &pl, &idx, &grad);
        if (!lay) {
            other++;
            continue;
        }
        for (g = 0; g < ng; ++g)
            if (groups[g].layout == lay && groups[g].grad == grad && strlen(groups[g].prefix) == pl &&
                strncmp(groups[g].prefix, tensors[i].name + pb, pl) == 0)
                break;
        if (g == ng) {
            groups = (group_t *)xrealloc(groups, (ng + 1) * sizeof *groups);
            memset(&groups[ng], 0, sizeof *groups);
            groups[ng].prefix = (char *)xrealloc(NULL, pl + 1);
            memcpy(groups[ng].prefix, tensors[i].name + pb, pl);
            groups[ng].prefix[pl] = '\0';
            groups[ng].layout = lay;
            groups[ng].grad = grad;
            ng++;
        }
        groups[g].n_tensors++;
        for (j = 0; j < groups[g].n_indices; ++j)
            if (groups[g].indices[j] == idx) break;
        if (j == groups[g].n_indices) {
            groups[g].indices = (long *)xrealloc(groups[g].indices, (j + 1) * sizeof(long));
            groups[g].indices[j] = idx;
            groups[g].n_indices++;
        }
    }
    if (ng == 0) printf("layers: none recognised\n");
    for (i = 0; i < ng; ++i)
        printf("layers: %lu %s(layout %s, prefix \"%s\", %lu tensors)\n", (unsigned long)groups[i].n_indices,
               groups[i].grad ? "gradient sets " : "", groups[i].layout == 1 ? "deepspeed" : "hf_bert",
               groups[i].prefix, (unsigned long)groups[i].n_tensors);
    printf("other tensors: %lu\n", (unsigned long)other);
    printf("metadata: %lu entries\n", (unsigned long)nm);
    for (i = 0; i < nm; ++i) printf("  %s: %s\n", meta[i].key, meta[i].value);
    rc = 0;
    goto done;

malformed:
    fprintf(stderr, "%s: '%s': malformed safetensors header (%s near byte %ld)\n", prog, path,
            ps.error ? ps.error : "syntax error", (long)(ps.p - json));
done:
    for (i = 0; i < nt; ++i) {
        free(tensors[i].name);
        free(tensors[i].dtype);
    }
    for (i = 0; i < nm; ++i) {
        free(meta[i].key);
        free(meta[i].value);
    }
    for (i = 0; i < ng; ++i) {
        free(groups[i].prefix);
        free(groups[i].indices);
    }
    free(groups);
    free(tensors);
    free(meta);
    free(json);
    return rc;
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
