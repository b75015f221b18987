/*
 * Raw text → sentence-pair examples with BERT's masking rule (deepspeed_engine.md §7.4), in the
 * manner of BERT's create_pretraining_data.py, deterministic from (seed, epoch).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pretrain_data.h"

void dstp_seterr(dstp_error *err, const char *fmt, ...);
dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err);

/* ---- masking ------------------------------------------------------------------------------------------ */

int32_t dstp_mask_count(int32_t len, int32_t max_pred) {
    /* Python's round(): half to even, on the same double; nearbyint rounds that way by default. */
    const double r = nearbyint((double)len * 0.15);
    int32_t n = r < 1.0 ? 1 : (int32_t)r;
    return n < max_pred ? n : max_pred;
}

static int cmp_pair(const void *a, const void *b) {
    const int32_t *x = (const int32_t *)a, *y = (const int32_t *)b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

int32_t dstp_mask(int32_t *ids, int32_t len, int32_t max_pred, int32_t vocab_size, const dstp_special *sp,
                  dstp_rng *rng, int32_t *positions, int32_t *labels) {
    int32_t cand[4096], ncand = 0, i, want, n = 0;
    int32_t pairs[2 * 4096];
    for (i = 0; i < len && ncand < 4096; ++i)
        if (ids[i] != sp->cls && ids[i] != sp->sep) cand[ncand++] = i;
    for (i = ncand - 1; i > 0; --i) { /* Fisher-Yates */
        const int32_t j = (int32_t)dstp_rng_below(rng, (uint64_t)i + 1), t = cand[i];
        cand[i] = cand[j];
        cand[j] = t;
    }
    want = dstp_mask_count(len, max_pred);
    for (i = 0; i < ncand && n < want; ++i, ++n) {
        const int32_t p = cand[i], orig = ids[p];
        if (dstp_rng_uniform(rng) < 0.8) ids[p] = sp->mask;
        else if (dstp_rng_uniform(rng) >= 0.5) ids[p] = (int32_t)dstp_rng_below(rng, (uint64_t)vocab_size);
        pairs[2 * n] = p;
        pairs[2 * n + 1] = orig;
    }
    qsort(pairs, (size_t)n, 2 * sizeof(int32_t), cmp_pair);
    for (i = 0; i < n; ++i) {
        positions[i] = pairs[2 * i];
        labels[i] = pairs[2 * i + 1];
    }
    return n;
}

/* ---- corpus ------------------------------------------------------------------------------------------- */

typedef struct sentence {
    size_t off, len; /* in the corpus's token array */
} sentence;

typedef struct document {
    size_t first, count; /* sentences */
} document;

struct dstp_corpus {
    dstp_ids tokens;
    sentence *sent;
    size_t nsent, capsent;
    document *doc;
    size_t ndoc, capdoc;
};

void dstp_corpus_free(dstp_corpus *c) {
    if (!c) return;
    dstp_ids_free(&c->tokens);
    free(c->sent);
    free(c->doc);
    free(c);
}

static int add_sentence(dstp_corpus *c, size_t off);
static int end_document(dstp_corpus *c, size_t first);

size_t dstp_corpus_documents(const dstp_corpus *c) { return c->ndoc; }

dstp_status dstp_corpus_split(const dstp_corpus *c, int32_t every, int heldout, dstp_corpus **out, dstp_error *err) {
    dstp_corpus *p;
    size_t d, s, k;
    if (every < 2) {
        dstp_seterr(err, "corpus: hold out one document in %d: expected at least 2", (int)every);
        return DSTP_ERR_ARG;
    }
    p = (dstp_corpus *)calloc(1, sizeof *p);
    if (!p) goto nomem;
    for (d = 0; d < c->ndoc; ++d) {
        const document *doc = &c->doc[d];
        const size_t first = p->nsent;
        if ((d % (size_t)every == (size_t)every - 1) != (heldout != 0)) continue;
        for (s = doc->first; s < doc->first + doc->count; ++s) {
            const size_t off = p->tokens.n;
            for (k = 0; k < c->sent[s].len; ++k)
                if (dstp_ids_push(&p->tokens, c->tokens.v[c->sent[s].off + k]) != DSTP_OK) goto nomem;
            if (!add_sentence(p, off)) goto nomem;
        }
        if (!end_document(p, first)) goto nomem;
    }
    if (p->ndoc == 0) {
        dstp_seterr(err, "corpus: its %zu documents leave no %s document when one in %d is held out", c->ndoc,
                    heldout ? "held-out" : "training", (int)every);
        dstp_corpus_free(p);
        return DSTP_ERR_FORMAT;
    }
    *out = p;
    return DSTP_OK;
nomem:
    dstp_corpus_free(p);
    dstp_seterr(err, "corpus: out of memory");
    return DSTP_ERR_NOMEM;
}
size_t dstp_corpus_tokens(const dstp_corpus *c) { return c->tokens.n; }

static int add_sentence(dstp_corpus *c, size_t off) {
    if (c->tokens.n == off) return 1; /* nothing tokenized */
    if (c->nsent == c->capsent) {
        const size_t cap = c->capsent ? 2 * c->capsent : 1024;
        sentence *p = (sentence *)realloc(c->sent, cap * sizeof *p);
        if (!p) return 0;
        c->sent = p;
        c->capsent = cap;
    }
    c->sent[c->nsent].off = off;
    c->sent[c->nsent].len = c->tokens.n - off;
    ++c->nsent;
    return 1;
}

static int end_document(dstp_corpus *c, size_t first) {
    if (c->nsent == first) return 1;
    if (c->ndoc == c->capdoc) {
        const size_t cap = c->capdoc ? 2 * c->capdoc : 256;
        document *p = (document *)realloc(c->doc, cap * sizeof *p);
        if (!p) return 0;
        c->doc = p;
        c->capdoc = cap;
    }
    c->doc[c->ndoc].first = first;
    c->doc[c->ndoc].count = c->nsent - first;
    ++c->ndoc;
    return 1;
}

dstp_status dstp_corpus_load(const char *path, const dstp_tokenizer *tok, dstp_corpus **out, dstp_error *err) {
    char *data = NULL;
    size_t len = 0, i = 0, doc_first = 0, line_no = 1;
    dstp_corpus *c;
    dstp_status st = dstp_read_file(path, &data, &len, err);
    if (st != DSTP_OK) return st;
    c = (dstp_corpus *)calloc(1, sizeof *c);
    if (!c) {
        free(data);
        dstp_seterr(err, "%s: out of memory", path);
        return DSTP_ERR_NOMEM;
    }
    while (i < len) {
        size_t e = i, s;
        int blank = 1;
        while (e < len && data[e] != '\n') {
            if (data[e] != ' ' && data[e] != '\t' && data[e] != '\r') blank = 0;
            ++e;
        }
        if (blank) {
            if (!end_document(c, doc_first)) st = DSTP_ERR_NOMEM;
            doc_first = c->nsent;
        } else {
            /* sentences end after '.', '!' or '?' followed by a space */
            for (s = i; s < e && st == DSTP_OK;) {
                size_t t = s, off = c->tokens.n;
                while (t < e && !((data[t] == '.' || data[t] == '!' || data[t] == '?') && t + 1 < e && data[t + 1] == ' '))
                    ++t;
                if (t < e) ++t;
                st = dstp_tokenize(tok, data + s, t - s, &c->tokens, err);
                if (st == DSTP_OK && !add_sentence(c, off)) st = DSTP_ERR_NOMEM;
                s = t;
            }
            if (st == DSTP_ERR_FORMAT) {
                dstp_error inner = *err;
                dstp_seterr(err, "%s: line %zu: %s", path, line_no, inner.msg);
            }
        }
        if (st != DSTP_OK) break;
        i = e + 1;
        ++line_no;
    }
    free(data);
    if (st == DSTP_OK && !end_document(c, doc_first)) st = DSTP_ERR_NOMEM;
    if (st == DSTP_ERR_NOMEM) dstp_seterr(err, "%s: out of memory", path);
    if (st == DSTP_OK && c->tokens.n == 0) {
        dstp_seterr(err, "%s: the corpus has no text", path);
        st = DSTP_ERR_FORMAT;
    }
    if (st != DSTP_OK) {
        dstp_corpus_free(c);
        return st;
    }
    *out = c;
    return DSTP_OK;
}

/* ---- examples of one epoch -------------------------------------------------------------------------------- */

static void truncate_pair(dstp_ids *a, dstp_ids *b, size_t max, dstp_rng *rng) {
    while (a->n + b->n > max) {
        dstp_ids *t = a->n > b->n ? a : b;
        if (t->n == 0) break;
        if (dstp_rng_uniform(rng) < 0.5) memmove(t->v, t->v + 1, (t->n - 1) * sizeof *t->v);
        --t->n;
    }
}

static int append_sentences(const dstp_corpus *c, size_t first, size_t last, dstp_ids *to) {
    size_t s, k;
    for (s = first; s < last; ++s)
        for (k = 0; k < c->sent[s].len; ++k)
            if (dstp_ids_push(to, c->tokens.v[c->sent[s].off + k]) != DSTP_OK) return 0;
    return 1;
}

typedef struct grow {
    dstp_example *ex;
    size_t n, cap;
    int32_t **blocks;
    size_t nblocks, capblocks;
} grow;

static dstp_example *new_example(grow *g, int32_t seq, int32_t max_pred) {
    int32_t *mem;
    dstp_example *e;
    if (g->n == g->cap) {
        const size_t cap = g->cap ? 2 * g->cap : 256;
        dstp_example *p = (dstp_example *)realloc(g->ex, cap * sizeof *p);
        if (!p) return NULL;
        g->ex = p;
        g->cap = cap;
    }
    if (g->nblocks == g->capblocks) {
        const size_t cap = g->capblocks ? 2 * g->capblocks : 256;
        int32_t **p = (int32_t **)realloc(g->blocks, cap * sizeof *p);
        if (!p) return NULL;
        g->blocks = p;
        g->capblocks = cap;
    }
    mem = (int32_t *)calloc((size_t)(2 * seq + 2 * max_pred), sizeof *mem);
    if (!mem) return NULL;
    g->blocks[g->nblocks++] = mem;
    e = &g->ex[g->n++];
    memset(e, 0, sizeof *e);
    e->ids = mem;
    e->types = mem + seq;
    e->pos = mem + 2 * seq;
    e->labels = mem + 2 * seq + max_pred;
    return e;
}

void dstp_epoch_free(dstp_epoch *e) {
    size_t i;
    if (!e) return;
    for (i = 0; i < e->count; ++i) free(e->ex[i].ids);
    free(e->ex);
    memset(e, 0, sizeof *e);
}

dstp_status dstp_epoch_build(const dstp_corpus *c, const dstp_special *sp, int32_t vocab_size, int32_t seq,
                             int32_t max_pred, uint64_t seed, uint64_t epoch, dstp_epoch *out, dstp_error *err) {
    dstp_rng rng;
    grow g;
    dstp_ids a = {NULL, 0, 0}, b = {NULL, 0, 0};
    size_t d, i;
    const size_t target = (size_t)(seq - 3);
    int ok = 1;
    if (seq < 8 || seq > 4096 || max_pred < 1 || max_pred > seq || vocab_size < 1) {
        dstp_seterr(err, "examples: seq %d (8..4096) or max_pred %d (1..seq) out of range", (int)seq, (int)max_pred);
        return DSTP_ERR_ARG;
    }
    memset(&g, 0, sizeof g);
    dstp_rng_seed(&rng, seed, 0x5E9000ull + epoch);
    for (d = 0; d < c->ndoc && ok; ++d) {
        const document *doc = &c->doc[d];
        size_t chunk_first = 0, chunk_len = 0, s = 0;
        while (s < doc->count && ok) {
            chunk_len += c->sent[doc->first + s].len;
            if (s + 1 == doc->count || chunk_len >= target) {
                const size_t nchunk = s + 1 - chunk_first;
                size_t a_end = 1, k;
                int random_next = 0;
                dstp_example *e;
                if (nchunk >= 2) a_end = 1 + (size_t)dstp_rng_below(&rng, nchunk - 1);
                a.n = b.n = 0;
                ok = append_sentences(c, doc->first + chunk_first, doc->first + chunk_first + a_end, &a);
                if (ok && (nchunk == 1 || dstp_rng_uniform(&rng) < 0.5)) {
                    /* B from a random other document (the same one when there is no other) */
                    size_t other = d, start;
                    int tries;
                    random_next = 1;
                    for (tries = 0; tries < 10 && other == d && c->ndoc > 1; ++tries)
                        other = (size_t)dstp_rng_below(&rng, c->ndoc);
                    start = (size_t)dstp_rng_below(&rng, c->doc[other].count);
                    for (k = start; k < c->doc[other].count && b.n < target - (a.n < target ? a.n : target); ++k)
                        ok = ok && append_sentences(c, c->doc[other].first + k, c->doc[other].first + k + 1, &b);
                    s -= nchunk - a_end; /* the unused sentences go into the next chunk */
                } else if (ok) {
                    ok = append_sentences(c, doc->first + chunk_first + a_end, doc->first + s + 1, &b);
                }
                truncate_pair(&a, &b, target, &rng);
                if (ok && a.n > 0 && b.n > 0) {
                    e = new_example(&g, seq, max_pred);
                    if (!e) ok = 0;
                    else {
                        int32_t n = 0;
                        e->ids[n++] = sp->cls;
                        for (k = 0; k < a.n; ++k) e->ids[n++] = a.v[k];
                        e->ids[n++] = sp->sep;
                        for (k = 0; k < b.n; ++k) {
                            e->types[n] = 1;
                            e->ids[n++] = b.v[k];
                        }
                        e->types[n] = 1;
                        e->ids[n++] = sp->sep;
                        for (k = (size_t)n; k < (size_t)seq; ++k) e->ids[k] = sp->pad;
                        e->len = n;
                        e->nsp = random_next;
                        e->npred = dstp_mask(e->ids, n, max_pred, vocab_size, sp, &rng, e->pos, e->labels);
                    }
                }
                chunk_first = s + 1;
                chunk_len = 0;
            }
            ++s;
        }
    }
    dstp_ids_free(&a);
    dstp_ids_free(&b);
    free(g.blocks); /* each example's block is owned through its ids pointer */
    if (!ok) {
        out->ex = g.ex;
        out->count = g.n;
        dstp_epoch_free(out);
        dstp_seterr(err, "examples: out of memory");
        return DSTP_ERR_NOMEM;
    }
    for (i = g.n; i > 1; --i) { /* shuffle */
        const size_t j = (size_t)dstp_rng_below(&rng, i);
        const dstp_example t = g.ex[i - 1];
        g.ex[i - 1] = g.ex[j];
        g.ex[j] = t;
    }
    out->seq = seq;
    out->max_pred = max_pred;
    out->count = g.n;
    out->ex = g.ex;
    out->storage = NULL;
    if (g.n == 0) {
        dstp_epoch_free(out);
        dstp_seterr(err, "examples: the corpus gives no sentence pair");
        return DSTP_ERR_FORMAT;
    }
    return DSTP_OK;
}
