/*
 * The data side of dst-pretrain (C99): a BERT-compatible WordPiece tokenizer, sentence-pair examples
 * with BERT's masking rule from raw text, NVIDIA's pre-processed HDF5 shards, and a loader thread
 * that prepares the next batches while the caller trains. Nothing here uses the library: these are
 * the program's own parts (docs/pretrain-data.md).
 *
 * Errors: every fallible function returns a dstp_status and, on failure, writes a message naming the
 * file, the position or the field into a dstp_error; nothing is printed and nothing exits.
 * Determinism: every random choice comes from a dstp_rng seeded by the caller (splitmix64), so the
 * same seed gives the same examples, masks and batch order on every machine.
 */
#ifndef DSTP_PRETRAIN_DATA_H
#define DSTP_PRETRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, errors, random numbers, id arrays ------------------------------------------------- */
typedef enum dstp_status {
    DSTP_OK = 0,
    DSTP_ERR_ARG = 1,     /* a bad argument or configuration */
    DSTP_ERR_IO = 2,      /* a file could not be opened or read */
    DSTP_ERR_FORMAT = 3,  /* malformed data: not UTF-8, not an HDF5 shard, missing or inconsistent fields */
    DSTP_ERR_NOMEM = 4,   /* out of memory */
    DSTP_ERR_STATE = 5,   /* the loader stopped (after an error of its thread, or being destroyed) */
    DSTP_ERR_UNSUPPORTED = 6 /* HDF5 shards in a build without libhdf5 */
} dstp_status;

typedef struct dstp_error {
    char msg[512];
} dstp_error;

/* Seconds on the monotonic clock (for durations only). */
double dstp_mono_s(void);

/* splitmix64 (Steele, Lea, Flood 2014): state += 0x9E3779B97F4A7C15, then a fixed mix of the state. */
typedef struct dstp_rng {
    uint64_t state;
} dstp_rng;
void dstp_rng_seed(dstp_rng *r, uint64_t seed, uint64_t stream);
uint64_t dstp_rng_next(dstp_rng *r);
double dstp_rng_uniform(dstp_rng *r);               /* [0, 1), 53 random bits */
uint64_t dstp_rng_below(dstp_rng *r, uint64_t n);   /* uniform in [0, n), n ≥ 1, no modulo bias */

typedef struct dstp_ids {
    int32_t *v;
    size_t n, cap;
} dstp_ids;
dstp_status dstp_ids_push(dstp_ids *a, int32_t v);
void dstp_ids_free(dstp_ids *a);

/* ---- vocabulary and tokenizer ---------------------------------------------------------------------- */
typedef struct dstp_vocab dstp_vocab;
/* Reads vocab.txt: one token per line (the line without its '\n'; id = line number from 0; a repeated
 * token keeps its last id, as Hugging Face's loader does). The file must be UTF-8. */
dstp_status dstp_vocab_load(const char *path, dstp_vocab **out, dstp_error *err);
void dstp_vocab_free(dstp_vocab *v);
int32_t dstp_vocab_size(const dstp_vocab *v);
int32_t dstp_vocab_find(const dstp_vocab *v, const char *token, size_t len); /* -1 when absent */
const char *dstp_vocab_token(const dstp_vocab *v, int32_t id);

/* Ids of the special tokens; [PAD], [UNK], [CLS], [SEP] and [MASK] must all be in the vocabulary. */
typedef struct dstp_special {
    int32_t pad, unk, cls, sep, mask;
} dstp_special;
dstp_status dstp_vocab_special(const dstp_vocab *v, dstp_special *out, dstp_error *err);

