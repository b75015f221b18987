// dst-pretrain's model and its configuration (tools/dst-pretrain/model.c, model_config.c) on the CPU
// backend: every gradient of the whole BERT-for-pre-training model (embeddings, dropout-free layers,
// final LN, MLM head tied to the word table, NSP head) against central finite differences in FP64,
// Pre-LN and Post-LN; micro-batch gradients add up; model configurations, good and bad (the message
// names the key; malformed JSON gives the line).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "model.h"
}

namespace {

struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    int32_t below(int32_t n) { return static_cast<int32_t>(next() % static_cast<uint64_t>(n)); }
};

// A batch of B sequences of S tokens with the given lengths, masked rows and labels.
struct Batch {
    std::vector<int32_t> ids, types, lengths, nsp, rows, labels;
    dstp_batch b{};
    Batch(int32_t B, int32_t S, int32_t V, const std::vector<int32_t> &lens, uint64_t seed) {
        Rng r{seed};
        ids.assign(static_cast<size_t>(B * S), 0);
        types.assign(static_cast<size_t>(B * S), 0);
        lengths = lens;
        for (int32_t i = 0; i < B; ++i) {
            nsp.push_back(i % 2);
            for (int32_t s = 0; s < lens[i]; ++s) {
                ids[i * S + s] = 5 + r.below(V - 5);
                types[i * S + s] = s >= lens[i] / 2;
            }
            for (int32_t s = 1; s < lens[i]; s += 2) {  // every other real position, never [CLS]
                rows.push_back(i * S + s);
                labels.push_back(r.below(V));
            }
        }
        b.batch = B;
        b.seq = S;
        b.max_pred = S;
        b.ids = ids.data();
        b.types = types.data();
        b.lengths = lengths.data();
        b.nsp = nsp.data();
        b.nrows = static_cast<int32_t>(rows.size());
        b.rows = rows.data();
        b.labels = labels.data();
    }
};

struct Model {
    dst_context *ctx = nullptr;
    dstp_model *m = nullptr;
    ~Model() {
        dstp_model_destroy(m);
        dst_context_destroy(ctx);
    }
};

dstp_model_config tiny_config(bool pre_ln) {
    dstp_model_config c;
    dstp_model_config_default(&c);
    c.vocab_size = 37;
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.intermediate_size = 24;
    c.max_position_embeddings = 12;
    c.type_vocab_size = 2;
    c.hidden_dropout_prob = 0.0f;
    c.attention_probs_dropout_prob = 0.0f;
    c.layer_norm_eps = 1e-5f;
    c.initializer_range = 0.3f;  // large enough that the heads' gradients are far from zero
    c.pre_layer_norm = pre_ln;
    c.next_sentence_prediction = 1;
    return c;
}

void make_model(Model &x, const dstp_model_config &c, dst_dtype dt, int32_t B, int32_t S) {
    ASSERT_EQ(dst_context_create(DST_BACKEND_CPU, 0, &x.ctx), DST_OK) << dst_last_error();
    dstp_model_options o;
    std::memset(&o, 0, sizeof o);
    o.dtype = dt;
    o.max_batch = B;
    o.seq = S;
    o.max_pred = S;
    o.seed = 11;
    dstp_error err;
    ASSERT_EQ(dstp_model_create(x.ctx, &c, &o, &x.m, &err), DSTP_OK) << err.msg;
}

// Every gradient of the model's n tensors, in order, as T (the model's dtype; host memory: CPU backend).
template <typename T>
std::vector<T> all_grads(const std::vector<dstp_model_tensor> &ts, int n) {
    std::vector<T> v;
    for (int t = 0; t < n; ++t) {
        int64_t count = 1;
        for (int d = 0; d < ts[t].grad.ndim; ++d) count *= ts[t].grad.shape[d];
        const T *g = static_cast<const T *>(ts[t].grad.data);
        v.insert(v.end(), g, g + count);
    }
    return v;
}

double loss_of(dstp_model *m, const dstp_batch &b) {
    dstp_result r;
    dstp_error err;
    EXPECT_EQ(dstp_model_evaluate(m, &b, &r, &err), DSTP_OK) << err.msg;
    return r.mlm_loss + r.nsp_loss;
}

class PretrainModelGrad : public ::testing::TestWithParam<bool> {};

