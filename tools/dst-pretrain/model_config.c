/*
 * The model configuration: a Hugging Face config.json (BertConfig's keys) plus dst-pretrain's own keys,
 * checked key by key. Messages name the file and the key. The JSON text is read by jansson (strict
 * RFC 8259, duplicate keys refused); a malformed file's message gives jansson's line and column.
 */
#include <stdlib.h>
#include <string.h>

#include "model.h"

void dstp_seterr(dstp_error *err, const char *fmt, ...);
dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err);

void dstp_model_config_default(dstp_model_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 0;
    c->hidden_size = 768;
    c->num_hidden_layers = 12;
    c->num_attention_heads = 12;
    c->intermediate_size = 3072;
    c->max_position_embeddings = 512;
    c->type_vocab_size = 2;
    c->hidden_dropout_prob = 0.1f;
    c->attention_probs_dropout_prob = 0.1f;
    c->layer_norm_eps = 1e-12f;
    c->initializer_range = 0.02f;
    c->pad_token_id = 0;
    c->gelu_tanh = 0;
    c->pre_layer_norm = 0;
    c->next_sentence_prediction = 1;
}

/* Keys that change the model (read below) and Hugging Face keys accepted without effect on it. */
static const char *const kUsed[] = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "layer_norm_eps", "initializer_range", "pad_token_id", "hidden_act", "pre_layer_norm",
    "next_sentence_prediction", "normalize_invertible", "gelu_checkpoint", "attn_dropout_checkpoint",
    /* checked for the value this model has */
    "model_type", "position_embedding_type", "is_decoder", "add_cross_attention", "tie_word_embeddings"};
static const char *const kIgnored[] = {
    "architectures", "torch_dtype", "transformers_version", "use_cache", "classifier_dropout",
    "gradient_checkpointing", "bos_token_id", "eos_token_id", "sep_token_id", "id2label", "label2id",
    "output_attentions", "output_hidden_states", "return_dict", "problem_type", "finetuning_task",
    "directionality", "chunk_size_feed_forward", "pruned_heads", "torchscript", "_name_or_path",
    "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head",
    "pooler_type", "output_past", "num_labels", "layer_norm_type", "prefix", "task_specific_params"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), i, j, row[64], prev, tmp;
    if (la >= 63 || lb >= 63) return 99;
    for (j = 0; j <= lb; ++j) row[j] = j;
    for (i = 1; i <= la; ++i) {
        prev = row[0];
        row[0] = i;
        for (j = 1; j <= lb; ++j) {
            const size_t sub = prev + (a[i - 1] != b[j - 1]);
            tmp = row[j];
            row[j] = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
            if (sub < row[j]) row[j] = sub;
            prev = tmp;
        }
    }
    return row[lb];
}

static const char *closest(const char *key) {
    const char *best = NULL;
    size_t d = 99, k;
    for (k = 0; k < COUNT(kUsed); ++k) {
        const size_t e = edit_distance(key, kUsed[k]);
        if (e < d) d = e, best = kUsed[k];
    }
    for (k = 0; k < COUNT(kIgnored); ++k) {
        const size_t e = edit_distance(key, kIgnored[k]);
        if (e < d) d = e, best = kIgnored[k];
    }
    return d <= 3 && d < strlen(key) ? best : NULL;
}

static const char *describe(const json_t *v, char *buf, size_t n) {
    if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, n, "%.9g", json_real_value(v));
    else if (json_is_string(v)) snprintf(buf, n, "\"%.60s\"", json_string_value(v));
    else if (json_is_true(v)) snprintf(buf, n, "true");
    else if (json_is_false(v)) snprintf(buf, n, "false");
    else snprintf(buf, n, "%s", json_is_array(v) ? "an array" : json_is_object(v) ? "an object" : "null");
    return buf;
}

typedef struct ctx {
    const json_t *obj;
    const char *where;
    dstp_error *err;
} ctx;

static dstp_status bad(const ctx *c, const char *key, const json_t *v, const char *expect) {
    char got[96];
    dstp_seterr(c->err, "%s: key \"%s\": expected %s, got %s", c->where, key, expect, describe(v, got, sizeof got));
    return DSTP_ERR_ARG;
}

/* An integer in [lo, hi]; absent or null keeps *out. */
static dstp_status get_int(const ctx *c, const char *key, int64_t lo, int64_t hi, int32_t *out) {
    const json_t *v = json_object_get(c->obj, key);
    char expect[96];
    if (!v || json_is_null(v)) return DSTP_OK;
    snprintf(expect, sizeof expect, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) return bad(c, key, v, expect);
    *out = (int32_t)json_integer_value(v);
    return DSTP_OK;
}