typedef struct dstp_tokenizer {
    const dstp_vocab *vocab;
    int lower_case;          /* 1: BERT uncased (lower-case, strip accents); 0: cased */
    int max_chars_per_word;  /* longer words become [UNK]; 100 in BERT */
} dstp_tokenizer;
/* Appends the WordPiece ids of UTF-8 `text` to `out`. BERT's rules: drop NUL, U+FFFD and control
 * characters, whitespace → space, CJK characters split off, NFC, then per word lower-case + NFD + drop
 * combining marks (Mn) when lower_case, split punctuation, greedy longest-match-first WordPiece with
 * "##" continuations, [UNK] for a word with an unmatched rest or over max_chars_per_word characters.
 * Invalid UTF-8 is DSTP_ERR_FORMAT naming the byte offset. */
dstp_status dstp_tokenize(const dstp_tokenizer *t, const char *text, size_t len, dstp_ids *out, dstp_error *err);

/* ---- masking (deepspeed_engine.md §7.4) -------------------------------------------------------------- */
/* How many of `len` tokens are predicted: min(max_pred, max(1, round(len · 0.15))), round half to even. */
int32_t dstp_mask_count(int32_t len, int32_t max_pred);
/* Masks ids[0..len) in place: candidates are all positions whose id is neither [CLS] nor [SEP],
 * shuffled; the first dstp_mask_count() of them are chosen; each becomes [MASK] with probability 0.8,
 * else stays (0.5) or becomes a uniformly random id of [0, vocab_size) (0.5). positions/labels
 * (capacity max_pred) receive the chosen positions in increasing order and their original ids;
 * returns their number. */
int32_t dstp_mask(int32_t *ids, int32_t len, int32_t max_pred, int32_t vocab_size, const dstp_special *sp,
                  dstp_rng *rng, int32_t *positions, int32_t *labels);

/* ---- raw text → sentence-pair examples ---------------------------------------------------------------- */
typedef struct dstp_corpus dstp_corpus;
/* Reads and tokenizes a text corpus: documents are separated by blank lines; each line is split into
 * sentences after '.', '!' or '?' followed by a space. Empty corpus (no tokens) is DSTP_ERR_FORMAT. */
dstp_status dstp_corpus_load(const char *path, const dstp_tokenizer *tok, dstp_corpus **out, dstp_error *err);
void dstp_corpus_free(dstp_corpus *c);
/* The documents d of `c` with (d % every == every − 1) == heldout, as a corpus of their own: every = 20
 * holds out one document in twenty (heldout = 1 gives those, 0 the others). DSTP_ERR_FORMAT when the part
 * is empty. */
dstp_status dstp_corpus_split(const dstp_corpus *c, int32_t every, int heldout, dstp_corpus **out, dstp_error *err);
size_t dstp_corpus_documents(const dstp_corpus *c);
size_t dstp_corpus_tokens(const dstp_corpus *c);

/* One training example: [CLS] A [SEP] B [SEP], padded to the sequence length. */
typedef struct dstp_example {
    int32_t len;             /* unpadded length */
    int32_t npred;           /* masked positions */
    int32_t nsp;             /* 0: B follows A, 1: B is random */
    int32_t *ids, *types;    /* [seq] */
    int32_t *pos, *labels;   /* [max_pred] */
} dstp_example;

/* The examples of one epoch, built from every document in order (chunks of sentences up to
 * seq − 3 tokens, split at a random sentence into A and B; B is a random other document's text with
 * probability 0.5 or when the chunk has one sentence; the longer of A and B loses a token from a
 * random end until the pair fits), masked, then shuffled. Deterministic from (seed, epoch). */
typedef struct dstp_epoch {
    int32_t seq, max_pred;
    size_t count;
    dstp_example *ex;
    int32_t *storage;
} dstp_epoch;
dstp_status dstp_epoch_build(const dstp_corpus *c, const dstp_special *sp, int32_t vocab_size, int32_t seq,
                             int32_t max_pred, uint64_t seed, uint64_t epoch, dstp_epoch *out, dstp_error *err);
void dstp_epoch_free(dstp_epoch *e);

