/*
 * The loader thread: prepares batches ahead of the trainer in a ring of depth + 1 slots (the trainer
 * holds one, the thread fills up to `depth`). One producer fills the batches in stream order, so their
 * content does not depend on timing. Shutdown: dstp_loader_destroy() sets `stop` and wakes the thread
 * wherever it waits; the thread exits between two batches and is joined.
 *
 * Stream order. Raw text: epoch e is dstp_epoch_build(seed, e), cut into batches in order (the last,
 * shorter batch kept). HDF5 (§7.5, one rank): the shard files are sorted by name and shuffled once by
 * the seed; epoch e reads file e mod F in a random sample order drawn from (seed, e), in batches of
 * `batch` (the last, shorter batch kept).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pretrain_data.h"

void dstp_seterr(dstp_error *err, const char *fmt, ...);

struct dstp_loader {
    dstp_loader_config cfg;
    char *vocab_path, *corpus_path;
    char **shards;
    dstp_vocab *vocab;
    dstp_tokenizer tok;
    dstp_special sp;
    int32_t seq, max_pred;
    /* raw text */
    dstp_corpus *corpus;
    dstp_epoch ep;
    /* HDF5 */
    dstp_shard shard;
    int64_t *order, norder;
    dstp_example tmp;
    int32_t *tmp_mem;
    /* stream position */
    uint64_t epoch, next_index;
    size_t cursor;
    int have_epoch;
    /* the ring */
    dstp_batch *slots;
    int nslots, head, tail, ready, free_slots, held;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, started;
    dstp_status fail;
    dstp_error fail_err;
    pthread_t thread;
};

