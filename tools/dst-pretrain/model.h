/*
 * The model side of dst-pretrain (C99, the library's public API only): BERT for pre-training as
 * bing_bert's BertForPreTrainingPreLN and Hugging Face's BertForPreTraining build it, assembled from
 * library calls — embeddings, LayerNorm, dropout, N library layers, the final LayerNorm of a Pre-LN
 * stack, the MLM head with its decoder tied to the word embeddings and its loss at the masked
 * positions only, and the optional next-sentence head. No kernels here: every op is a dst_* call, so
 * the model runs on whichever backend its context has.
 *
 * The configuration is a Hugging Face config.json (model_config.c); the weights of a trained model
 * export as a Hugging Face BertForMaskedLM checkpoint.
 */
#ifndef DSTP_MODEL_H
#define DSTP_MODEL_H

#include <stdio.h>

#include <dstransformer/dstransformer.h>
#include <jansson.h>

#include "pretrain_data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model configuration (model_config.c) --------------------------------------------------------- */
typedef struct dstp_model_config {
    int32_t vocab_size;              /* V; 0 = not given: the vocabulary's size rounded up to a multiple of 8 */
    int32_t hidden_size;             /* H */
    int32_t num_hidden_layers;       /* L */
    int32_t num_attention_heads;
    int32_t intermediate_size;       /* I */
    int32_t max_position_embeddings; /* P */
    int32_t type_vocab_size;         /* T */
    float hidden_dropout_prob;
    float attention_probs_dropout_prob;
    float layer_norm_eps;
    float initializer_range;
    int32_t pad_token_id;
    int gelu_tanh;                   /* hidden_act: 0 "gelu" (erf), 1 "gelu_new" / "gelu_pytorch_tanh" (tanh) */
    /* dst-pretrain's own keys */
    int pre_layer_norm;              /* 1: Pre-LN layers and a final LayerNorm (bing_bert); 0: Post-LN (BERT) */
    int next_sentence_prediction;    /* the NSP head (pooler + 2-way classifier) and its loss */
    int normalize_invertible, gelu_checkpoint, attn_dropout_checkpoint; /* the layer's memory switches */
} dstp_model_config;

/* Hugging Face BertConfig's defaults (BERT-base), Post-LN, NSP on, the switches off. */
void dstp_model_config_default(dstp_model_config *c);
/* Reads a config.json: every key checked (type, range), unknown keys refused with the closest known one,
 * the Hugging Face keys that do not change the model accepted. Messages name the file and the key (and
 * the line and column of malformed JSON). DSTP_ERR_FORMAT for malformed JSON, DSTP_ERR_ARG for a bad key
 * or value. */
dstp_status dstp_model_config_parse(const char *text, size_t len, const char *path, dstp_model_config *c,
                                    dstp_error *err);
dstp_status dstp_model_config_load(const char *path, dstp_model_config *c, dstp_error *err);
/* The same from a parsed JSON object (the copy stored in a checkpoint's client state). */
dstp_status dstp_model_config_from_json(const json_t *obj, const char *where, dstp_model_config *c,
                                        dstp_error *err);
/* Writes the configuration as a JSON object (Hugging Face's keys, then dst-pretrain's); `hf` adds
 * architectures/model_type/... for a BertForMaskedLM config.json. */
void dstp_model_config_write(FILE *f, const dstp_model_config *c, int hf);

/* ---- the model (model.c) ------------------------------------------------------------------------------ */
typedef struct dstp_model dstp_model;

/* How the layers run over a batch: on the padded [B, S] batch with key lengths, on its real tokens only
 * (dst_layer_forward_packed: the tokens gathered after the embeddings, scattered back before the heads),
 * or (auto, the default) packed when at most 90 % of the batch's B·S positions are real tokens. The
 * threshold is measured (bench/RESULTS.md, 2026-12-02, fourth session): on the H200 with BERT-Large,
 * packed is 5 % faster at S=512 with 79 % real tokens and 2 % slower at S=128 with 98 %. */
typedef enum dstp_layers { DSTP_LAYERS_AUTO = 0, DSTP_LAYERS_PADDED, DSTP_LAYERS_PACKED } dstp_layers;