/* A finite number in [lo, hi) (hi_open) or [lo, hi]; lo_open excludes lo. */
static dstp_status get_float(const ctx *c, const char *key, double lo, int lo_open, double hi, int hi_open,
                             float *out) {
    const json_t *v = json_object_get(c->obj, key);
    const double x = json_number_value(v);
    char expect[96];
    if (!v || json_is_null(v)) return DSTP_OK;
    snprintf(expect, sizeof expect, "a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    if (!json_is_number(v) || (lo_open ? !(x > lo) : !(x >= lo)) || (hi_open ? !(x < hi) : !(x <= hi)))
        return bad(c, key, v, expect);
    *out = (float)x;
    return DSTP_OK;
}

static dstp_status get_bool(const ctx *c, const char *key, int *out) {
    const json_t *v = json_object_get(c->obj, key);
    if (!v || json_is_null(v)) return DSTP_OK;
    if (!json_is_boolean(v)) return bad(c, key, v, "true or false");
    *out = json_is_true(v);
    return DSTP_OK;
}

/* A key that must have one value (or be absent), e.g. position_embedding_type "absolute". */
static dstp_status must_be_string(const ctx *c, const char *key, const char *value, const char *why) {
    const json_t *v = json_object_get(c->obj, key);
    char expect[160];
    if (!v || json_is_null(v)) return DSTP_OK;
    snprintf(expect, sizeof expect, "\"%s\" (%s)", value, why);
    if (!json_is_string(v) || strcmp(json_string_value(v), value) != 0) return bad(c, key, v, expect);
    return DSTP_OK;
}

static dstp_status must_be_bool(const ctx *c, const char *key, int value, const char *why) {
    int b = value;
    char expect[160];
    const json_t *v = json_object_get(c->obj, key);
    dstp_status st = get_bool(c, key, &b);
    if (st != DSTP_OK) return st;
    snprintf(expect, sizeof expect, "%s (%s)", value ? "true" : "false", why);
    if (b != value) return bad(c, key, v, expect);
    return DSTP_OK;
}

#define TRY(x)                          \
    do {                                \
        dstp_status st_ = (x);          \
        if (st_ != DSTP_OK) return st_; \
    } while (0)

dstp_status dstp_model_config_from_json(const json_t *obj, const char *where, dstp_model_config *out,
                                        dstp_error *err) {
    dstp_model_config c;
    ctx x;
    size_t j;
    const char *key;
    const json_t *act, *value;
    if (!json_is_object(obj)) {
        dstp_seterr(err, "%s: the model configuration must be a JSON object", where);
        return DSTP_ERR_ARG;
    }
    x.obj = obj;
    x.where = where;
    x.err = err;
    json_object_foreach((json_t *)obj, key, value) {
        int known = 0;
        (void)value;
        for (j = 0; j < COUNT(kUsed) && !known; ++j) known = strcmp(key, kUsed[j]) == 0;
        for (j = 0; j < COUNT(kIgnored) && !known; ++j) known = strcmp(key, kIgnored[j]) == 0;
        if (!known) {
            const char *near = closest(key);
            dstp_seterr(err, "%s: unknown key \"%s\"%s%s%s", where, key, near ? " (did you mean \"" : "",
                        near ? near : "", near ? "\"?)" : "");
            return DSTP_ERR_ARG;
        }
    }
    dstp_model_config_default(&c);
    TRY(get_int(&x, "vocab_size", 1, 1 << 24, &c.vocab_size));
    TRY(get_int(&x, "hidden_size", 1, 1 << 16, &c.hidden_size));
    TRY(get_int(&x, "num_hidden_layers", 1, 1000, &c.num_hidden_layers));
    TRY(get_int(&x, "num_attention_heads", 1, 1 << 12, &c.num_attention_heads));
    TRY(get_int(&x, "intermediate_size", 1, 1 << 18, &c.intermediate_size));
    TRY(get_int(&x, "max_position_embeddings", 1, 1 << 16, &c.max_position_embeddings));
    TRY(get_int(&x, "type_vocab_size", 1, 65535, &c.type_vocab_size));
    TRY(get_int(&x, "pad_token_id", 0, 1 << 24, &c.pad_token_id));
    TRY(get_float(&x, "hidden_dropout_prob", 0.0, 0, 1.0, 1, &c.hidden_dropout_prob));
    TRY(get_float(&x, "attention_probs_dropout_prob", 0.0, 0, 1.0, 1, &c.attention_probs_dropout_prob));
    TRY(get_float(&x, "layer_norm_eps", 0.0, 1, 1.0, 0, &c.layer_norm_eps));
    TRY(get_float(&x, "initializer_range", 0.0, 1, 10.0, 0, &c.initializer_range));
    TRY(get_bool(&x, "pre_layer_norm", &c.pre_layer_norm));
    TRY(get_bool(&x, "next_sentence_prediction", &c.next_sentence_prediction));
    TRY(get_bool(&x, "normalize_invertible", &c.normalize_invertible));
    TRY(get_bool(&x, "gelu_checkpoint", &c.gelu_checkpoint));
    TRY(get_bool(&x, "attn_dropout_checkpoint", &c.attn_dropout_checkpoint));
    act = json_object_get(obj, "hidden_act");
    if (act && !json_is_null(act)) {
        const char *a = json_is_string(act) ? json_string_value(act) : "";
        if (strcmp(a, "gelu") == 0) c.gelu_tanh = 0;
        else if (strcmp(a, "gelu_new") == 0 || strcmp(a, "gelu_pytorch_tanh") == 0)
            c.gelu_tanh = 1;
        else
            return bad(&x, "hidden_act", act, "\"gelu\" (erf) or \"gelu_new\" / \"gelu_pytorch_tanh\" (tanh)");
    }
    TRY(must_be_string(&x, "model_type", "bert", "this is a BERT model"));
    TRY(must_be_string(&x, "position_embedding_type", "absolute", "learned absolute positions"));
    TRY(must_be_bool(&x, "is_decoder", 0, "an encoder"));
    TRY(must_be_bool(&x, "add_cross_attention", 0, "no cross-attention"));
    TRY(must_be_bool(&x, "tie_word_embeddings", 1, "the MLM decoder is the word embedding table"));
    if (c.hidden_size % c.num_attention_heads != 0) {
        dstp_seterr(err, "%s: key \"hidden_size\" (%d) must be a multiple of \"num_attention_heads\" (%d)", where,
                    (int)c.hidden_size, (int)c.num_attention_heads);
        return DSTP_ERR_ARG;
    }
    if (c.vocab_size && c.pad_token_id >= c.vocab_size) {
        dstp_seterr(err, "%s: key \"pad_token_id\" (%d) must be below \"vocab_size\" (%d)", where,
                    (int)c.pad_token_id, (int)c.vocab_size);
        return DSTP_ERR_ARG;
    }
    *out = c;
    return DSTP_OK;
}

dstp_status dstp_model_config_parse(const char *text, size_t len, const char *path, dstp_model_config *c,
                                    dstp_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    dstp_status st;
    if (!root) {
        dstp_seterr(err, "%s: line %d, column %d: %s", path, jerr.line, jerr.column, jerr.text);
        return DSTP_ERR_FORMAT;
    }
    st = dstp_model_config_from_json(root, path, c, err);
    json_decref(root);
    return st;
}

dstp_status dstp_model_config_load(const char *path, dstp_model_config *c, dstp_error *err) {
    char *text = NULL;
    size_t len = 0;
    dstp_status st = dstp_read_file(path, &text, &len, err);
    if (st != DSTP_OK) return st;
    st = dstp_model_config_parse(text, len, path, c, err);
    free(text);
    return st;
}

void dstp_model_config_write(FILE *f, const dstp_model_config *c, int hf) {
    fprintf(f, "{\n");
    if (hf) fprintf(f, "  \"architectures\": [\"BertForMaskedLM\"],\n  \"model_type\": \"bert\",\n");
    if (c->vocab_size) fprintf(f, "  \"vocab_size\": %d,\n", (int)c->vocab_size); /* 0: from the vocabulary */
    fprintf(f, "  \"hidden_size\": %d,\n", (int)c->hidden_size);
    fprintf(f, "  \"num_hidden_layers\": %d,\n", (int)c->num_hidden_layers);
    fprintf(f, "  \"num_attention_heads\": %d,\n", (int)c->num_attention_heads);
    fprintf(f, "  \"intermediate_size\": %d,\n", (int)c->intermediate_size);
    fprintf(f, "  \"hidden_act\": \"%s\",\n", c->gelu_tanh ? "gelu_new" : "gelu");
    fprintf(f, "  \"hidden_dropout_prob\": %.9g,\n", (double)c->hidden_dropout_prob);
    fprintf(f, "  \"attention_probs_dropout_prob\": %.9g,\n", (double)c->attention_probs_dropout_prob);
    fprintf(f, "  \"max_position_embeddings\": %d,\n", (int)c->max_position_embeddings);
    fprintf(f, "  \"type_vocab_size\": %d,\n", (int)c->type_vocab_size);
    fprintf(f, "  \"initializer_range\": %.9g,\n", (double)c->initializer_range);
    fprintf(f, "  \"layer_norm_eps\": %.9g,\n", (double)c->layer_norm_eps);
    fprintf(f, "  \"pad_token_id\": %d,\n", (int)c->pad_token_id);
    fprintf(f, "  \"position_embedding_type\": \"absolute\",\n");
    if (hf) fprintf(f, "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\",\n");
    fprintf(f, "  \"pre_layer_norm\": %s,\n", c->pre_layer_norm ? "true" : "false");
    fprintf(f, "  \"next_sentence_prediction\": %s,\n", c->next_sentence_prediction ? "true" : "false");
    fprintf(f, "  \"normalize_invertible\": %s,\n", c->normalize_invertible ? "true" : "false");
    fprintf(f, "  \"gelu_checkpoint\": %s,\n", c->gelu_checkpoint ? "true" : "false");
    fprintf(f, "  \"attn_dropout_checkpoint\": %s\n", c->attn_dropout_checkpoint ? "true" : "false");
    fprintf(f, "}\n");
}