static char *dup_str(const char *s) {
    char *d;
    if (!s) return NULL;
    d = (char *)malloc(strlen(s) + 1);
    if (d) strcpy(d, s);
    return d;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Loads epoch l->epoch's examples (text) or shard and sample order (HDF5). */
static dstp_status begin_epoch(dstp_loader *l, dstp_error *err) {
    dstp_rng rng;
    int64_t i;
    if (l->corpus) {
        dstp_epoch_free(&l->ep);
        return dstp_epoch_build(l->corpus, &l->sp, dstp_vocab_size(l->vocab), l->seq, l->max_pred, l->cfg.seed,
                                l->epoch, &l->ep, err);
    }
    {
        const size_t f = (size_t)(l->epoch % l->cfg.num_shards);
        dstp_shard s;
        dstp_status st;
        if (l->shard.n == 0 || l->cfg.num_shards > 1) {
            st = dstp_shard_read(l->shards[f], &s, err);
            if (st != DSTP_OK) return st;
            if (s.seq != l->seq || s.max_pred != l->max_pred) {
                dstp_seterr(err, "%s: samples of length %lld with %lld predictions, the first shard has %d and %d",
                            l->shards[f], (long long)s.seq, (long long)s.max_pred, (int)l->seq, (int)l->max_pred);
                dstp_shard_free(&s);
                return DSTP_ERR_FORMAT;
            }
            dstp_shard_free(&l->shard);
            l->shard = s;
        }
    }
    free(l->order);
    l->order = (int64_t *)malloc((size_t)l->shard.n * sizeof *l->order);
    if (!l->order) {
        dstp_seterr(err, "loader: out of memory");
        return DSTP_ERR_NOMEM;
    }
    l->norder = 0;
    for (i = 0; i < l->shard.n; ++i)
        if (!l->cfg.holdout_every || ((i % l->cfg.holdout_every == l->cfg.holdout_every - 1) == (l->cfg.heldout != 0)))
            l->order[l->norder++] = i;
    if (l->norder == 0) {
        dstp_seterr(err, "%s: its %lld samples leave no %s sample when one in %d is held out",
                    l->shards[l->epoch % l->cfg.num_shards], (long long)l->shard.n,
                    l->cfg.heldout ? "held-out" : "training", (int)l->cfg.holdout_every);
        return DSTP_ERR_FORMAT;
    }
    dstp_rng_seed(&rng, l->cfg.seed, 0x4D5000ull + l->epoch);
    for (i = l->norder - 1; i > 0; --i) {
        const int64_t j = (int64_t)dstp_rng_below(&rng, (uint64_t)i + 1), t = l->order[i];
        l->order[i] = l->order[j];
        l->order[j] = t;
    }
    return DSTP_OK;
}

/* The next batch of the stream into `b`. */
static dstp_status make_batch(dstp_loader *l, dstp_batch *b, dstp_error *err) {
    const size_t total = l->corpus ? l->ep.count : (size_t)l->norder;
    int32_t k = 0, j;
    dstp_status st;
    if (!l->have_epoch || l->cursor >= total) {
        if (l->have_epoch) ++l->epoch;
        st = begin_epoch(l, err);
        if (st != DSTP_OK) return st;
        l->have_epoch = 1;
        l->cursor = 0;
    }
    b->nrows = 0;
    b->epoch = l->epoch;
    b->index = l->next_index++;
    while (k < l->cfg.batch && l->cursor < total) {
        const dstp_example *e;
        if (l->corpus) {
            e = &l->ep.ex[l->cursor];
        } else {
            st = dstp_shard_example(&l->shard, l->order[l->cursor], dstp_vocab_size(l->vocab), &l->tmp, err);
            if (st != DSTP_OK) {
                dstp_error inner = *err;
                dstp_seterr(err, "%s: %s", l->shards[l->epoch % l->cfg.num_shards], inner.msg);
                return st;
            }
            e = &l->tmp;
        }
        memcpy(b->ids + (size_t)k * l->seq, e->ids, (size_t)l->seq * sizeof(int32_t));
        memcpy(b->types + (size_t)k * l->seq, e->types, (size_t)l->seq * sizeof(int32_t));
        b->lengths[k] = e->len;
        b->nsp[k] = e->nsp;
        for (j = 0; j < e->npred; ++j) {
            b->rows[b->nrows] = k * l->seq + e->pos[j];
            b->labels[b->nrows] = e->labels[j];
            ++b->nrows;
        }
        ++k;
        ++l->cursor;
    }
    b->batch = k;
    return DSTP_OK;
}

static void *producer(void *arg) {
    dstp_loader *l = (dstp_loader *)arg;
    for (;;) {
        dstp_batch *b;
        dstp_error err;
        dstp_status st;
        pthread_mutex_lock(&l->mu);
        while (!l->stop && l->free_slots == 0) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) {
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        b = &l->slots[l->tail];
        pthread_mutex_unlock(&l->mu);
        do st = make_batch(l, b, &err);
        while (st == DSTP_OK && b->index < l->cfg.start_batch);
        pthread_mutex_lock(&l->mu);
        if (st != DSTP_OK) {
            l->fail = st;
            l->fail_err = err;
            pthread_cond_broadcast(&l->cv);
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        l->tail = (l->tail + 1) % l->nslots;
        --l->free_slots;
        ++l->ready;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
}

void dstp_loader_destroy(dstp_loader *l) {
    int i;
    size_t f;
    if (!l) return;
    if (l->started) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    for (i = 0; l->slots && i < l->nslots; ++i) {
        free(l->slots[i].ids);
        free(l->slots[i].rows);
    }
    free(l->slots);
    dstp_corpus_free(l->corpus);
    dstp_epoch_free(&l->ep);
    dstp_shard_free(&l->shard);
    free(l->order);
    free(l->tmp_mem);
    dstp_vocab_free(l->vocab);
    for (f = 0; l->shards && f < l->cfg.num_shards; ++f) free(l->shards[f]);
    free(l->shards);
    free(l->vocab_path);
    free(l->corpus_path);
    free(l);
}

dstp_status dstp_loader_create(const dstp_loader_config *cfg, dstp_loader **out, dstp_error *err) {
    dstp_loader *l;
    dstp_status st;
    int i;
    size_t f;
    if (!cfg || !out || !cfg->vocab || (!cfg->corpus == !cfg->shards) || (cfg->shards && cfg->num_shards == 0) ||
        cfg->batch < 1 || cfg->depth < 1 || cfg->depth > 64 || cfg->holdout_every < 0 || cfg->holdout_every == 1) {
        dstp_seterr(err, "loader: need a vocabulary, exactly one of a corpus or shards, batch >= 1, depth 1..64 and "
                         "holdout_every 0 or >= 2");
        return DSTP_ERR_ARG;
    }
    l = (dstp_loader *)calloc(1, sizeof *l);
    if (!l) return DSTP_ERR_NOMEM;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->cfg = *cfg;
    l->vocab_path = dup_str(cfg->vocab);
    l->corpus_path = dup_str(cfg->corpus);
    l->cfg.vocab = l->vocab_path;
    l->cfg.corpus = l->corpus_path;
    if (cfg->shards) {
        dstp_rng rng;
        l->shards = (char **)calloc(cfg->num_shards, sizeof *l->shards);
        for (f = 0; l->shards && f < cfg->num_shards; ++f) l->shards[f] = dup_str(cfg->shards[f]);
        qsort(l->shards, cfg->num_shards, sizeof *l->shards, cmp_str);
        dstp_rng_seed(&rng, cfg->seed, 0xF11E5ull);
        for (f = cfg->num_shards - 1; f > 0; --f) {
            const size_t j = (size_t)dstp_rng_below(&rng, f + 1);
            char *t = l->shards[f];
            l->shards[f] = l->shards[j];
            l->shards[j] = t;
        }
        l->cfg.shards = (const char *const *)l->shards;
    }
    st = dstp_vocab_load(cfg->vocab, &l->vocab, err);
    if (st == DSTP_OK) st = dstp_vocab_special(l->vocab, &l->sp, err);
    l->tok.vocab = l->vocab;
    l->tok.lower_case = cfg->lower_case;
    l->tok.max_chars_per_word = 100;
    if (st == DSTP_OK && cfg->corpus) {
        l->seq = cfg->seq;
        l->max_pred = cfg->max_pred;
        st = dstp_corpus_load(cfg->corpus, &l->tok, &l->corpus, err);
        if (st == DSTP_OK && cfg->holdout_every) {
            dstp_corpus *part = NULL;
            st = dstp_corpus_split(l->corpus, cfg->holdout_every, cfg->heldout, &part, err);
            if (st == DSTP_ERR_FORMAT) {
                dstp_error inner = *err;
                dstp_seterr(err, "%s: %s", cfg->corpus, inner.msg);
            }
            dstp_corpus_free(l->corpus);
            l->corpus = part;
        }
        if (st == DSTP_OK) st = begin_epoch(l, err); /* validates the settings and the corpus here */
        if (st == DSTP_OK) l->have_epoch = 1;
    } else if (st == DSTP_OK) {
        st = dstp_shard_read(l->shards[0], &l->shard, err);
        if (st == DSTP_OK) {
            l->seq = (int32_t)l->shard.seq;
            l->max_pred = (int32_t)l->shard.max_pred;
            if (cfg->num_shards == 1) st = begin_epoch(l, err), l->have_epoch = st == DSTP_OK;
            else {
                dstp_shard_free(&l->shard);
                l->shard.n = 0;
            }
        }
    }
    if (st == DSTP_OK) {
        l->tmp_mem = (int32_t *)calloc((size_t)(2 * l->seq + 2 * l->max_pred), sizeof(int32_t));
        l->nslots = cfg->depth + 1;
        l->slots = (dstp_batch *)calloc((size_t)l->nslots, sizeof *l->slots);
        if (!l->tmp_mem || !l->slots) st = DSTP_ERR_NOMEM;
        l->tmp.ids = l->tmp_mem;
        l->tmp.types = l->tmp_mem + l->seq;
        l->tmp.pos = l->tmp_mem + 2 * l->seq;
        l->tmp.labels = l->tmp_mem + 2 * l->seq + l->max_pred;
        for (i = 0; st == DSTP_OK && i < l->nslots; ++i) {
            dstp_batch *b = &l->slots[i];
            const size_t tokens = (size_t)cfg->batch * (size_t)l->seq;
            b->batch = cfg->batch;
            b->seq = l->seq;
            b->max_pred = l->max_pred;
            b->ids = (int32_t *)calloc(2 * tokens + 2 * (size_t)cfg->batch, sizeof(int32_t));
            b->rows = (int32_t *)calloc(2 * (size_t)cfg->batch * (size_t)l->max_pred, sizeof(int32_t));
            if (!b->ids || !b->rows) {
                st = DSTP_ERR_NOMEM;
                break;
            }
            b->types = b->ids + tokens;
            b->lengths = b->types + tokens;
            b->nsp = b->lengths + cfg->batch;
            b->labels = b->rows + (size_t)cfg->batch * l->max_pred;
        }
        if (st == DSTP_ERR_NOMEM) dstp_seterr(err, "loader: out of memory");
    }
    if (st == DSTP_OK) {
        l->free_slots = l->nslots;
        l->held = -1;
        if (pthread_create(&l->thread, NULL, producer, l) != 0) {
            dstp_seterr(err, "loader: cannot start the thread");
            st = DSTP_ERR_STATE;
        } else {
            l->started = 1;
        }
    }
    if (st != DSTP_OK) {
        dstp_loader_destroy(l);
        return st;
    }
    *out = l;
    return DSTP_OK;
}

dstp_status dstp_loader_next(dstp_loader *l, const dstp_batch **out, dstp_error *err) {
    dstp_status st = DSTP_OK;
    pthread_mutex_lock(&l->mu);
    if (l->held >= 0) { /* the caller is done with the previous batch */
        l->held = -1;
        ++l->free_slots;
        pthread_cond_broadcast(&l->cv);
    }
    while (l->ready == 0 && l->fail == DSTP_OK && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
    if (l->ready == 0) {
        st = l->fail != DSTP_OK ? l->fail : DSTP_ERR_STATE;
        if (err) *err = l->fail_err;
    } else {
        l->held = l->head;
        *out = &l->slots[l->head];
        l->head = (l->head + 1) % l->nslots;
        --l->ready;
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

const dstp_vocab *dstp_loader_vocab(const dstp_loader *l) { return l->vocab; }

size_t dstp_loader_units(const dstp_loader *l) {
    return l->corpus ? dstp_corpus_documents(l->corpus) : (size_t)l->norder;
}
