/*
 * WordPiece tokenization compatible with BERT's BasicTokenizer + WordpieceTokenizer (Hugging Face
 * transformers' BertTokenizer), on Debian's utf8proc for the Unicode tables (categories, NFC/NFD,
 * lower-case mapping); plus the small shared pieces of the data side (errors, a monotonic clock,
 * splitmix64, id arrays).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "pretrain_data.h"

/* ---- shared pieces -------------------------------------------------------------------------------- */

void dstp_seterr(dstp_error *err, const char *fmt, ...);
void dstp_seterr(dstp_error *err, const char *fmt, ...) {
    va_list ap;
    if (!err) return;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

double dstp_mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dstp_rng_seed(dstp_rng *r, uint64_t seed, uint64_t stream) {
    r->state = seed ^ (stream * 0xD1B54A32D192ED03ull);
    (void)dstp_rng_next(r);
}

uint64_t dstp_rng_next(dstp_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double dstp_rng_uniform(dstp_rng *r) { return (double)(dstp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t dstp_rng_below(dstp_rng *r, uint64_t n) {
    const uint64_t limit = (uint64_t)0 - ((uint64_t)0 - n) % n; /* largest multiple of n, or 0 for 2^64 */
    uint64_t x;
    if (n <= 1) return 0;
    do x = dstp_rng_next(r);
    while (limit != 0 && x >= limit);
    return x % n;
}

dstp_status dstp_ids_push(dstp_ids *a, int32_t v) {
    if (a->n == a->cap) {
        const size_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *p = (int32_t *)realloc(a->v, cap * sizeof *p);
        if (!p) return DSTP_ERR_NOMEM;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = v;
    return DSTP_OK;
}

void dstp_ids_free(dstp_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- vocabulary: an open-addressing hash table of the tokens --------------------------------------- */

struct dstp_vocab {
    char **tokens;    /* by id */
    size_t *lens;
    int32_t count;
    int32_t *slots;   /* token ids, -1 empty */
    size_t nslots;    /* power of two */
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int32_t dstp_vocab_find(const dstp_vocab *v, const char *token, size_t len) {
    size_t i = (size_t)hash_bytes(token, len) & (v->nslots - 1);
    for (;;) {
        const int32_t id = v->slots[i];
        if (id < 0) return -1;
        if (v->lens[id] == len && memcmp(v->tokens[id], token, len) == 0) return id;
        i = (i + 1) & (v->nslots - 1);
    }
}

static void vocab_insert(dstp_vocab *v, int32_t id) {
    size_t i = (size_t)hash_bytes(v->tokens[id], v->lens[id]) & (v->nslots - 1);
    for (;;) {
        const int32_t o = v->slots[i];
        if (o < 0) {
            v->slots[i] = id;
            return;
        }
        if (v->lens[o] == v->lens[id] && memcmp(v->tokens[o], v->tokens[id], v->lens[id]) == 0) {
            v->slots[i] = id; /* a repeated token keeps its last id */
            return;
        }
        i = (i + 1) & (v->nslots - 1);
    }
}

void dstp_vocab_free(dstp_vocab *v) {
    int32_t i;
    if (!v) return;
    for (i = 0; i < v->count; ++i) free(v->tokens[i]);
    free(v->tokens);
    free(v->lens);
    free(v->slots);
    free(v);
}

/* Reads a whole file; DSTP_ERR_IO with the reason. */
dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err);
dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f) {
        dstp_seterr(err, "%s: cannot open: %s", path, strerror(errno));
        return DSTP_ERR_IO;
    }
    for (;;) {
        size_t got;
        if (n == cap) {
            char *p;
            cap = cap ? 2 * cap : 1 << 16;
            p = (char *)realloc(buf, cap + 1);
            if (!p) {
                free(buf);
                fclose(f);
                dstp_seterr(err, "%s: out of memory", path);
                return DSTP_ERR_NOMEM;
            }
            buf = p;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        dstp_seterr(err, "%s: read error", path);
        return DSTP_ERR_IO;
    }
    fclose(f);
    if (!buf) buf = (char *)malloc(1);
    if (!buf) return DSTP_ERR_NOMEM;
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return DSTP_OK;
}

/* Offset of the first byte that is not valid UTF-8, or -1. */
static long invalid_utf8_at(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k < 0) return (long)i;
        i += (size_t)k;
    }
    return -1;
}

dstp_status dstp_vocab_load(const char *path, dstp_vocab **out, dstp_error *err) {
    char *data = NULL;
    size_t len = 0, i, start = 0, lines = 0;
    long bad;
    dstp_vocab *v;
    dstp_status st = dstp_read_file(path, &data, &len, err);
    if (st != DSTP_OK) return st;
    if (len == 0) {
        free(data);
        dstp_seterr(err, "%s: empty vocabulary file", path);
        return DSTP_ERR_FORMAT;
    }
    bad = invalid_utf8_at(data, len);
    if (bad >= 0) {
        free(data);
        dstp_seterr(err, "%s: not UTF-8 (byte offset %ld)", path, bad);
        return DSTP_ERR_FORMAT;
    }
    for (i = 0; i < len; ++i) lines += data[i] == '\n';
    if (len && data[len - 1] != '\n') ++lines;
    v = (dstp_vocab *)calloc(1, sizeof *v);
    if (!v || lines > 0x7FFFFFFF) {
        free(v);
        free(data);
        dstp_seterr(err, "%s: out of memory", path);
        return DSTP_ERR_NOMEM;
    }
    v->tokens = (char **)calloc(lines, sizeof *v->tokens);
    v->lens = (size_t *)calloc(lines, sizeof *v->lens);
    v->nslots = 64;
    while (v->nslots < 2 * lines) v->nslots *= 2;
    v->slots = (int32_t *)malloc(v->nslots * sizeof *v->slots);
    if (!v->tokens || !v->lens || !v->slots) {
        dstp_vocab_free(v);
        free(data);
        dstp_seterr(err, "%s: out of memory", path);
        return DSTP_ERR_NOMEM;
    }
    memset(v->slots, 0xFF, v->nslots * sizeof *v->slots);
    for (i = 0; i <= len; ++i) {
        if (i < len && data[i] != '\n') continue;
        if (i == len && start == len) break;
        {
            const size_t n = i - start;
            char *t = (char *)malloc(n + 1);
            if (!t) {
                dstp_vocab_free(v);
                free(data);
                dstp_seterr(err, "%s: out of memory", path);
                return DSTP_ERR_NOMEM;
            }
            memcpy(t, data + start, n);
            t[n] = '\0';
            v->tokens[v->count] = t;
            v->lens[v->count] = n;
            vocab_insert(v, v->count);
            ++v->count;
        }
        start = i + 1;
    }
    free(data);
    *out = v;
    return DSTP_OK;
}

int32_t dstp_vocab_size(const dstp_vocab *v) { return v->count; }
const char *dstp_vocab_token(const dstp_vocab *v, int32_t id) {
    return id >= 0 && id < v->count ? v->tokens[id] : NULL;
}

dstp_status dstp_vocab_special(const dstp_vocab *v, dstp_special *out, dstp_error *err) {
    static const char *names[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    int32_t ids[5];
    int k;
    for (k = 0; k < 5; ++k) {
        ids[k] = dstp_vocab_find(v, names[k], strlen(names[k]));
        if (ids[k] < 0) {
            dstp_seterr(err, "vocabulary: the special token %s is missing", names[k]);
            return DSTP_ERR_FORMAT;
        }
    }
    out->pad = ids[0];
    out->unk = ids[1];
    out->cls = ids[2];
    out->sep = ids[3];
    out->mask = ids[4];
    return DSTP_OK;
}

/* ---- character classes (BERT's _is_whitespace, _is_control, _is_punctuation, _is_chinese_char) -------- */

static int is_whitespace(utf8proc_int32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}

/* Python's str.split() also splits at the line and paragraph separators (Zl, Zp), which cleaning keeps. */
static int splits_words(utf8proc_int32_t c) {
    const utf8proc_category_t k = utf8proc_category(c);
    return c == ' ' || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static int is_control(utf8proc_int32_t c) {
    utf8proc_category_t k;
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN;
}

static int is_punctuation(utf8proc_int32_t c) {
    utf8proc_category_t k;
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return 1;
    k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static int is_cjk(utf8proc_int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ---- WordPiece ----------------------------------------------------------------------------------------- */

typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *p;
        while (cap < b->n + n + 1) cap *= 2;
        p = (char *)realloc(b->s, cap);
        if (!p) return 0;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 1;
}

static int buf_cp(buf *b, utf8proc_int32_t c) {
    utf8proc_uint8_t e[4];
    const utf8proc_ssize_t k = utf8proc_encode_char(c, e);
    return buf_put(b, (const char *)e, (size_t)k);
}

/* Greedy longest-match-first WordPiece of one word (UTF-8, w[0..n)). */
static dstp_status wordpiece(const dstp_tokenizer *t, const char *w, size_t n, dstp_ids *out, buf *scratch) {
    size_t bounds[1024], nb = 0, i = 0, start;
    dstp_ids pieces = {NULL, 0, 0};
    const dstp_vocab *v = t->vocab;
    int32_t unk = dstp_vocab_find(v, "[UNK]", 5);
    /* code point boundaries */
    while (i < n) {
        utf8proc_int32_t c;
        const utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)w + i, (utf8proc_ssize_t)(n - i), &c);
        if (nb == sizeof bounds / sizeof bounds[0] - 1 || (int)nb >= t->max_chars_per_word) {
            nb = (size_t)-1;
            break;
        }
        bounds[nb++] = i;
        i += (size_t)(k > 0 ? k : 1);
    }
    if (nb == (size_t)-1) return dstp_ids_push(out, unk);
    bounds[nb] = n;
    for (start = 0; start < nb;) {
        size_t end = nb;
        int32_t found = -1;
        while (end > start) {
            scratch->n = 0;
            if (start > 0 && !buf_put(scratch, "##", 2)) return DSTP_ERR_NOMEM;
            if (!buf_put(scratch, w + bounds[start], bounds[end] - bounds[start])) return DSTP_ERR_NOMEM;
            found = dstp_vocab_find(v, scratch->s, scratch->n);
            if (found >= 0) break;
            --end;
        }
        if (found < 0) {
            dstp_ids_free(&pieces);
            return dstp_ids_push(out, unk);
        }
        if (dstp_ids_push(&pieces, found) != DSTP_OK) return DSTP_ERR_NOMEM;
        start = end;
    }
    for (i = 0; i < pieces.n; ++i)
        if (dstp_ids_push(out, pieces.v[i]) != DSTP_OK) return DSTP_ERR_NOMEM;
    dstp_ids_free(&pieces);
    return DSTP_OK;
}

/* One whitespace-separated token: NFC, (lower-case, NFD, drop Mn), split punctuation, WordPiece. */
static dstp_status basic_word(const dstp_tokenizer *t, const char *s, size_t n, dstp_ids *out, buf *word, buf *scratch) {
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t nn, i = 0;
    dstp_status st = DSTP_OK;
    nn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (nn < 0) return DSTP_ERR_FORMAT;
    if (t->lower_case) {
        buf low = {NULL, 0, 0};
        utf8proc_uint8_t *dec = NULL;
        while (i < nn) {
            utf8proc_int32_t c;
            i += utf8proc_iterate(norm + i, nn - i, &c);
            if (!buf_cp(&low, utf8proc_tolower(c))) {
                free(low.s);
                free(norm);
                return DSTP_ERR_NOMEM;
            }
        }
        free(norm);
        nn = low.n ? utf8proc_map((const utf8proc_uint8_t *)low.s, (utf8proc_ssize_t)low.n, &dec,
                                  UTF8PROC_STABLE | UTF8PROC_DECOMPOSE)
                   : 0;
        free(low.s);
        if (nn < 0) return DSTP_ERR_FORMAT;
        norm = dec;
        /* drop the non-spacing marks */
        {
            buf kept = {NULL, 0, 0};
            i = 0;
            while (i < nn) {
                utf8proc_int32_t c;
                i += utf8proc_iterate(norm + i, nn - i, &c);
                if (utf8proc_category(c) != UTF8PROC_CATEGORY_MN && !buf_cp(&kept, c)) {
                    free(kept.s);
                    free(norm);
                    return DSTP_ERR_NOMEM;
                }
            }
            free(norm);
            norm = (utf8proc_uint8_t *)kept.s;
            nn = (utf8proc_ssize_t)kept.n;
        }
    }
    word->n = 0;
    i = 0;
    while (i < nn && st == DSTP_OK) {
        utf8proc_int32_t c;
        const utf8proc_ssize_t k = utf8proc_iterate(norm + i, nn - i, &c);
        if (is_punctuation(c)) {
            if (word->n) st = wordpiece(t, word->s, word->n, out, scratch);
            word->n = 0;
            if (st == DSTP_OK) st = wordpiece(t, (const char *)norm + i, (size_t)k, out, scratch);
        } else if (!buf_put(word, (const char *)norm + i, (size_t)k)) {
            st = DSTP_ERR_NOMEM;
        }
        i += k;
    }
    if (st == DSTP_OK && word->n) st = wordpiece(t, word->s, word->n, out, scratch);
    free(norm);
    return st;
}

dstp_status dstp_tokenize(const dstp_tokenizer *t, const char *text, size_t len, dstp_ids *out, dstp_error *err) {
    buf clean = {NULL, 0, 0}, word = {NULL, 0, 0}, scratch = {NULL, 0, 0};
    size_t i = 0, w0;
    dstp_status st = DSTP_OK;
    /* cleaning and CJK padding */
    while (i < len) {
        utf8proc_int32_t c;
        const utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &c);
        int ok = 1;
        if (k < 0) {
            free(clean.s);
            dstp_seterr(err, "text is not UTF-8 (byte offset %zu)", i);
            return DSTP_ERR_FORMAT;
        }
        i += (size_t)k;
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) ok = buf_put(&clean, " ", 1);
        else if (is_cjk(c)) ok = buf_put(&clean, " ", 1) && buf_cp(&clean, c) && buf_put(&clean, " ", 1);
        else ok = buf_cp(&clean, c);
        if (!ok) {
            free(clean.s);
            dstp_seterr(err, "tokenizer: out of memory");
            return DSTP_ERR_NOMEM;
        }
    }
    /* whitespace split, then each word */
    i = 0;
    while (i < clean.n && st == DSTP_OK) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)clean.s + i, (utf8proc_ssize_t)(clean.n - i), &c);
        if (splits_words(c)) {
            i += (size_t)k;
            continue;
        }
        w0 = i;
        while (i < clean.n) {
            k = utf8proc_iterate((const utf8proc_uint8_t *)clean.s + i, (utf8proc_ssize_t)(clean.n - i), &c);
            if (splits_words(c)) break;
            i += (size_t)k;
        }
        st = basic_word(t, clean.s + w0, i - w0, out, &word, &scratch);
    }
    free(clean.s);
    free(word.s);
    free(scratch.s);
    if (st == DSTP_ERR_NOMEM) dstp_seterr(err, "tokenizer: out of memory");
    else if (st != DSTP_OK) dstp_seterr(err, "tokenizer: Unicode normalisation failed");
    return st;
}