typedef struct dstp_model_options {
    dst_dtype dtype;         /* parameters and activations: FP32, or FP16/BF16 as the engine's precision */
    int32_t max_batch;       /* sequences per micro-batch */
    int32_t seq;             /* sequence length S ≤ max_position_embeddings */
    int32_t max_pred;        /* masked positions per sequence at most */
    uint64_t seed;           /* initial weights (the layers' Philox seeds are seed·1000 + i) */
    dstp_layers layers;      /* how the layers run; the same model either way */
} dstp_model_options;

/* What one micro-batch gives: the mean losses of the call and the counts behind the accuracies. */
typedef struct dstp_result {
    double mlm_loss, nsp_loss;  /* means over the micro-batch's masked tokens / sequences */
    int64_t mlm_n, mlm_hits;    /* masked tokens, and those whose first largest logit is the label */
    int64_t nsp_n, nsp_hits;
    int64_t sequences, tokens;  /* sequences and real (unpadded) tokens */
} dstp_result;

/* The time split of training (`dst-pretrain train --profile`): each phase's host seconds, measured with a
 * dst_context_synchronize() at its end, so that the device work a phase enqueued is counted in it. The
 * synchronisations stop the host from running ahead of the device, which costs a little throughput. */
typedef enum dstp_phase {
    DSTP_PHASE_DATA = 0,    /* waiting for the loader thread, and the batch's copy into context memory */
    DSTP_PHASE_EMBED_HEAD,  /* embeddings (forward and backward), the final LayerNorm, the MLM and NSP heads
                               with their losses, and reading the losses back */
    DSTP_PHASE_LAYERS,      /* the transformer layers, forward and backward */
    DSTP_PHASE_COMM,        /* waiting for the data-parallel all-reduces */
    DSTP_PHASE_OPTIMIZER,   /* the engine's step (unscale, overflow check, clipping, optimizer, schedule) */
    DSTP_PHASE_OTHER,       /* the rest of the loop: progress lines, metrics, evaluation, checkpoints */
    DSTP_PHASE_COUNT
} dstp_phase;
/* One call site of a library function in the model (`--profile-calls`): its host seconds with a
 * synchronisation before and after the call, so that they are the device time of its work plus the
 * host time of the call itself, and how often it ran. */
typedef struct dstp_call_site {
    const char *call;  /* the call's source text */
    int line;          /* its line in model.c */
    long long count;
    double seconds;
} dstp_call_site;
enum { DSTP_PROFILE_SITES = 96 };
typedef struct dstp_profile {
    dst_context *ctx;                  /* synchronised at the end of each phase */
    double seconds[DSTP_PHASE_COUNT];  /* accumulated by dstp_profile_lap */
    double mark;                       /* the end of the last phase (monotonic clock, seconds) */
    int per_call;                      /* also time every library call of the model (set after _start) */
    int num_sites;                     /* sites[] in the order first seen (more than DSTP_PROFILE_SITES: not kept) */
    dstp_call_site sites[DSTP_PROFILE_SITES];
} dstp_profile;
/* Starts a profile on `ctx`: synchronises it, zeroes the phases and sets the mark to now. */
dstp_status dstp_profile_start(dstp_profile *p, dst_context *ctx, dstp_error *err);
/* Ends a phase: synchronises the context and adds the seconds since the mark to `phase`. No effect for NULL. */
dstp_status dstp_profile_lap(dstp_profile *p, dstp_phase phase, dstp_error *err);
/* The name of a phase in the metrics file ("data", "embeddings_head", "layers", "comm", "optimizer", "other"). */
const char *dstp_phase_name(dstp_phase phase);
/* Zeroes the call sites' times and counts (the sites stay). */
void dstp_profile_reset_calls(dstp_profile *p);
/* With per_call: the `top` costliest call sites, in ms per step over `steps` steps, to `f` (nothing for
 * steps <= 0). */
void dstp_profile_print_calls(const dstp_profile *p, long long steps, int top, FILE *f);

/* Creates the model in `ctx` with its initial weights (Hugging Face's rule: weights N(0, initializer_range),
 * the [PAD] row of the word embeddings zero, biases 0, LayerNorm γ 1 and β 0; the layers' own init). */
dstp_status dstp_model_create(dst_context *ctx, const dstp_model_config *cfg, const dstp_model_options *opt,
                              dstp_model **out, dstp_error *err);
