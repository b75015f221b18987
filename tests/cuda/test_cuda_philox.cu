// The flash attention kernels' Philox forms (kernels/attention_flash_impl.cuh) against the shared
// generator of kernels/philox.h, on the host: philox_group (19 wide multiplies per group, any group)
// and philox_group_m0 (17, for calls whose every group is below 2^32, from the product M0·group) must
// give the words of philox_dropout_block for every seed, offset and group, and make_params may set
// grp32 only when no kernel of the call draws a group at or past 2^32. The kernels call these very
// functions; the GPU tests and kernels/dev/attention_lab.cu compare the dropped sets they make.
// The CudaPhiloxForms tests need no GPU; CudaPhiloxDevice runs the same functions on the device
// (and skips itself where there is none).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention_flash_impl.cuh"

namespace {

using dst::Philox4;
using dst::cuda::flash::kPhiloxM0;
using dst::cuda::flash::Params;

Params params_for(uint64_t seed, uint64_t offset, int64_t batch = 1, int64_t heads = 1, int64_t seq = 128) {
    dst::cuda::AttentionArgs a;
    a.batch = batch;
    a.seq = seq;
    a.heads = heads;
    a.head_dim = 64;
    a.hidden = heads * 64;
    a.seed = seed;
    a.offset = offset;
    a.threshold = dst::dropout_threshold(0.1);
    a.drop_scale = 1.0 / 0.9;
    return dst::cuda::flash::make_params(a);
}

bool same(const uint4 &w, const Philox4 &r) {
    return w.x == r.v[0] && w.y == r.v[1] && w.z == r.v[2] && w.w == r.v[3];
}

TEST(CudaPhiloxForms, BothFormsGiveTheGeneratorsWords) {
    const uint64_t seeds[] = {0, 0x1234567890ULL, 0xFFFFFFFFFFFFFFFFULL, 0x9E3779B97F4A7C15ULL};
    const uint64_t offsets[] = {0, 77, (uint64_t(1) << 32) + 5, 0xFFFFFFFFFFFFFFFEULL};
    std::mt19937_64 rng(2026);
    for (uint64_t seed : seeds)
        for (uint64_t offset : offsets) {
            const Params p = params_for(seed, offset);
            std::vector<uint64_t> small = {0, 1, 2, 3, 0x7FFFFFFFULL, 0x80000000ULL, 0xFFFFFFFEULL, 0xFFFFFFFFULL};
            for (int i = 0; i < 500; ++i) small.push_back(rng() & 0xFFFFFFFFULL);
            for (uint64_t g : small) {
                const Philox4 r = dst::philox_dropout_block(seed, offset, g);
                ASSERT_TRUE(same(dst::cuda::flash::philox_group(p, p.r0c, g), r)) << "seed " << seed << " offset " << offset << " group " << g;
                ASSERT_TRUE(same(dst::cuda::flash::philox_group_m0(p, p.r0c, uint64_t(kPhiloxM0) * g), r))
                    << "17-multiply form, seed " << seed << " offset " << offset << " group " << g;
            }
            // Past 2^32 only the general form applies.
            for (int i = 0; i < 200; ++i) {
                const uint64_t g = (uint64_t(1) << 32) + (rng() >> 2);
                ASSERT_TRUE(same(dst::cuda::flash::philox_group(p, p.r0c, g), dst::philox_dropout_block(seed, offset, g)))
                    << "seed " << seed << " offset " << offset << " group " << g;
            }
        }
}

// A call whose offset's high word is read as the kernel runs (AttentionArgs::offset_hi, a training forward
// captured into a CUDA graph): philox_r0c folds the word in, and both forms give the generator's words
// for the offset with that high word and the host's low word (whatever high word the host offset had).
TEST(CudaPhiloxForms, OffsetHighWordReadAtRunTime) {
    const uint64_t seeds[] = {0, 0x1234567890ULL, 0xFFFFFFFFFFFFFFFFULL};
    const uint32_t his[] = {0u, 1u, 0x80000000u, 0xFFFFFFFFu};
    std::mt19937_64 rng(11);
    for (uint64_t seed : seeds)
        for (uint32_t lo : {0u, 2u, 0xFFFFFFFFu})
            for (uint32_t hi : his) {
                dst::cuda::AttentionArgs a;
                a.batch = a.heads = 1;
                a.seq = 128;
                a.head_dim = 64;
                a.hidden = 64;
                a.seed = seed;
                a.offset = (uint64_t(0xABCDu) << 32) | lo;  // the high word is replaced
                a.offset_hi = &hi;
                a.threshold = dst::dropout_threshold(0.1);
                a.drop_scale = 1.0 / 0.9;
                const Params p = dst::cuda::flash::make_params(a);
                const uint32_t r0c = dst::cuda::flash::philox_r0c(p);
                const uint64_t offset = (uint64_t(hi) << 32) | lo;
                EXPECT_EQ(dst::dropout_offset(a.offset, a.offset_hi), offset);
                for (int i = 0; i < 200; ++i) {
                    const uint64_t g = i % 2 ? rng() & 0xFFFFFFFFULL : rng() >> 1;
                    const Philox4 r = dst::philox_dropout_block(seed, offset, g);
                    ASSERT_TRUE(same(dst::cuda::flash::philox_group(p, r0c, g), r))
                        << "seed " << seed << " offset " << offset << " group " << g;
                    if (g <= 0xFFFFFFFFULL)
                        ASSERT_TRUE(same(dst::cuda::flash::philox_group_m0(p, r0c, uint64_t(kPhiloxM0) * g), r))
                            << "17-multiply form, seed " << seed << " offset " << offset << " group " << g;
                }
            }
}

// The kernels form M0·group from a per-tile product and additions along a lane's groups (the forward:
// a row's 2S groups and a column block's 4; the backward: 2S per query block). At the largest groups
// the bound allows the sums still equal the product, and give the generator's words.
TEST(CudaPhiloxForms, ProductsByAdditionMatchAtTheBound) {
    const Params p = params_for(5, 9);
    const uint64_t S = 2048;
    const uint64_t g0 = 0xFFFFFFFFULL - 7 * 2 * S - 12;  // the last groups below 2^32
    uint64_t m0 = uint64_t(kPhiloxM0) * uint32_t(g0);
    for (int nt = 0; nt < 8; ++nt, m0 += uint64_t(kPhiloxM0) * uint32_t(2 * S)) {
        const uint64_t g = g0 + uint64_t(nt) * 2 * S;
        ASSERT_LE(g, 0xFFFFFFFFULL);
        EXPECT_EQ(m0, uint64_t(kPhiloxM0) * g);
        for (int G = 0; G < 4; ++G)
            EXPECT_TRUE(same(dst::cuda::flash::philox_group_m0(p, p.r0c, m0 + uint64_t(kPhiloxM0) * uint64_t(4 * G)),
                             dst::philox_dropout_block(5, 9, g + 4 * G)))
                << "group " << g + 4 * G;
    }
}

// grp32 only where every group a kernel can draw is below 2^32: rows up to a 128-row tile past the
// last, keys up to a 256-key tile past the last (more than any kernel's tiles).
TEST(CudaPhiloxForms, Grp32OnlyBelowTheBound) {
    struct Shape {
        int64_t b, h, s;
        bool expect;  // the BERT-Large shapes of the benchmarks take the 17-multiply form
    } shapes[] = {{64, 16, 128, true},  {16, 16, 512, true},   {8, 16, 2048, true},   {2, 16, 8192, true},
                  {1, 16, 16384, true}, {1, 16, 32768, false}, {4096, 16, 2048, false}, {3, 2, 1, true}};
    for (const Shape &sh : shapes) {
        const Params p = params_for(1, 2, sh.b, sh.h, sh.s);
        EXPECT_EQ(p.grp32, sh.expect) << sh.b << "x" << sh.h << "x" << sh.s;
    }
    // Around the edge: the largest group a kernel draws against grp32, batch by batch.
    auto edge = [](int64_t S, int64_t h, int64_t b_lo, int64_t b_hi) {
        int on = 0, off = 0;
        for (int64_t b = b_lo; b <= b_hi; ++b) {
            const Params p = params_for(1, 2, b, h, S);
            const uint64_t max_row = uint64_t(b * h - 1) * S + ((S + 127) / 128) * 128 - 1;
            const uint64_t max_key = ((S + 255) / 256) * 256 - 1;
            const uint64_t max_group = max_row * uint64_t(S / 4) + max_key / 4;
            if (p.grp32) EXPECT_LE(max_group, 0xFFFFFFFFULL) << "S " << S << " batch " << b;
            // and no more than about a row of groups lost to the bound's simpler overhang
            const uint64_t slack = uint64_t(S / 4) * uint64_t(S + 2) + 64;
            if (max_group + slack <= 0xFFFFFFFFULL) EXPECT_TRUE(p.grp32) << "S " << S << " batch " << b;
            (p.grp32 ? on : off) += 1;
        }
        EXPECT_GT(on, 0) << "S " << S;
        EXPECT_GT(off, 0) << "S " << S;
    };
    edge(2048, 16, 200, 300);                     // 2^32 groups at batch 256: steps of 2^24 groups
    edge(4, 1, 1073741784 - 40, 1073741784 + 8);  // steps of one group: the tiles' overhang decides
}

// ---- on the device (label cuda) ------------------------------------------------------------------
// The same functions compiled for and run on the device, where ptxas forms the kernels' products:
// out[2·i] the general form of group i, out[2·i + 1] the 17-multiply form (groups below 2^32; the
// general form above).
__global__ void device_groups(Params p, const uint64_t *groups, int n, uint4 *out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint64_t g = groups[i];
    out[2 * i] = dst::cuda::flash::philox_group(p, p.r0c, g);
    out[2 * i + 1] = g <= 0xFFFFFFFFULL ? dst::cuda::flash::philox_group_m0(p, p.r0c, uint64_t(kPhiloxM0) * g)
                                        : dst::cuda::flash::philox_group(p, p.r0c, g);
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

TEST(CudaPhiloxDevice, BothFormsGiveTheGeneratorsWords) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        (void)cudaGetLastError();  // clear the runtime's error of a machine without a device
        GTEST_SKIP() << "no CUDA device";
    }
    std::mt19937_64 rng(7);
    std::vector<uint64_t> groups = {0, 1, 2, 3, 0x7FFFFFFFULL, 0x80000000ULL, 0xFFFFFFFEULL, 0xFFFFFFFFULL,
                                    uint64_t(1) << 32, 0xFFFFFFFFFFFFFFFFULL};
    for (int i = 0; i < 4000; ++i) groups.push_back(i % 2 ? rng() : rng() & 0xFFFFFFFFULL);
    const int n = static_cast<int>(groups.size());
    struct Free {  // the buffers go back on every exit, a failed assertion's included
        void *&a, *&b;
        ~Free() { cudaFree(a), cudaFree(b); }
    };
    void *pg = nullptr, *po = nullptr;
    Free free_both{pg, po};
    CUDA_OK(cudaMalloc(&pg, groups.size() * sizeof(uint64_t)));
    CUDA_OK(cudaMalloc(&po, groups.size() * 2 * sizeof(uint4)));
    uint64_t *const dg = static_cast<uint64_t *>(pg);
    uint4 *const dout = static_cast<uint4 *>(po);
    CUDA_OK(cudaMemcpy(dg, groups.data(), groups.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
    const uint64_t seeds[] = {0, 0xFFFFFFFFFFFFFFFFULL, 0x9E3779B97F4A7C15ULL};
    const uint64_t offsets[] = {0, 77, 0xFFFFFFFFFFFFFFFEULL};
    std::vector<uint4> out(groups.size() * 2);
    for (uint64_t seed : seeds)
        for (uint64_t offset : offsets) {
            const Params p = params_for(seed, offset);
            device_groups<<<(n + 127) / 128, 128>>>(p, dg, n, dout);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * sizeof(uint4), cudaMemcpyDeviceToHost));
            for (int i = 0; i < n; ++i) {
                const Philox4 r = dst::philox_dropout_block(seed, offset, groups[size_t(i)]);
                for (int f = 0; f < 2; ++f)
                    ASSERT_TRUE(same(out[size_t(2 * i + f)], r))
                        << (f ? "17-multiply" : "general") << " form, seed " << seed << " offset " << offset
                        << " group " << groups[size_t(i)];
            }
        }
}

}  // namespace
