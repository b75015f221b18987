/*
 * The training side of dst-pretrain (C99, the library's public API): the loop around the model and
 * the engine, its output (progress lines, metrics as JSON lines, an SVG plot), held-out evaluation,
 * checkpoints with resume, Hugging Face import and export, and the commands that read a trained model
 * back (logits, export). docs/pretrain.md describes what a user sees.
 */
#ifndef DSTP_TRAIN_H
#define DSTP_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include <dstransformer/dstransformer.h>

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes of dst-pretrain (docs/pretrain.md). */
enum {
    DSTP_EXIT_OK = 0,
    DSTP_EXIT_FAILURE = 1,     /* a library call, a file or a checkpoint failed */
    DSTP_EXIT_USAGE = 2,       /* the command line */
    DSTP_EXIT_CONFIG = 3,      /* the model or the DeepSpeed configuration, or a resume that does not match it */
    DSTP_EXIT_DATA = 4,        /* the vocabulary, the corpus or the shards */
    DSTP_EXIT_BACKEND = 5,     /* the backend asked for is not available (no GPU) */
    DSTP_EXIT_COMM = 6,        /* data parallelism: NCCL failed, or no progress within --comm-timeout */
    DSTP_EXIT_INTERRUPTED = 130 /* SIGINT or SIGTERM: a checkpoint was saved first */
};

typedef struct dstp_train_options {
    const char *model_config;  /* Hugging Face config.json form */
    const char *ds_config;     /* DeepSpeed JSON of the engine */
    const char *vocab;
    const char *corpus;        /* raw text, or NULL with shards */
    const char **shards;
    size_t num_shards;
    int cased;
    int32_t seq, max_pred;
    int64_t steps;             /* optimizer steps to reach */
    double max_time;           /* seconds; 0: no limit */
    const char *output;        /* metrics, plot, checkpoints/, hf/ */
    int64_t save_every, eval_every, print_every; /* 0: at the end only / never / steps_per_print */
    int32_t eval_batches, holdout_every;
    int resume;
    const char *init_from;     /* Hugging Face safetensors */
    const char *export_hf;     /* NULL: <output>/hf for Post-LN models */
    int no_export;
    dst_backend backend;
    int threads;
    uint64_t seed;
    int32_t depth;
    int quiet;
    dstp_comm_kind comm;       /* data-parallel gradient averaging: auto (NCCL with CUDA), none or nccl */
    int profile;               /* the time split of each step (model.h, dstp_profile) into the metrics */
    int profile_calls;         /* with profile: also each library call of the model, synchronised */
    int no_checkpoint;         /* no checkpoints at all (benchmarks): not every N steps, at the end or on a signal */
    int layers;                /* dstp_layers (model.h): auto (0, default), padded or packed */
    double comm_timeout;       /* seconds without progress before a data-parallel rank gives up; 0: never */
    int no_overlap;            /* all-reduce the gradients after the backward instead of during it */
    int check_replicas;        /* compare a checksum of the weights over the ranks after every step */
    int eager_checks;          /* the model ops' index checks wait for the device (default: deferred) */
    int zero_grads;            /* the engine zeroes the gradients at each step (default: the first micro-batch
                                  of a step writes them) */
} dstp_train_options;

void dstp_train_options_default(dstp_train_options *o);
/* Runs the training; returns an exit code. */
int dstp_train(const dstp_train_options *o);

/* A trained model read back: from an engine checkpoint folder (its `latest`, or `tag`) or a Hugging Face
 * folder (config.json + model.safetensors). */
typedef struct dstp_source_options {
    const char *checkpoint;   /* save_dir of the engine checkpoints */
    const char *tag;          /* NULL: the one `latest` names */
    const char *hf;           /* a Hugging Face folder */
    dst_backend backend;
    int threads;
} dstp_source_options;

/* MLM logits of one sequence into `out` (raw little-endian float32 [len, V]). */
int dstp_logits(const dstp_source_options *src, const int32_t *ids, const int32_t *types, int32_t len,
                const char *out);
/* An engine checkpoint as a Hugging Face BertForMaskedLM folder. */
int dstp_export(const dstp_source_options *src, const char *out_dir, const char *vocab);

/* The SVG plot of a metrics file (metrics.jsonl): loss, MLM accuracy and learning rate over the steps. */
int dstp_plot(const char *metrics, const char *svg, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* DSTP_TRAIN_H */