void dstp_model_destroy(dstp_model *m);
const dstp_model_config *dstp_model_get_config(const dstp_model *m);
int64_t dstp_model_num_parameters(const dstp_model *m);

/* Every tensor of the model with its gradient: the program's (Hugging Face names), then the twelve of
 * layer i as "bert.encoder.layer.<i>.<DeepSpeed name>" (views into the layer's arenas). Writes at most
 * `cap` entries and returns the count. For tests and tools; the engine keeps its own list. */
typedef struct dstp_model_tensor {
    char name[96];
    dst_tensor param, grad;  /* in the context's memory */
} dstp_model_tensor;
int dstp_model_tensors(const dstp_model *m, dstp_model_tensor *out, int cap);
/* Sets every gradient to zero (the engine does it at each step; callers without an engine use this). */
dstp_status dstp_model_zero_grads(dstp_model *m, dstp_error *err);

/* Registers every trained tensor with the engine's optimizer in bing_bert's two groups: group 0 (the
 * configuration's weight decay) for the weight matrices and embedding tables, group 1 (no decay) for the
 * biases and LayerNorm parameters. */
dstp_status dstp_model_register(dstp_model *m, dst_engine *engine, dstp_error *err);

/* Told by dstp_model_train when a bucket of gradients is final, right after its last backward op was
 * enqueued on the context's stream, in backward order: the heads' (MLM transform, decoder bias, pooler and
 * NSP classifier), the final LayerNorm's (Pre-LN), each layer's gradient arena as one tensor (layer L−1
 * first), then the embeddings' with the tied word table (its decoder part came first). Every gradient of
 * the model is in exactly one bucket. The data-parallel all-reduce starts there, overlapping the backward
 * of the earlier layers. */
typedef dstp_status (*dstp_grads_ready_fn)(void *user, const dst_tensor *grads, int n, dstp_error *err);
typedef struct dstp_grad_hook {
    dstp_grads_ready_fn ready;
    void *user;
} dstp_grad_hook;

/* Profiling of dstp_model_train (NULL: off, the default): the batch's copy counts as DSTP_PHASE_DATA, the
 * layers as DSTP_PHASE_LAYERS and everything else as DSTP_PHASE_EMBED_HEAD. The profile stays the caller's. */
void dstp_model_set_profile(dstp_model *m, dstp_profile *p);
/* One training micro-batch: forward with dropout, the MLM (and NSP) loss, and backward accumulating every
 * gradient, or, with `write`, writing every gradient (the first micro-batch of a step when nothing zeroed
 * them: the same values as zeroing, then accumulating); the loss gradients are multiplied by grad_scale
 * (loss scale / accumulation steps). `hook` (NULL: none) hears of each bucket of final gradients; pass it
 * on the last micro-batch of a step. */
dstp_status dstp_model_train(dstp_model *m, const dstp_batch *b, float grad_scale, int write,
                             const dstp_grad_hook *hook, dstp_result *r, dstp_error *err);
/* The same forward in inference mode (no dropout, no RNG taken, nothing saved), losses only. */
dstp_status dstp_model_evaluate(dstp_model *m, const dstp_batch *b, dstp_result *r, dstp_error *err);
/* MLM logits [len, V] (fp32, host memory) of one sequence in inference mode. */
dstp_status dstp_model_logits(dstp_model *m, const int32_t *ids, const int32_t *types, int32_t len, float *logits,
                              dstp_error *err);

/* Hugging Face BERT weights (BertForPreTraining, BertForMaskedLM or BertModel names, fp32/fp16/bf16) into a
 * Post-LN model: the layers and embeddings must be there, the heads are taken when present. *heads_found
 * receives how many of the head tensors were found. */
dstp_status dstp_model_import_hf(dstp_model *m, const char *path, int *heads_found, int *heads_total, dstp_error *err);
/* The model as a Hugging Face BertForMaskedLM: dir/model.safetensors and dir/config.json (and vocab.txt when
 * `vocab` is given). Post-LN models only. */
dstp_status dstp_model_export_hf(dstp_model *m, const char *dir, const char *vocab, dstp_error *err);
/* Weights from an engine checkpoint file (mp_rank_00_model_states.safetensors), without an engine. */
dstp_status dstp_model_load_engine_weights(dstp_model *m, const char *path, dstp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* DSTP_MODEL_H */
