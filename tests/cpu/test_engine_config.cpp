// The engine's DeepSpeed-style JSON configuration through dst_engine_config_validate and
// dst_engine_create: the BERT tutorial's file as written, DeepSpeed's batch-size triad (spec §2.1 and
// the §9 oracles), the resolved values an engine reports, and every kind of error with its message:
// malformed JSON, unknown and duplicate keys with their JSON path, wrong types, values out of range,
// inconsistent or contradictory settings, and DeepSpeed settings the library does not implement.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "test_util.h"

using namespace dsttest;

namespace {

struct EngineDeleter {
    void operator()(dst_engine *e) const { dst_engine_destroy(e); }
};
using Engine = std::unique_ptr<dst_engine, EngineDeleter>;

// The reason dst_engine_config_validate gives ("" when accepted), and its status.
struct Verdict {
    dst_status status;
    std::string reason;
};
Verdict validate(const std::string &json, int world = 1) {
    char buf[2048];
    std::memset(buf, 'x', sizeof buf);
    const dst_status s = dst_engine_config_validate(json.c_str(), world, buf, sizeof buf);
    return {s, buf};
}

// Expects validate(json[, world]) to refuse with `status_` and a reason naming `word_`.
#define EXPECT_REFUSED(status_, word_, ...)                                                         \
    do {                                                                                            \
        const Verdict v_ = validate(__VA_ARGS__);                                                   \
        EXPECT_EQ(v_.status, (status_)) << #__VA_ARGS__ << " -> " << v_.reason;                     \
        EXPECT_TRUE(mentions(v_.reason, (word_))) << "reason '" << v_.reason << "' does not name '" \
                                                   << (word_) << "' for " << #__VA_ARGS__;          \
    } while (0)

const char kAdam[] = R"("optimizer": {"type": "Adam", "params": {"lr": 1e-3}})";

std::string with(const std::string &body) { return "{" + body + ", " + kAdam + "}"; }

dst_engine_state state_of(dst_engine *e) {
    dst_engine_state s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_EQ(dst_engine_get_state(e, &s), DST_OK) << dst_last_error();
    return s;
}

Engine create(dst_context *ctx, const std::string &json) {
    dst_engine *e = nullptr;
    EXPECT_EQ(dst_engine_create(ctx, json.c_str(), 1, &e), DST_OK) << dst_last_error();
    return Engine(e);
}

TEST(EngineConfig, TheBertTutorialsAdamConfigAsWritten) {
    // spec §11: accepted as the tutorial gives it, with max_grad_norm as global clipping.
    const std::string tutorial = R"({
      "train_batch_size": 4096,
      "train_micro_batch_size_per_gpu": 64,
      "steps_per_print": 1000,
      "optimizer": {"type": "Adam", "params": {"lr": 2e-4, "max_grad_norm": 1.0, "weight_decay": 0.01, "bias_correction": false}},
      "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16}
    })";
    EXPECT_EQ(validate(tutorial, 16).status, DST_OK) << validate(tutorial, 16).reason;
    EXPECT_EQ(validate(tutorial, 16).reason, "");
    Ctx ctx = make_ctx();
    Engine e = create(ctx.get(), tutorial);
    ASSERT_TRUE(e);
    const dst_engine_state s = state_of(e.get());
    EXPECT_EQ(s.train_batch_size, 4096);
    EXPECT_EQ(s.train_micro_batch_size_per_gpu, 64);
    EXPECT_EQ(s.gradient_accumulation_steps, 64) << "one GPU: 4096 / 64";
    EXPECT_EQ(s.world_size, 1);
    EXPECT_EQ(s.optimizer, DST_OPTIMIZER_ADAM);
    EXPECT_EQ(s.fp16_enabled, 1);
    EXPECT_EQ(s.bf16_enabled, 0);
    EXPECT_EQ(s.dynamic_loss_scale, 1);
    EXPECT_EQ(s.loss_scale, 65536.0f);
    EXPECT_EQ(s.steps_per_print, 1000);
    EXPECT_EQ(s.gradient_clipping, 1.0f);
    EXPECT_EQ(s.global_steps, 0);
    dst_optimizer *opt = nullptr;
    DST_ASSERT_OK(dst_engine_get_optimizer(e.get(), &opt));
    dst_param_group g;
    g.struct_size = sizeof g;
    DST_ASSERT_OK(dst_optimizer_get_group(opt, 0, &g));
    EXPECT_FLOAT_EQ(g.lr, 2e-4f);
    EXPECT_FLOAT_EQ(g.weight_decay, 0.01f);
    EXPECT_FLOAT_EQ(g.beta1, 0.9f);
}

