// The data side of dst-pretrain (tools/dst-pretrain/pretrain_data.h): the tokenizer against fixed
// expected ids, the masking rule of deepspeed_engine.md §7.4 (exact counts, 80/10/10 statistics),
// sentence pairs, the HDF5 shard reader on a shard this test writes with the HDF5 C API, the loader
// thread (determinism, resume position, shutdown while it waits), and bad data (empty files,
// non-UTF-8, shards with missing or inconsistent datasets): a message and an error status.
#include <gtest/gtest.h>

#ifdef DSTP_HAVE_HDF5
#include <hdf5.h>
#endif
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "pretrain_data.h"
#include "../common/scratch_dir.h"

namespace {

std::string temp_path(const std::string &name) {
    return dst_test::scratch_path(name);
}

std::string write_file(const std::string &name, const std::string &content) {
    const std::string p = temp_path(name);
    FILE *f = std::fopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    std::fwrite(content.data(), 1, content.size(), f);
    std::fclose(f);
    return p;
}

const char *kVocab =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nquick\nbrown\nfox\n##es\njump\n##ed\nover\nlazy\ndog\n!\n,\n.\nun\n"
    "##aff\n##able\ncafe\nnaive\n\xe4\xb8\xad\nok\n'\ns\n";

struct Vocab {
    dstp_vocab *v = nullptr;
    explicit Vocab(const std::string &content) {
        dstp_error err;
        const std::string p = write_file("vocab.txt", content);
        EXPECT_EQ(dstp_vocab_load(p.c_str(), &v, &err), DSTP_OK) << err.msg;
    }
    ~Vocab() { dstp_vocab_free(v); }
};

std::vector<int32_t> tokenize(const dstp_vocab *v, const std::string &text, bool lower = true) {
    dstp_tokenizer t{v, lower ? 1 : 0, 100};
    dstp_ids ids{nullptr, 0, 0};
    dstp_error err;
    EXPECT_EQ(dstp_tokenize(&t, text.data(), text.size(), &ids, &err), DSTP_OK) << err.msg;
    std::vector<int32_t> out(ids.v, ids.v + ids.n);
    dstp_ids_free(&ids);
    return out;
}

TEST(PretrainTokenizer, FixedIds) {
    Vocab v(kVocab);
    ASSERT_NE(v.v, nullptr);
    // Lower-casing, ## pieces, punctuation, accents (precomposed and combining), CJK split, a control
    // character dropped, a no-break space as whitespace.
    const std::string text =
        "The quick brown foxes jumped over the lazy dog! Unaffable Caf\xc3\xa9, na\xc3\xafve "
        "\xe4\xb8\xad\xe5\x9b\xbd ok\x01's.\xc2\xa0" "cafe\xcc\x81";
    const std::vector<int32_t> want = {5, 6, 7, 8, 9, 10, 11, 12, 5, 13, 14, 15, 18, 19, 20, 21, 16, 22, 23, 1, 24, 25,
                                       26, 17, 21};
    EXPECT_EQ(tokenize(v.v, text), want);
    // A word of 101 characters, an unmatched rest, an unknown word: [UNK].
    EXPECT_EQ(tokenize(v.v, std::string(101, 'a')), std::vector<int32_t>({1}));
    EXPECT_EQ(tokenize(v.v, "jumpxx the"), std::vector<int32_t>({1, 5}));
    EXPECT_EQ(tokenize(v.v, "  \t\n "), std::vector<int32_t>());
    // Cased: no lower-casing, so "The" is unknown; accents are kept.
    EXPECT_EQ(tokenize(v.v, "The the Caf\xc3\xa9", false), std::vector<int32_t>({1, 5, 1}));
    dstp_special sp;
    dstp_error err;
    ASSERT_EQ(dstp_vocab_special(v.v, &sp, &err), DSTP_OK) << err.msg;
    EXPECT_EQ(sp.pad, 0);
    EXPECT_EQ(sp.mask, 4);
}

TEST(PretrainTokenizer, BadText) {
    Vocab v(kVocab);
    dstp_tokenizer t{v.v, 1, 100};
    dstp_ids ids{nullptr, 0, 0};
    dstp_error err;
    const std::string bad = "the \xff\xfe dog";
    EXPECT_EQ(dstp_tokenize(&t, bad.data(), bad.size(), &ids, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("byte offset 4"), std::string::npos) << err.msg;
    dstp_ids_free(&ids);
    // Vocabulary files: empty, not UTF-8, no special tokens.
    dstp_vocab *vv = nullptr;
    EXPECT_EQ(dstp_vocab_load(write_file("empty_vocab.txt", "").c_str(), &vv, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("empty"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_vocab_load(write_file("bad_vocab.txt", "[PAD]\n\xc3\n").c_str(), &vv, &err), DSTP_ERR_FORMAT);
    EXPECT_EQ(dstp_vocab_load(temp_path("no_such_file").c_str(), &vv, &err), DSTP_ERR_IO);
    Vocab plain("a\nb\n");
    dstp_special sp;
    EXPECT_EQ(dstp_vocab_special(plain.v, &sp, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("[PAD]"), std::string::npos) << err.msg;
}

// ---- masking -------------------------------------------------------------------------------------------

TEST(PretrainMasking, CountsRoundHalfToEven) {
    // deepspeed_engine.md §9: 10 → 2, 30 → 4 (4.5), 50 → 8 (7.5), 70 → 10 (10.5), 128 → 19, 512 → 77 or 20.
    EXPECT_EQ(dstp_mask_count(10, 20), 2);
    EXPECT_EQ(dstp_mask_count(30, 20), 4);
    EXPECT_EQ(dstp_mask_count(50, 20), 8);
    EXPECT_EQ(dstp_mask_count(70, 20), 10);
    EXPECT_EQ(dstp_mask_count(128, 20), 19);
    EXPECT_EQ(dstp_mask_count(512, 80), 77);
    EXPECT_EQ(dstp_mask_count(512, 20), 20);
    EXPECT_EQ(dstp_mask_count(3, 20), 1);  // max(1, round(0.45) = 0)
}

TEST(PretrainMasking, EightyTenTenAndNeverSpecialTokens) {
    const dstp_special sp{0, 1, 2, 3, 4};
    const int32_t V = 1000, len = 128, max_pred = 20;
    dstp_rng rng;
    dstp_rng_seed(&rng, 7, 0);
    long masked = 0, kept = 0, random = 0, chosen = 0;
    const int samples = 20000;
    std::vector<int32_t> first;
    for (int s = 0; s < samples; ++s) {
        std::vector<int32_t> ids(len), orig(len), pos(max_pred), lab(max_pred);
        for (int32_t i = 0; i < len; ++i) ids[i] = 5 + static_cast<int32_t>(dstp_rng_below(&rng, V - 5));
        ids[0] = sp.cls;
        ids[60] = sp.sep;
        ids[len - 1] = sp.sep;
        orig = ids;
        const int32_t n = dstp_mask(ids.data(), len, max_pred, V, &sp, &rng, pos.data(), lab.data());
        ASSERT_EQ(n, 19);
        for (int32_t k = 0; k < n; ++k) {
            ASSERT_TRUE(pos[k] != 0 && pos[k] != 60 && pos[k] != len - 1) << "a special token was chosen";
            if (k) {
                ASSERT_LT(pos[k - 1], pos[k]) << "positions ascending and distinct";
            }
            ASSERT_EQ(lab[k], orig[pos[k]]) << "label = original id";
            if (ids[pos[k]] == sp.mask) ++masked;
            else if (ids[pos[k]] == orig[pos[k]]) ++kept;
            else ++random;
        }
        for (int32_t i = 0; i < len; ++i) {
            bool is_chosen = false;
            for (int32_t k = 0; k < n; ++k) is_chosen |= pos[k] == i;
            if (!is_chosen) {
                ASSERT_EQ(ids[i], orig[i]) << "an unchosen token changed";
            }
        }
        chosen += n;
        if (s == 0) first = ids;
    }
    // 380,000 choices: the binomial standard deviation of a fraction is below 0.001.
    EXPECT_NEAR(double(masked) / chosen, 0.8, 0.005);
    EXPECT_NEAR(double(kept) / chosen, 0.1, 0.005);
    EXPECT_NEAR(double(random) / chosen, 0.1, 0.005);
    EXPECT_NEAR(double(chosen) / (samples * len), 0.15, 0.002);
    // The same seed gives the same masks.
    dstp_rng again;
    dstp_rng_seed(&again, 7, 0);
    std::vector<int32_t> ids(len), pos(max_pred), lab(max_pred);
    for (int32_t i = 0; i < len; ++i) ids[i] = 5 + static_cast<int32_t>(dstp_rng_below(&again, V - 5));
    ids[0] = sp.cls;
    ids[60] = sp.sep;
    ids[len - 1] = sp.sep;
    dstp_mask(ids.data(), len, max_pred, V, &sp, &again, pos.data(), lab.data());
    EXPECT_EQ(ids, first);
}

// ---- sentence pairs ------------------------------------------------------------------------------------

std::string corpus_path() { return std::string(DSTP_TEST_DATA_DIR) + "/kjv.txt"; }
std::string vocab_path() { return std::string(DSTP_TEST_DATA_DIR) + "/vocab.txt"; }

TEST(PretrainExamples, SentencePairsFromTheEmbeddedCorpus) {
    dstp_vocab *v = nullptr;
    dstp_error err;
    ASSERT_EQ(dstp_vocab_load(vocab_path().c_str(), &v, &err), DSTP_OK) << err.msg;
    dstp_special sp;
    ASSERT_EQ(dstp_vocab_special(v, &sp, &err), DSTP_OK);
    dstp_tokenizer tok{v, 1, 100};
    dstp_corpus *c = nullptr;
    ASSERT_EQ(dstp_corpus_load(corpus_path().c_str(), &tok, &c, &err), DSTP_OK) << err.msg;
    EXPECT_GT(dstp_corpus_documents(c), 100u);
    dstp_epoch e{}, e2{}, e3{};
    ASSERT_EQ(dstp_epoch_build(c, &sp, dstp_vocab_size(v), 64, 10, 42, 0, &e, &err), DSTP_OK) << err.msg;
    ASSERT_GT(e.count, 1000u);
    long random_next = 0;
    for (size_t i = 0; i < e.count; ++i) {
        const dstp_example &x = e.ex[i];
        ASSERT_LE(x.len, 64);
        ASSERT_EQ(x.ids[0], sp.cls);
        ASSERT_EQ(x.ids[x.len - 1], sp.sep);
        int seps = 0, first_sep = -1;
        for (int32_t k = 0; k < x.len; ++k)
            if (x.ids[k] == sp.sep) {
                ++seps;
                if (first_sep < 0) first_sep = k;
            }
        // A masked [SEP] is impossible, so exactly two remain (a random replacement may add one more).
        ASSERT_GE(seps, 2);
        for (int32_t k = 0; k < x.len; ++k) ASSERT_EQ(x.types[k], k <= first_sep ? 0 : 1) << "example " << i;
        for (int32_t k = x.len; k < 64; ++k) ASSERT_EQ(x.ids[k], sp.pad);
        ASSERT_GT(first_sep, 1);
        ASSERT_LT(first_sep, x.len - 2);
        ASSERT_EQ(x.npred, dstp_mask_count(x.len, 10));
        random_next += x.nsp;
    }
    EXPECT_NEAR(double(random_next) / e.count, 0.5, 0.05);
    // (seed, epoch) fixes everything; another epoch differs.
    ASSERT_EQ(dstp_epoch_build(c, &sp, dstp_vocab_size(v), 64, 10, 42, 0, &e2, &err), DSTP_OK);
    ASSERT_EQ(dstp_epoch_build(c, &sp, dstp_vocab_size(v), 64, 10, 42, 1, &e3, &err), DSTP_OK);
    ASSERT_EQ(e.count, e2.count);
    for (size_t i = 0; i < e.count; ++i) ASSERT_EQ(std::memcmp(e.ex[i].ids, e2.ex[i].ids, 64 * 4), 0);
    EXPECT_NE(std::memcmp(e.ex[0].ids, e3.ex[0].ids, 64 * 4), 0);
    dstp_epoch_free(&e);
    dstp_epoch_free(&e2);
    dstp_epoch_free(&e3);
    dstp_corpus_free(c);
    dstp_vocab_free(v);
}

TEST(PretrainExamples, BadCorpora) {
    Vocab v(kVocab);
    dstp_tokenizer tok{v.v, 1, 100};
    dstp_corpus *c = nullptr;
    dstp_error err;
    EXPECT_EQ(dstp_corpus_load(write_file("empty.txt", "").c_str(), &tok, &c, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("no text"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_corpus_load(write_file("blank.txt", "\n\n  \n").c_str(), &tok, &c, &err), DSTP_ERR_FORMAT);
    EXPECT_EQ(dstp_corpus_load(write_file("latin1.txt", "the dog\n\nthe caf\xe9 dog\n").c_str(), &tok, &c, &err),
              DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("line 3"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("not UTF-8"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_corpus_load(temp_path("missing.txt").c_str(), &tok, &c, &err), DSTP_ERR_IO);
}

// ---- HDF5 shards ------------------------------------------------------------------------------------------
#ifdef DSTP_HAVE_HDF5

// Writes a shard with n samples of length S and P predictions; `skip` names a dataset to leave out,
// `bad_mask_rows` gives input_mask a wrong number of rows.
std::string write_shard(const std::string &name, int n, int S, int P, const char *skip = nullptr,
                        bool bad_mask_rows = false) {
    const std::string p = temp_path(name);
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(f, 0);
    auto put = [&](const char *ds, hid_t file_type, hid_t mem_type, int rank, hsize_t d0, hsize_t d1, const void *data) {
        if (skip && std::strcmp(skip, ds) == 0) return;
        hsize_t dims[2] = {d0, d1};
        hid_t space = H5Screate_simple(rank, dims, nullptr);
        hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(plist, rank, dims);
        H5Pset_deflate(plist, 4);  // gzip, as NVIDIA's files
        hid_t d = H5Dcreate2(f, ds, file_type, space, H5P_DEFAULT, plist, H5P_DEFAULT);
        EXPECT_GE(d, 0);
        EXPECT_GE(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
        H5Dclose(d);
        H5Pclose(plist);
        H5Sclose(space);
    };
    std::vector<int32_t> ids(n * S), pos(n * P, 0), mid(n * P, 0);
    std::vector<int8_t> mask(n * S, 0), seg(n * S, 0), nsp(n);
    for (int i = 0; i < n; ++i) {
        const int len = S - i % 3;
        for (int s = 0; s < S; ++s) {
            ids[i * S + s] = s < len ? 10 + (i * 7 + s) % 20 : 0;
            mask[i * S + s] = s < len;
            seg[i * S + s] = s >= len / 2 && s < len;
        }
        ids[i * S] = 2;
        pos[i * P] = 3;
        pos[i * P + 1] = 5 + i % 2;  // then zeros: k = 2 predictions
        mid[i * P] = 100 + i;
        mid[i * P + 1] = 200 + i;
        nsp[i] = i % 2;
    }
    put("input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, n, S, ids.data());
    put("input_mask", H5T_STD_I8LE, H5T_NATIVE_INT8, 2, bad_mask_rows ? n - 1 : n, S, mask.data());
    put("segment_ids", H5T_STD_I8LE, H5T_NATIVE_INT8, 2, n, S, seg.data());
    put("masked_lm_positions", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, n, P, pos.data());
    put("masked_lm_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, n, P, mid.data());
    put("next_sentence_labels", H5T_STD_I8LE, H5T_NATIVE_INT8, 1, n, 1, nsp.data());
    H5Fclose(f);
    return p;
}

TEST(PretrainShards, ReadAndConvertToBatches) {
    const int n = 5, S = 16, P = 4;
    const std::string p = write_shard("training_shard.hdf5", n, S, P);
    dstp_shard sh{};
    dstp_error err;
    ASSERT_EQ(dstp_shard_read(p.c_str(), &sh, &err), DSTP_OK) << err.msg;
    EXPECT_EQ(sh.n, n);
    EXPECT_EQ(sh.seq, S);
    EXPECT_EQ(sh.max_pred, P);
    std::vector<int32_t> mem(2 * S + 2 * P);
    dstp_example ex{0, 0, 0, mem.data(), mem.data() + S, mem.data() + 2 * S, mem.data() + 2 * S + P};
    ASSERT_EQ(dstp_shard_example(&sh, 1, 300, &ex, &err), DSTP_OK) << err.msg;
    EXPECT_EQ(ex.len, S - 1);
    EXPECT_EQ(ex.npred, 2);  // up to the first 0 position
    EXPECT_EQ(ex.pos[0], 3);
    EXPECT_EQ(ex.pos[1], 6);
    EXPECT_EQ(ex.labels[0], 101);
    EXPECT_EQ(ex.labels[1], 201);
    EXPECT_EQ(ex.nsp, 1);
    EXPECT_EQ(ex.types[S - 2], 1);
    // A vocabulary too small for the ids is refused with the element named.
    EXPECT_EQ(dstp_shard_example(&sh, 1, 20, &ex, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("input_ids"), std::string::npos) << err.msg;
    dstp_shard_free(&sh);

    // The loader over the shard: batches of 2, the last (shorter) batch kept, rows b·S + position.
    std::string vocab;
    for (int i = 0; i < 300; ++i) vocab += i < 5 ? std::string(kVocab).substr(0, 0) : "w" + std::to_string(i) + "\n";
    vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + vocab;
    const std::string vp = write_file("shard_vocab.txt", vocab);
    const char *shards[] = {p.c_str()};
    dstp_loader_config cfg{};
    cfg.shards = shards;
    cfg.num_shards = 1;
    cfg.vocab = vp.c_str();
    cfg.lower_case = 1;
    cfg.batch = 2;
    cfg.seed = 3;
    cfg.depth = 2;
    dstp_loader *l = nullptr;
    ASSERT_EQ(dstp_loader_create(&cfg, &l, &err), DSTP_OK) << err.msg;
    int seen = 0;
    for (int k = 0; k < 3; ++k) {
        const dstp_batch *b = nullptr;
        ASSERT_EQ(dstp_loader_next(l, &b, &err), DSTP_OK) << err.msg;
        EXPECT_EQ(b->batch, k < 2 ? 2 : 1);
        EXPECT_EQ(b->epoch, 0u);
        EXPECT_EQ(b->nrows, 2 * b->batch);
        for (int r = 0; r < b->nrows; ++r) {
            const int bi = b->rows[r] / S, s = b->rows[r] % S;
            EXPECT_TRUE(s == 3 || s == 5 || s == 6);
            EXPECT_EQ(bi, r / 2);
        }
        seen += b->batch;
    }
    EXPECT_EQ(seen, n);
    const dstp_batch *b = nullptr;
    ASSERT_EQ(dstp_loader_next(l, &b, &err), DSTP_OK);
    EXPECT_EQ(b->epoch, 1u) << "the stream goes on with the next epoch";
    dstp_loader_destroy(l);
}

TEST(PretrainShards, BadShards) {
    dstp_shard sh{};
    dstp_error err;
    EXPECT_EQ(dstp_shard_read(write_file("empty.hdf5", "").c_str(), &sh, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("empty"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_shard_read(write_file("text.hdf5", "not hdf5 at all").c_str(), &sh, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("not an HDF5 file"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_shard_read(temp_path("none.hdf5").c_str(), &sh, &err), DSTP_ERR_IO);
    EXPECT_EQ(dstp_shard_read(write_shard("missing.hdf5", 3, 8, 2, "next_sentence_labels").c_str(), &sh, &err),
              DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("dataset next_sentence_labels is missing"), std::string::npos) << err.msg;
    EXPECT_EQ(dstp_shard_read(write_shard("shape.hdf5", 3, 8, 2, nullptr, true).c_str(), &sh, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("disagree in shape"), std::string::npos) << err.msg;
}
#else
// A build without libhdf5 refuses every shard with the reason (dst-pretrain exits 4 with it).
TEST(PretrainShards, BuiltWithoutHdf5) {
    dstp_shard sh{};
    dstp_error err{};
    EXPECT_EQ(dstp_shard_read(write_file("any.hdf5", "not read").c_str(), &sh, &err), DSTP_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(err.msg).find("built without HDF5 support"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("any.hdf5"), std::string::npos) << err.msg;
}
#endif

// ---- the loader thread --------------------------------------------------------------------------------------

std::vector<std::vector<int32_t>> first_batches(int depth, uint64_t start, int count) {
    dstp_loader_config cfg{};
    const std::string corpus = corpus_path(), vocab = vocab_path();
    cfg.corpus = corpus.c_str();
    cfg.vocab = vocab.c_str();
    cfg.lower_case = 1;
    cfg.batch = 4;
    cfg.seq = 32;
    cfg.max_pred = 5;
    cfg.seed = 11;
    cfg.start_batch = start;
    cfg.depth = depth;
    dstp_loader *l = nullptr;
    dstp_error err;
    EXPECT_EQ(dstp_loader_create(&cfg, &l, &err), DSTP_OK) << err.msg;
    std::vector<std::vector<int32_t>> out;
    for (int k = 0; l && k < count; ++k) {
        const dstp_batch *b = nullptr;
        EXPECT_EQ(dstp_loader_next(l, &b, &err), DSTP_OK) << err.msg;
        if (!b) break;
        std::vector<int32_t> v(b->ids, b->ids + b->batch * b->seq);
        v.insert(v.end(), b->rows, b->rows + b->nrows);
        v.insert(v.end(), b->labels, b->labels + b->nrows);
        v.push_back(static_cast<int32_t>(b->index));
        out.push_back(v);
    }
    dstp_loader_destroy(l);
    return out;
}

TEST(PretrainLoader, DeterministicResumableAndStopsCleanly) {
    const auto a = first_batches(1, 0, 12), b = first_batches(6, 0, 12), c = first_batches(3, 5, 7);
    ASSERT_EQ(a.size(), 12u);
    EXPECT_EQ(a, b) << "the batches do not depend on how far ahead the thread works";
    ASSERT_EQ(c.size(), 7u);
    for (int k = 0; k < 7; ++k) EXPECT_EQ(c[k], a[5 + k]) << "start_batch 5, batch " << k;
    // Destroying while the thread waits for a free slot, or before anything was read, returns.
    first_batches(2, 0, 1);
    first_batches(2, 0, 0);
    // Bad configurations and data are reported by create.
    dstp_loader_config cfg{};
    dstp_loader *l = nullptr;
    dstp_error err;
    EXPECT_EQ(dstp_loader_create(&cfg, &l, &err), DSTP_ERR_ARG);
    const std::string vocab = vocab_path(), bad = write_file("loader_bad.txt", "\xff\n");
    cfg.vocab = vocab.c_str();
    cfg.corpus = bad.c_str();
    cfg.batch = 2;
    cfg.seq = 32;
    cfg.max_pred = 5;
    cfg.depth = 1;
    EXPECT_EQ(dstp_loader_create(&cfg, &l, &err), DSTP_ERR_FORMAT);
    EXPECT_NE(std::string(err.msg).find("not UTF-8"), std::string::npos) << err.msg;
    EXPECT_EQ(l, nullptr);
}

}  // namespace
