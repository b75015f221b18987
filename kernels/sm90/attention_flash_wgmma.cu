// The wgmma flash attention kernels (kernels/attention_flash_wgmma.cuh) for fp16 and bf16, head dim
// 64. This file alone is compiled for sm_90a (the CMake target dst_sm90, CUDA_ARCHITECTURES
// 90a-real), when CMAKE_CUDA_ARCHITECTURES lists 90; the library then defines DST_WITH_SM90A and
// flash::fwd / flash::bwd send the calls wgmma_runs() accepts here.
#include "kernels/attention_flash_ws.cuh"

namespace dst {
namespace cuda {
namespace flash {

// The lab's w9 (kernels/attention_flash_ws.cuh: a TMA producer warpgroup, three consumer warpgroups)
// from ws::kMinSeq keys on (ws::launch runs the wgmma forward itself where it does not apply); below,
// the wgmma forward: key tiles of 64 at kFwdWgmmaBlocks<64> = 4 blocks per SM (the lab's w11: 128
// registers, 16 bytes of spill; against w1's 3 blocks per SM at 168 registers, H100 2026-12-05: 64×128
// −7 % with dropout and −12 % without, 16×512 to 8×2048 within ±1 %; bench/RESULTS.md), an item of two
// key tiles (S ≤ 128) copying both before its first product (the lab's w14, H100 2026-12-06: 64×128
// −8 % without dropout, −0 to −2 % with; an item with more key tiles keeps its one-ahead copies,
// 16×512 and longer within ±1 %). The same bits.
cudaError_t fwd_wgmma(const Params &p, bool bf16, cudaStream_t stream) {
    if (p.seq >= ws::kMinSeq)
        return bf16 ? ws::launch<__nv_bfloat16, 3, 64>(p, stream) : ws::launch<__half, 3, 64>(p, stream);
    constexpr int mb = kFwdWgmmaBlocks<64>;
    return bf16 ? launch_fwd_wgmma<__nv_bfloat16, 64, mb, true>(p, stream)
                : launch_fwd_wgmma<__half, 64, mb, true>(p, stream);
}

// The lab's b11: two warpgroups, 128 keys per block, query tiles of 64, 1 block per SM, the partial
// dQ on warpgroup MMAs; the lab's b14: b11 with a third warpgroup making the dQ adds. Deterministic,
// b14 from kWriterMinSeq keys on with dropout; measured against b11 (fp16, 16 heads, dropout 0.1):
// 16×1024 −4 %, 8×2048 −9 %, 2×8192 −14 %; but 16×512 +7 %, 64×128 +24 %, and without dropout +1 % at
// 8×2048 (bench/RESULTS.md, 2026-12-04). Stochastic, b14 from kStochWriterMinSeq keys on, with or
// without dropout, its adds bulk reductions since then: against b11, 16×512 −6 %, 8×2048 −9 %, −14 %
// without dropout (bench/RESULTS.md, 2026-12-04, eighth session); shorter sequences (two or three key
// blocks) keep b11, as b14 was not timed there.
// The order of the query tiles (and, deterministic, of a tile's dQ adds): the step order (each key
// block starts at its own query tile) unless the ascending one (every key block walks the tiles from
// the first, a tile's adds in ticket order) measured faster on the H200: in stochastic mode from
// S = 512 (3–6 %: no turns to wait for, and the blocks of a (batch, head) work on the same query
// tile at about the same time), and deterministic from kAscendingMinSeq keys on, where a (batch,
// head) whose blocks straddle two waves of the dispatch makes the step order wait (2×8192: 8 % with
// key lengths, 1 % without; 1×16384: 4 %), while at S ≤ 4096 the ascending order's turns cost 3–10 %
// more (bench/RESULTS.md, 2026-12-04, ninth session). Causal calls keep the step order (descending
// key blocks from the diagonal).
constexpr int kWriterMinSeq = 1024, kStochWriterMinSeq = 512, kAscendingMinSeq = 8192;
cudaError_t bwd_wgmma(const Params &p, bool bf16, cudaStream_t stream) {
    constexpr int kW = kWgBwdWarpgroups;
    const bool ascending = !p.causal && p.seq >= (p.deterministic ? kAscendingMinSeq : kStochWriterMinSeq);
    const int order = ascending ? 0 : -1;
    if (p.deterministic ? p.dropout && p.seq >= kWriterMinSeq : p.seq >= kStochWriterMinSeq)
        return bf16 ? launch_bwd_wgmma<__nv_bfloat16, 64, 1, kW, kDqWriter>(p, stream, order)
                    : launch_bwd_wgmma<__half, 64, 1, kW, kDqWriter>(p, stream, order);
    return bf16 ? launch_bwd_wgmma<__nv_bfloat16, 64, 1, kW, kDqWgmma>(p, stream, order)
                : launch_bwd_wgmma<__half, 64, 1, kW, kDqWgmma>(p, stream, order);
}

}  // namespace flash
}  // namespace cuda
}  // namespace dst