TEST(EngineConfig, BatchSizeTriadAsDeepSpeedResolvesIt) {
    Ctx ctx = make_ctx();
    struct Row {
        const char *keys;
        int world, tb, mb, gas;
    };
    const Row rows[] = {
        {R"("train_batch_size": 65536, "train_micro_batch_size_per_gpu": 64)", 1024, 65536, 64, 1},
        {R"("train_batch_size": 4096, "train_micro_batch_size_per_gpu": 64)", 16, 4096, 64, 4},
        {R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8)", 1, 32, 4, 8},
        {R"("train_batch_size": 32, "gradient_accumulation_steps": 4)", 1, 32, 8, 4},
        {R"("train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5)", 1, 15, 3, 5},
        {R"("train_batch_size": 12)", 1, 12, 12, 1},
        {R"("train_micro_batch_size_per_gpu": 6)", 1, 6, 6, 1},
    };
    for (const Row &r : rows) {
        const std::string json = with(r.keys);
        EXPECT_EQ(validate(json, r.world).status, DST_OK) << json << ": " << validate(json, r.world).reason;
        if (r.world != 1) continue;
        Engine e = create(ctx.get(), json);
        ASSERT_TRUE(e) << json;
        const dst_engine_state s = state_of(e.get());
        EXPECT_EQ(s.train_batch_size, r.tb) << json;
        EXPECT_EQ(s.train_micro_batch_size_per_gpu, r.mb) << json;
        EXPECT_EQ(s.gradient_accumulation_steps, r.gas) << json;
    }
    // (4096, 64, W 12): GAS = 4096 // 64 // 12 = 5, and 64·5·12 ≠ 4096.
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "inconsistent",
                   with(R"("train_batch_size": 4096, "train_micro_batch_size_per_gpu": 64)"), 12);
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_batch_size",
                   with(R"("train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "inconsistent", with(R"("train_batch_size": 2, "gradient_accumulation_steps": 4)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_micro_batch_size_per_gpu", with(R"("gradient_accumulation_steps": 4)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_micro_batch_size_per_gpu", std::string("{") + kAdam + "}");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_batch_size", with(R"("train_batch_size": 0)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "gradient_accumulation_steps",
                   with(R"("train_batch_size": 8, "gradient_accumulation_steps": -1)"));
    // Engines of this version run on one process; configurations for more still validate.
    dst_engine *e = reinterpret_cast<dst_engine *>(0x1);
    EXPECT_FAILS(DST_ERR_UNSUPPORTED, "world_size",
                 dst_engine_create(ctx.get(), with(R"("train_batch_size": 64)").c_str(), 2, &e));
    EXPECT_EQ(e, reinterpret_cast<dst_engine *>(0x1));
}