/* ---- NVIDIA HDF5 shards (deepspeed_engine.md §7.5) ------------------------------------------------------- */
typedef struct dstp_shard {
    int64_t n, seq, max_pred;
    int32_t *input_ids;      /* [n, seq] */
    int8_t *input_mask;      /* [n, seq] */
    int8_t *segment_ids;     /* [n, seq] */
    int32_t *mlm_positions;  /* [n, max_pred] */
    int32_t *mlm_ids;        /* [n, max_pred] */
    int8_t *nsp;             /* [n] */
} dstp_shard;
/* Reads the six datasets of a shard (input_ids, input_mask, segment_ids, masked_lm_positions,
 * masked_lm_ids, next_sentence_labels), converting to the types above; checks that they exist, their
 * ranks and that their shapes agree. */
dstp_status dstp_shard_read(const char *path, dstp_shard *out, dstp_error *err);
void dstp_shard_free(dstp_shard *s);
/* Example i of a shard: the length from input_mask (a prefix of ones), the masked positions up to the
 * first 0 (position 0 is [CLS], never masked) or max_pred, labels = masked_lm_ids; checks ids against
 * vocab_size (when > 0), positions against the length. ex's arrays have seq and max_pred entries. */
dstp_status dstp_shard_example(const dstp_shard *s, int64_t i, int32_t vocab_size, dstp_example *ex,
                               dstp_error *err);

/* ---- batches and the loader thread ------------------------------------------------------------------------ */
/* A batch as the model ops take it: ids/types [batch, seq] (padding [PAD], type 0), key lengths
 * [batch], the masked tokens as rows b·seq + s of the [batch·seq] tokens with their labels (ascending),
 * and the next-sentence labels. */
typedef struct dstp_batch {
    int32_t batch, seq, max_pred;
    int32_t *ids, *types, *lengths, *nsp;
    int32_t nrows;
    int32_t *rows, *labels;  /* [batch·max_pred] capacity, nrows used */
    uint64_t index;          /* position in the stream of batches, from 0 (the data position of a resume) */
    uint64_t epoch;
} dstp_batch;

typedef struct dstp_loader_config {
    const char *corpus;       /* raw text corpus, or NULL */
    const char *const *shards;/* HDF5 shard files (sorted by the loader), or NULL */
    size_t num_shards;
    const char *vocab;        /* vocab.txt (required) */
    int lower_case;
    int32_t batch, seq, max_pred;
    uint64_t seed;
    uint64_t start_batch;     /* skip this many batches first (resume) */
    int32_t depth;            /* batches prepared ahead, ≥ 1 */
    int32_t holdout_every;    /* 0: all the data; k ≥ 2: one document (text) or sample (HDF5) in k is held out */
    int heldout;              /* with holdout_every: 0 the training part, 1 the held-out part */
} dstp_loader_config;

typedef struct dstp_loader dstp_loader;
/* Starts the loader thread; the corpus or the first shard is read before it returns, so bad data is
 * reported here. With holdout_every, documents (text) or samples (HDF5, by index in each shard) d with
 * d % holdout_every == holdout_every − 1 form the held-out part and the others the training part. */
dstp_status dstp_loader_create(const dstp_loader_config *cfg, dstp_loader **out, dstp_error *err);
/* The next batch, waiting for the thread when it is not ready. The batch stays valid until the next
 * call; the stream is endless (epoch after epoch). DSTP_ERR_* with the thread's message when it failed. */
dstp_status dstp_loader_next(dstp_loader *l, const dstp_batch **out, dstp_error *err);
/* Stops the thread (also while it waits for a free slot) and frees everything; NULL is allowed. */
void dstp_loader_destroy(dstp_loader *l);
const dstp_vocab *dstp_loader_vocab(const dstp_loader *l);
/* Documents (text) or samples of the first shard (HDF5) of the loader's part of the data. */
size_t dstp_loader_units(const dstp_loader *l);

#ifdef __cplusplus
}
#endif

#endif /* DSTP_PRETRAIN_DATA_H */