// Every gradient the model computes (its own tensors and the layers') against central differences of the
// loss (MLM + NSP) in FP64: up to 5 elements of each of the 16 + 24 tensors.
TEST_P(PretrainModelGrad, EveryTensorMatchesFiniteDifferences) {
    const bool pre_ln = GetParam();
    Model x;
    make_model(x, tiny_config(pre_ln), DST_DTYPE_FP64, 3, 10);
    ASSERT_NE(x.m, nullptr);
    Batch batch(3, 10, 37, {10, 6, 3}, 7);
    dstp_error err;
    dstp_result r;
    ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK) << err.msg;
    ASSERT_EQ(dstp_model_train(x.m, &batch.b, 1.0f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
    EXPECT_EQ(r.mlm_n, static_cast<int64_t>(batch.rows.size()));
    EXPECT_EQ(r.nsp_n, 3);
    EXPECT_NEAR(r.mlm_loss + r.nsp_loss, loss_of(x.m, batch.b), 1e-12) << "training and evaluation forwards differ";
    std::vector<dstp_model_tensor> ts(64);
    const int n = dstp_model_tensors(x.m, ts.data(), 64);
    ASSERT_EQ(n, (pre_ln ? 16 : 14) + 24);
    Rng pick{3};
    const double h = 1e-6;
    int checked = 0;
    for (int t = 0; t < n; ++t) {
        double *p = static_cast<double *>(ts[t].param.data);
        const double *g = static_cast<const double *>(ts[t].grad.data);
        int64_t count = 1;
        for (int d = 0; d < ts[t].param.ndim; ++d) count *= ts[t].param.shape[d];
        double gmax = 0;
        for (int64_t i = 0; i < count; ++i) gmax = std::fmax(gmax, std::fabs(g[i]));
        for (int k = 0; k < 5; ++k) {
            // Half the picks at the largest gradients' scale: a random element may be one no token uses.
            int64_t i = static_cast<int64_t>(pick.next() % static_cast<uint64_t>(count));
            if (k % 2 == 0)
                for (int64_t j = 0; j < count; ++j)
                    if (std::fabs(g[(i + j) % count]) >= 0.3 * gmax) {
                        i = (i + j) % count;
                        break;
                    }
            const double keep = p[i];
            p[i] = keep + h;
            const double up = loss_of(x.m, batch.b);
            p[i] = keep - h;
            const double down = loss_of(x.m, batch.b);
            p[i] = keep;
            const double fd = (up - down) / (2 * h);
            EXPECT_NEAR(g[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << ts[t].name << "[" << i << "]";
            ++checked;
        }
        EXPECT_GT(gmax, 0.0) << ts[t].name << " has no gradient at all";
    }
    EXPECT_EQ(checked, 5 * n);
}

INSTANTIATE_TEST_SUITE_P(Arrangement, PretrainModelGrad, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) { return i.param ? "PreLN" : "PostLN"; });

// Two micro-batches accumulate: the gradients after both are the sum of each one's (fp64, exact up to
// the additions' rounding).
TEST(PretrainModel, MicroBatchGradientsAddUp) {
    Model x;
    make_model(x, tiny_config(false), DST_DTYPE_FP64, 3, 10);
    ASSERT_NE(x.m, nullptr);
    Batch a(3, 10, 37, {10, 6, 3}, 1), b(2, 10, 37, {9, 4}, 2);
    dstp_error err;
    dstp_result r;
    std::vector<dstp_model_tensor> ts(64);
    const int n = dstp_model_tensors(x.m, ts.data(), 64);
    auto grads = [&]() { return all_grads<double>(ts, n); };
    ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK);
    ASSERT_EQ(dstp_model_train(x.m, &a.b, 1.0f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
    const std::vector<double> ga = grads();
    ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK);
    ASSERT_EQ(dstp_model_train(x.m, &b.b, 1.0f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
    const std::vector<double> gb = grads();
    ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK);
    ASSERT_EQ(dstp_model_train(x.m, &a.b, 1.0f, 0, nullptr, &r, &err), DSTP_OK);
    ASSERT_EQ(dstp_model_train(x.m, &b.b, 0.5f, 0, nullptr, &r, &err), DSTP_OK);
    const std::vector<double> gab = grads();
    ASSERT_EQ(ga.size(), gab.size());
    for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(gab[i], ga[i] + 0.5 * gb[i], 1e-13 * (1 + std::fabs(ga[i]))) << i;
}

// The first micro-batch of a step may write the gradients instead of adding to zeroed ones (dst-pretrain
// does when the engine leaves them at its boundaries): the same values, whatever the gradients held before,
// with and without masked tokens (without, the MLM head's gradients are zero and nothing else writes them),
// on padded and packed layers; and a second micro-batch still adds to what the first wrote.
class PretrainModelWrite : public ::testing::TestWithParam<bool> {};

TEST_P(PretrainModelWrite, WritingEqualsZeroingThenAdding) {
    Model x;
    make_model(x, tiny_config(GetParam()), DST_DTYPE_FP32, 3, 10);
    ASSERT_NE(x.m, nullptr);
    std::vector<dstp_model_tensor> ts(64);
    const int n = dstp_model_tensors(x.m, ts.data(), 64);
    auto grads = [&]() { return all_grads<float>(ts, n); };
    auto poison = [&]() {  // what a previous step's gradients might hold
        for (int t = 0; t < n; ++t) {
            int64_t count = 1;
            for (int d = 0; d < ts[t].grad.ndim; ++d) count *= ts[t].grad.shape[d];
            float *g = static_cast<float *>(ts[t].grad.data);
            for (int64_t i = 0; i < count; ++i) g[i] = 1e3f + static_cast<float>(i % 7);
        }
    };
    Batch packed(3, 10, 37, {10, 6, 3}, 4), full(3, 10, 37, {10, 10, 10}, 5), none(3, 10, 37, {1, 1, 1}, 6);
    ASSERT_GT(packed.b.nrows, 0);
    ASSERT_EQ(none.b.nrows, 0) << "one-token sequences have no masked row";
    dstp_error err;
    dstp_result r;
    for (const Batch *first : {&packed, &full, &none}) {
        ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK);
        ASSERT_EQ(dstp_model_train(x.m, &first->b, 1.0f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
        const std::vector<float> added = grads();
        ASSERT_EQ(dstp_model_train(x.m, &full.b, 0.5f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
        const std::vector<float> added2 = grads();
        poison();
        ASSERT_EQ(dstp_model_train(x.m, &first->b, 1.0f, 1, nullptr, &r, &err), DSTP_OK) << err.msg;
        const std::vector<float> written = grads();
        ASSERT_EQ(dstp_model_train(x.m, &full.b, 0.5f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;
        const std::vector<float> written2 = grads();
        ASSERT_EQ(added.size(), written.size());
        size_t differ = 0, differ2 = 0;
        for (size_t i = 0; i < added.size(); ++i) {
            differ += !(added[i] == written[i]);
            differ2 += !(added2[i] == written2[i]);
        }
        EXPECT_EQ(differ, 0u) << "of " << added.size() << " gradient elements after the first micro-batch (" << first->b.nrows
                              << " masked rows)";
        EXPECT_EQ(differ2, 0u) << "after the second";
    }
}

INSTANTIATE_TEST_SUITE_P(Arrangement, PretrainModelWrite, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) { return i.param ? "PreLN" : "PostLN"; });

// The buckets of final gradients the data-parallel all-reduce starts from: each gradient of the model
// lies in exactly one bucket, every layer's arena comes after the heads and before the embeddings in
// backward order (layer L-1 first), and a bucket's values no longer change once it is reported (the
// CPU backend runs every op at its call, so a copy taken in the hook is what the reduce would read).
struct Bucket {
    const char *lo, *hi;
    std::vector<unsigned char> bytes;
};

dstp_status record_bucket(void *user, const dst_tensor *g, int n, dstp_error *) {
    auto *out = static_cast<std::vector<Bucket> *>(user);
    for (int i = 0; i < n; ++i) {
        int64_t count = 1;
        for (int d = 0; d < g[i].ndim; ++d) count *= g[i].shape[d];
        const size_t bytes = static_cast<size_t>(count) * dst_dtype_size(g[i].dtype);
        const char *p = static_cast<const char *>(g[i].data);
        out->push_back(Bucket{p, p + bytes, std::vector<unsigned char>(p, p + bytes)});
    }
    return DSTP_OK;
}

class PretrainModelBuckets : public ::testing::TestWithParam<bool> {};

TEST_P(PretrainModelBuckets, EveryGradientOnceFinalInBackwardOrder) {
    Model x;
    dstp_model_config c = tiny_config(GetParam());
    c.num_hidden_layers = 3;
    make_model(x, c, DST_DTYPE_FP32, 2, 10);
    ASSERT_NE(x.m, nullptr);
    Batch a(2, 10, 37, {10, 7}, 3);
    std::vector<Bucket> seen;
    dstp_grad_hook hook{record_bucket, &seen};
    dstp_error err;
    dstp_result r;
    ASSERT_EQ(dstp_model_zero_grads(x.m, &err), DSTP_OK);
    ASSERT_EQ(dstp_model_train(x.m, &a.b, 1.0f, 0, nullptr, &r, &err), DSTP_OK) << err.msg;  // earlier micro-batch
    ASSERT_EQ(dstp_model_train(x.m, &a.b, 1.0f, 0, &hook, &r, &err), DSTP_OK) << err.msg;
    std::vector<dstp_model_tensor> ts(96);
    const int n = dstp_model_tensors(x.m, ts.data(), 96);
    ASSERT_LE(n, 96);
    for (int t = 0; t < n; ++t) {
        int64_t count = 1;
        for (int d = 0; d < ts[t].grad.ndim; ++d) count *= ts[t].grad.shape[d];
        const char *p = static_cast<const char *>(ts[t].grad.data);
        const char *e = p + static_cast<size_t>(count) * dst_dtype_size(ts[t].grad.dtype);
        int holders = 0;
        for (const Bucket &b : seen) holders += p >= b.lo && e <= b.hi;
        EXPECT_EQ(holders, 1) << ts[t].name;
    }
    for (size_t i = 0; i < seen.size(); ++i)
        for (size_t j = i + 1; j < seen.size(); ++j)
            EXPECT_TRUE(seen[i].hi <= seen[j].lo || seen[j].hi <= seen[i].lo) << "buckets " << i << " and " << j << " overlap";
    for (const Bucket &b : seen)
        EXPECT_EQ(std::memcmp(b.bytes.data(), b.lo, b.bytes.size()), 0) << "a gradient changed after its bucket was reported";
    // Backward order: the layers' arenas appear as layer 2, 1, 0; the word table comes last of all.
    std::vector<int> layer_at;
    for (int l = 2; l >= 0; --l) {
        char name[96];
        std::snprintf(name, sizeof name, "bert.encoder.layer.%d.attn_qkvw", l);
        for (int t = 0; t < n; ++t)
            if (std::strcmp(ts[t].name, name) == 0)
                for (size_t k = 0; k < seen.size(); ++k)
                    if (static_cast<const char *>(ts[t].grad.data) >= seen[k].lo &&
                        static_cast<const char *>(ts[t].grad.data) < seen[k].hi)
                        layer_at.push_back(static_cast<int>(k));
    }
    ASSERT_EQ(layer_at.size(), 3u);
    EXPECT_LT(layer_at[0], layer_at[1]);
    EXPECT_LT(layer_at[1], layer_at[2]);
    EXPECT_GT(layer_at[0], 0) << "the heads' bucket comes first";
    EXPECT_EQ(std::strcmp(ts[0].name, "bert.embeddings.word_embeddings.weight"), 0);
    int word_at = -1;
    for (size_t k = 0; k < seen.size(); ++k)
        if (static_cast<const char *>(ts[0].grad.data) == seen[k].lo) word_at = static_cast<int>(k);
    EXPECT_GT(word_at, layer_at[2]);
}

INSTANTIATE_TEST_SUITE_P(Arrangement, PretrainModelBuckets, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) { return i.param ? "PreLN" : "PostLN"; });

// A batch that does not fit the model is refused with a message, not a crash.
TEST(PretrainModel, BatchThatDoesNotFitIsRefused) {
    Model x;
    make_model(x, tiny_config(false), DST_DTYPE_FP32, 2, 10);
    ASSERT_NE(x.m, nullptr);
    Batch big(3, 10, 37, {10, 6, 3}, 1), bad_len(2, 10, 37, {10, 6}, 1);
    bad_len.lengths[1] = 0;
    dstp_error err;
    dstp_result r;
    EXPECT_EQ(dstp_model_train(x.m, &big.b, 1.0f, 0, nullptr, &r, &err), DSTP_ERR_ARG);
    EXPECT_NE(std::string(err.msg).find("does not fit"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_model_evaluate(x.m, &bad_len.b, &r, &err), DSTP_ERR_ARG);
    EXPECT_NE(std::string(err.msg).find("has length 0"), std::string::npos) << err.msg;
}

// ---- model configurations ----------------------------------------------------------------------------

std::string config_error(const std::string &text, dstp_model_config *out = nullptr) {
    dstp_model_config c;
    dstp_error err;
    err.msg[0] = '\0';
    const dstp_status st = dstp_model_config_parse(text.data(), text.size(), "cfg.json", &c, &err);
    if (out) *out = c;
    return st == DSTP_OK ? "" : err.msg;
}

TEST(PretrainModelConfig, HuggingFaceFilesAreAccepted) {
    // bert-base-uncased's config.json, key for key.
    const std::string base = R"({
  "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": false,
  "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
  "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0", "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})";
    dstp_model_config c;
    ASSERT_EQ(config_error(base, &c), "");
    EXPECT_EQ(c.vocab_size, 30522);
    EXPECT_EQ(c.hidden_size, 768);
    EXPECT_EQ(c.gelu_tanh, 0);
    EXPECT_EQ(c.pre_layer_norm, 0);
    EXPECT_FLOAT_EQ(c.layer_norm_eps, 1e-12f);
    ASSERT_EQ(config_error(R"({"hidden_act": "gelu_new", "pre_layer_norm": true, "next_sentence_prediction": false})", &c), "");
    EXPECT_EQ(c.gelu_tanh, 1);
    EXPECT_EQ(c.pre_layer_norm, 1);
    EXPECT_EQ(c.next_sentence_prediction, 0);
    // What the program writes reads back the same.
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dstp_model_config_write(f, &c, 1);
    fclose(f);
    dstp_model_config d;
    EXPECT_EQ(config_error(std::string(buf, len), &d), "") << buf;
    free(buf);
    EXPECT_EQ(d.gelu_tanh, 1);
    EXPECT_EQ(d.pre_layer_norm, 1);
    EXPECT_EQ(d.hidden_size, c.hidden_size);
}

TEST(PretrainModelConfig, BadKeysAndValuesAreNamed) {
    struct Case {
        const char *text, *want;
    };
    const Case cases[] = {
        {"{\"hiden_size\": 128}", "unknown key \"hiden_size\" (did you mean \"hidden_size\"?)"},
        {"{\"colour\": 1}", "unknown key \"colour\""},
        {"{\"hidden_size\": 12.5}", "key \"hidden_size\": expected an integer in [1, 65536], got 12.5"},
        {"{\"hidden_size\": \"128\"}", "key \"hidden_size\": expected an integer"},
        {"{\"num_hidden_layers\": 0}", "key \"num_hidden_layers\": expected an integer in [1, 1000], got 0"},
        {"{\"hidden_dropout_prob\": 1.0}", "key \"hidden_dropout_prob\": expected a number in [0, 1), got 1"},
        {"{\"layer_norm_eps\": 0}", "key \"layer_norm_eps\": expected a number in (0, 1]"},
        {"{\"pre_layer_norm\": 1}", "key \"pre_layer_norm\": expected true or false, got 1"},
        {"{\"hidden_act\": \"relu\"}", "key \"hidden_act\": expected \"gelu\""},
        {"{\"position_embedding_type\": \"relative_key\"}", "key \"position_embedding_type\": expected \"absolute\""},
        {"{\"model_type\": \"roberta\"}", "key \"model_type\""},
        {"{\"is_decoder\": true}", "key \"is_decoder\""},
        {"{\"tie_word_embeddings\": false}", "key \"tie_word_embeddings\""},
        {"{\"hidden_size\": 100, \"num_attention_heads\": 3}", "\"hidden_size\" (100) must be a multiple of \"num_attention_heads\" (3)"},
        {"{\"vocab_size\": 10, \"pad_token_id\": 10}", "\"pad_token_id\" (10) must be below \"vocab_size\" (10)"},
        {"[1, 2]", "must be a JSON object"},
        {"{\"hidden_size\": 64,}", "line 1, column"},
        {"{\"hidden_size\": 64, \"hidden_size\": 32}", "duplicate object key"},
    };
    for (const Case &c : cases) {
        const std::string e = config_error(c.text);
        EXPECT_NE(e.find(c.want), std::string::npos) << c.text << " -> " << e;
        EXPECT_EQ(e.rfind("cfg.json", 0), 0u) << e;
    }
    // Malformed JSON: jansson's position of the error.
    EXPECT_NE(config_error("{\n  \"hidden_size\": 64,\n  \"num_hidden_layers\": -1,\n}").find("line 4"), std::string::npos)
        << config_error("{\n  \"hidden_size\": 64,\n  \"num_hidden_layers\": -1,\n}");
}

}  // namespace