TEST(EngineConfig, UnknownKeysAreReportedWithTheirPath) {
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_batch_sise", with(R"("train_batch_sise": 8)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "train_batch_size", with(R"("train_batch_sise": 8)"));  // the hint
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.weight_decy",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"weight_decy": 0.1}}})");
    const Verdict v = validate(R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"weight_decy": 0.1}}})");
    EXPECT_NE(v.reason.find("did you mean optimizer.params.weight_decay"), std::string::npos) << v.reason;
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16.lossscale", with(R"("train_batch_size": 8, "fp16": {"lossscale": 0})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "scheduler.params.warmup_steps",
                   with(R"("train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}})"));
    // A FusedAdam argument is not a FusedLamb one (DeepSpeed raises TypeError for it).
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.adam_w_mode",
                   R"({"train_batch_size": 8, "optimizer": {"type": "lamb", "params": {"adam_w_mode": true}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.max_coeff",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"max_coeff": 1.0}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "zero_optimization.allgather_bucket_size",
                   with(R"("train_batch_size": 8, "zero_optimization": {"stage": 0, "allgather_bucket_size": 5})"));
    // Keys that belong to another library inside "amp" are not checked (apex's).
    EXPECT_EQ(validate(with(R"("train_batch_size": 8, "amp": {"enabled": false, "opt_level": "O1"})")).status, DST_OK);
}

TEST(EngineConfig, DuplicateKeysAndMalformedJson) {
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16.enabled",
                   with(R"("train_batch_size": 8, "fp16": {"enabled": true, "enabled": false})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "duplicate", with(R"("train_batch_size": 8, "train_batch_size": 8)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "column", R"({"train_batch_size": 8,, })");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "JSON", "[1, 2]");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "JSON", "");
    // Comments are allowed (DeepSpeed reads its files with hjson).
    const std::string commented = "{ // batch\n \"train_batch_size\": 8, /* the optimizer */ " + std::string(kAdam) + "}";
    EXPECT_EQ(validate(commented).status, DST_OK) << validate(commented).reason;
}

TEST(EngineConfig, WrongTypesNameTheKeyAndWhatWasGiven) {
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "string", with(R"("train_batch_size": "8")"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "integer", with(R"("train_batch_size": 8.5)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.lr",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"lr": "2e-4"}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.betas",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"betas": [0.9]}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.betas[1]",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"betas": [0.9, 1.5]}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.betas[0]",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"betas": ["a", 0.9]}}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16.enabled", with(R"("train_batch_size": 8, "fp16": {"enabled": 1})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16", with(R"("train_batch_size": 8, "fp16": true)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "gradient_clipping", with(R"("train_batch_size": 8, "gradient_clipping": -1)"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16.loss_scale_window",
                   with(R"("train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_window": 0})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "fp16.min_loss_scale",
                   with(R"("train_batch_size": 8, "fp16": {"enabled": true, "min_loss_scale": 0})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "communication_data_type",
                   with(R"("train_batch_size": 8, "communication_data_type": "fp8")"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.params.min_coeff",
                   R"({"train_batch_size": 8, "optimizer": {"type": "lamb", "params": {"max_coeff": 0.1, "min_coeff": 0.5}}})");
    // null stands for "not given", as DeepSpeed's None defaults do.
    EXPECT_EQ(validate(with(R"("train_batch_size": 8, "steps_per_print": null)")).status, DST_OK);
}

TEST(EngineConfig, OptimizerNamesAndUnsupportedSettings) {
    for (const char *name : {"adam", "Adam", "ADAM", "adamw", "AdamW", "lamb", "Lamb", "LAMB"}) {
        const std::string json = std::string(R"({"train_batch_size": 8, "optimizer": {"type": ")") + name + "\"}}";
        EXPECT_EQ(validate(json).status, DST_OK) << name << ": " << validate(json).reason;
    }
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "OneBitAdam", R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}})");
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "SGD", R"({"train_batch_size": 8, "optimizer": {"type": "SGD"}})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer", R"({"train_batch_size": 8})");
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "optimizer.type", R"({"train_batch_size": 8, "optimizer": {"params": {}}})");
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "amsgrad",
                   R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"amsgrad": true}}})");
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "stage", with(R"("train_batch_size": 8, "zero_optimization": {"stage": 2})"));
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "amp", with(R"("train_batch_size": 8, "amp": {"enabled": true})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "bf16", with(R"("train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "bfloat16", with(R"("train_batch_size": 8, "bf16": {}, "bfloat16": {})"));
    // The legacy name alone is accepted.
    EXPECT_EQ(validate(with(R"("train_batch_size": 8, "bfloat16": {"enabled": true})")).status, DST_OK);
    // gradient_clipping and optimizer.params.max_grad_norm both set the clip: they must agree.
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "gradient_clipping",
                   R"({"train_batch_size": 8, "gradient_clipping": 1.0, "optimizer": {"type": "adam", "params": {"max_grad_norm": 2.0}}})");
    EXPECT_EQ(validate(R"({"train_batch_size": 8, "gradient_clipping": 2.0, "optimizer": {"type": "adam", "params": {"max_grad_norm": 2.0}}})").status,
              DST_OK);
}

TEST(EngineConfig, Schedulers) {
    const char *ok[] = {
        R"("scheduler": {"type": "WarmupLR"})",
        R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "warmup_type": "linear"}})",
        R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 2000}})",
        R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000, "warmup_min_ratio": 0, "cos_min_ratio": 0.0001}})",
        R"("scheduler": {"type": "warmup_exp_decay_exp", "params": {"warmup_proportion": 0.02, "decay_rate": 0.9, "decay_step": 250, "total_training_steps": 7500, "lr_offset": 1e-3, "rewarm": true}})",
        R"("scheduler": {"type": "warmup_linear", "params": {"warmup_proportion": 0.1, "total_training_steps": 1000}})",
    };
    for (const char *s : ok) EXPECT_EQ(validate(with(std::string(R"("train_batch_size": 8, )") + s)).status, DST_OK) << s << validate(with(std::string(R"("train_batch_size": 8, )") + s)).reason;
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "WarmupLR", with(R"("train_batch_size": 8, "scheduler": {"type": "warmuplr"})"));
    EXPECT_REFUSED(DST_ERR_UNSUPPORTED, "OneCycle", with(R"("train_batch_size": 8, "scheduler": {"type": "OneCycle"})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "total_num_steps", with(R"("train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR"})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "scheduler.params.warmup_type",
                   with(R"("train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "decay_step",
                   with(R"("train_batch_size": 8, "scheduler": {"type": "warmup_exp_decay_exp", "params": {"warmup_proportion": 0.1, "decay_rate": 0.9, "total_training_steps": 10}})"));
    EXPECT_REFUSED(DST_ERR_INVALID_ARGUMENT, "scheduler.params.decay_rate",
                   with(R"("train_batch_size": 8, "scheduler": {"type": "warmup_linear", "params": {"warmup_proportion": 0.1, "total_training_steps": 10, "decay_rate": 0.5}})"));
}

TEST(EngineConfig, ValidateArgumentsAndReasonBuffer) {
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config_json", dst_engine_config_validate(nullptr, 1, nullptr, 0));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "world_size", dst_engine_config_validate("{}", 0, nullptr, 0));
    char small[8];
    std::memset(small, 'x', sizeof small);
    EXPECT_EQ(dst_engine_config_validate("{\"bogus\": 1}", 1, small, sizeof small), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::strlen(small), sizeof small - 1) << "truncated, NUL-terminated";
    EXPECT_EQ(std::string(small), std::string(dst_last_error()).substr(0, sizeof small - 1));
    char one = 'x';
    EXPECT_EQ(dst_engine_config_validate("{\"bogus\": 1}", 1, &one, 1), DST_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(one, '\0');
    Ctx ctx = make_ctx();
    dst_engine *e = nullptr;
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "ctx", dst_engine_create(nullptr, "{}", 1, &e));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "out", dst_engine_create(ctx.get(), with(R"("train_batch_size": 8)").c_str(), 1, nullptr));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "config_json", dst_engine_create(ctx.get(), nullptr, 1, &e));
    EXPECT_FAILS(DST_ERR_INVALID_ARGUMENT, "train_batch_sise", dst_engine_create(ctx.get(), with(R"("train_batch_sise": 8)").c_str(), 1, &e));
    EXPECT_EQ(e, nullptr);
    dst_engine_destroy(nullptr);
}

}  // namespace
