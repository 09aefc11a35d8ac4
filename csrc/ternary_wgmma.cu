// Large-M ternary GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only):
// y[M, N] = x[M, K] @ W^T (+ bias). No bf16 copy of W exists anywhere: codes are decoded in
// registers straight into wgmma's A operand, as CUTLASS's mixed-input GEMM and Machete do.
//
// The weights are wgmma's A side (M = 64 W rows a warpgroup, from registers) and the activations
// its B side (N = the token tile, from shared memory): "swap AB". Each W row's codes are decoded
// by exactly one thread pair-wise into the m16n8k16-style A fragment of its warp, so a CTA
// decodes its 128 x 64 W tile once per k-step, and no decoded tile goes through shared memory
// (v4 did that: a 16 KB store, fence.proxy.async and an mbarrier hand-off every k-step, ~0.75
// us a k-step whatever the work; docs/notes/kernel_notes.md v8, v9).
//
//   Persistent CTAs, one an SM, each walking tiles of 128 W rows x BM tokens (BM = 256 or 128,
//   choose_wgmma_tiling); or, split-K, a cluster of 2, 4 or 8 CTAs a tile, each one run of its
//   k-steps, that add their partial tiles through distributed shared memory (split_k_reduce)
//   where the tiles alone leave SMs idle (mid M); 3 warpgroups:
//     producer (warpgroup 2, one thread; setmaxnreg gives its registers away): TMA copies of
//       each k-step's activation tile (BM x 64 bf16, 128-byte swizzle, as wgmma's B reads it) and
//       code tile (128 rows x 16 B) into stage k % STAGES, counted on full[s]; waits empty[s]
//       before refilling a stage;
//     MMA (warpgroups 0, 1: W rows 0-63, 64-127): wait full[s]; decode the stage's codes x scale
//       into A fragments (two sets: k-step k + 1 is decoded while k-step k's wgmma runs); 4 wgmma
//       m64 x nBM x k16; wait for k-step k - 1's, free its stage (empty). At a tile's end: the
//       output through stmatrix and shared memory to y, 128 tokens at a time, while the producer
//       already fills the stages with the next tile's k-steps and the next tile's scales load.
//
//                    K (64 a k-step) ->
//   x tile  [BM tok x 64] bf16 --(TMA)----------------------------------- B (shared memory) --+
//   codes   [128 rows x 16 B]  --(TMA)--> each thread: 2 rows x 16 weights, x scale --> A (registers) --+-> wgmma
//
// Why 256 tokens: the decode (~6 instructions a weight pair, ~440 cycles a k-step for the CTA's
// W tile) costs the same at 128 and 256 tokens; at 128 it is longer than the k-step's wgmma and
// shows (gate_up M 4096: 118 us), at 256 it hides under twice the tensor-core work (84 us;
// cuBLAS 76-78). Persistent CTAs (the prologue's copies and scale loads overlap the previous
// tile's epilogue) and 4 stages: 78 us. Measured with benchmarks/probes/wgmma_probe.cu (float64
// check, per-k-step clock64 trace).
//
// Requires (checked by the host): an sm_90 device; K % 8 == 0, x and packed 16-byte aligned and
// rows padded to 16 bytes (ternary_plugin.ops.pad_packed_rows): the TMA's row strides and
// addresses; block_size and k_offset multiples of 64 (a k-step inside one scale block); at most
// kWgmmaMaxScaleCols scale blocks a row.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"
#include "ternary_wgmma.h"
#include "ternary_wgmma.cuh"

// Probe hooks, empty here: benchmarks/probes/wgmma_probe.cu defines them to time each role's
// k-steps (clock64 per event) and to switch parts off, so the pipeline can be measured piece by
// piece on the GPU without a second copy of the kernel. WGMMA_PROBE bits: 1 skip the decode,
// 2 skip the wgmma. Every mbarrier wait and arrive stays in each case (a skipped wait hangs the
// pipeline).
#ifndef WGMMA_EVENT
#define WGMMA_EVENT(cond, role, kt)
#endif
#ifndef WGMMA_FLUSH
#define WGMMA_FLUSH(cond, role, n)
#endif
#ifndef WGMMA_PROBE
#define WGMMA_PROBE 0
#endif

namespace ternary {
namespace {

using namespace wg;

constexpr int kBK = kWgmmaStepK;                     // weights of K a k-step: one 128-byte swizzle row of bf16
constexpr int kRow = kBK * 2;                        // bytes of a tile row

// Pipeline stages at each tile width: 4 of 34 KB at 256 tokens, 6 of 18 KB at 128.
template <int BM>
constexpr int kStagesOf = BM == 256 ? 4 : 6;

template <int STAGES, int kBM>
struct WgShape {
  static constexpr int kXBytes = kBM * kRow, kCBytes = kBN * (kBK / 4);
  static constexpr int kScaleBytes = kBN * kWgmmaMaxScaleCols * 2;  // one tile's scales, [block][row]
  static constexpr int kOutLd = kBN + 8;                            // output staging row ([token][W row]), padded
  // [activation stages | code stages | scales of two tiles | output tile | mbarriers]; the
  // activation stages 1024-byte aligned from the base. mbarriers: full[STAGES], empty[STAGES].
  // The output tile has its own space: the producer refills the stages for the next tile while
  // the MMA warpgroups write this one out.
  static constexpr int kCOff = STAGES * kXBytes, kSOff = kCOff + STAGES * kCBytes;
  static constexpr int kOutTokens = 128;  // the output tile goes out 128 tokens at a time
  static constexpr int kOutOff = kSOff + 2 * kScaleBytes, kBarOff = kOutOff + kOutTokens * kOutLd * 2;
  static constexpr int kSmemBytes = kBarOff + 2 * STAGES * 8 + 1024;  // + alignment
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (m64 x nBM, fp32: d[4j + 2h + e] is row 16 * warp + lane / 4 + 8h, column 8j + 2 (lane % 4) + e,
// the m16n8 C-fragment layout repeated) += A (m64 x k16) * B (k16 x nBM). A from registers: a[0..3]
// as the m16n8k16 A fragment of the warp's 16 rows (a[0]: row lane / 4, k 2 (lane % 4) + {0, 1};
// a[1]: row + 8; a[2], a[3]: k + 8); B from shared memory (descriptor db).
#define TERNARY_WGMMA_RS_N128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
#define TERNARY_WGMMA_RS_N256(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
               "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
template <typename T, int BM>
__device__ __forceinline__ void wgmma_rs(float (&d)[BM / 2], const uint32_t (&a)[4], uint64_t db) {
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (BM == 128) {
    if constexpr (bf) TERNARY_WGMMA_RS_N128("bf16");
    else TERNARY_WGMMA_RS_N128("f16");
  } else {
    static_assert(BM == 256, "tiles of 128 or 256 tokens");
    if constexpr (bf) TERNARY_WGMMA_RS_N256("bf16");
    else TERNARY_WGMMA_RS_N256("f16");
  }
}
#undef TERNARY_WGMMA_RS_N128
#undef TERNARY_WGMMA_RS_N256

#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One k-step's A fragments of a thread (4 k16 steps x 4 registers): its warp's W rows r0 = lane / 4
// and r0 + 8, weights 2t, 2t + 1, 2t + 8, 2t + 9 of each 16 (t = lane % 4), times the rows' scales.
// Those are the low nibbles of code bytes t / 2 and 2 + t / 2 of each 16-weight word after a shift
// by 4 (t % 2) bits.
template <typename T>
__device__ __forceinline__ void decode_fragments(uint32_t (&a)[4][4], const uint4& c0, const uint4& c1, int t,
                                                 uint32_t s0, uint32_t s1) {
  const uint32_t w0[4] = {c0.x, c0.y, c0.z, c0.w}, w1[4] = {c1.x, c1.y, c1.z, c1.w};
  const int shift = 4 * (t & 1), lo = t >> 1;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t u0 = w0[q] >> shift, u1 = w1[q] >> shift;
    a[q][0] = mul2<T>(decode_nibble<T>(u0, lo), s0);
    a[q][1] = mul2<T>(decode_nibble<T>(u1, lo), s1);
    a[q][2] = mul2<T>(decode_nibble<T>(u0, lo + 2), s0);
    a[q][3] = mul2<T>(decode_nibble<T>(u1, lo + 2), s1);
  }
}
#endif


// Persistent: gridDim.x CTAs (at most one per SM) take tiles blockIdx.x, + gridDim.x, ...
// (tile t: W rows 128 (t % tiles_n), tokens BM (t / tiles_n)); the producer runs on into the
// next tile's k-steps while the MMA warpgroups write the last one out, so only the first tile
// waits for its copies, and the next tile's scales are loaded during the epilogue.
template <typename T, int STAGES, int BM, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
ternary_wgmma_kernel(const __grid_constant__ CUtensorMap x_map,     // x [M, K]: boxes 64 x BM, 128-byte swizzle
                     const __grid_constant__ CUtensorMap code_map,  // packed [N, ldp]: boxes 16 B x 128 rows
                     const __half* __restrict__ scale,              // [N, lds]
                     const T* __restrict__ bias,                    // [N] or nullptr
                     T* __restrict__ y,                             // [M, N]
                     int M, int N, int K, int lds, int block_size, int k_offset, int splits) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<STAGES, BM>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_s & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full_bar = smem_s + S::kBarOff, empty_bar = full_bar + 8 * STAGES;  // + 8 s: stage s's
  const int tid = threadIdx.x;
  const int steps = (K + kBK - 1) / kBK;
  const int tiles_n = (N + kBN - 1) / kBN, tiles = tiles_n * ((M + BM - 1) / BM);
  // SPLIT (splits 2, 4 or 8): the CTAs blockIdx.x / splits * splits .. + splits - 1 are one
  // cluster and share one tile's K, each its own run of k-steps (the host launches exactly tiles
  // x splits CTAs); rank == the CTA's rank in its cluster (cluster dims (splits, 1, 1)). Not
  // SPLIT: persistent CTAs, all of K (a template parameter, so that this code is what it was
  // before the split: a runtime one cost 5-10 % at M 4096, registers and spills).
  const int first_tile = SPLIT ? blockIdx.x / splits : blockIdx.x;
  const int tile_stride = SPLIT ? gridDim.x / splits : gridDim.x, rank = SPLIT ? blockIdx.x % splits : 0;
  const int kt0 = SPLIT ? rank * steps / splits : 0;
  const int nk = SPLIT ? (rank + 1) * steps / splits - kt0 : steps;  // this CTA's k-steps

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                 // the producer's arrive, with the TMA's bytes
      mbar_init(empty_bar + 8 * s, kMmaThreads / 32);  // lane 0 of each MMA warp, its wgmma done
    }
  }
  __syncthreads();  // the last CTA-wide barrier: the roles part here

  if (tid >= kMmaThreads) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (tid == kMmaThreads) {
      int it = 0;  // k-steps copied so far, all tiles: stage it % STAGES, round it / STAGES
      for (int tile = first_tile; tile < tiles; tile += tile_stride) {
        const int n0 = (tile % tiles_n) * kBN, m0 = (tile / tiles_n) * BM;
        for (int kt = 0; kt < nk; ++kt, ++it) {
          const int s = it % STAGES;
          mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);  // round 0 passes at once
          const uint32_t bar = full_bar + 8 * s;
          WGMMA_EVENT(tile == (int)blockIdx.x, 0, kt);
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                       "n"(S::kXBytes + S::kCBytes) : "memory");
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
              "%3}], [%4];\n" ::"r"(smem_s + s * S::kXBytes), "l"(reinterpret_cast<uint64_t>(&x_map)), "r"((kt0 + kt) * kBK),
              "r"(m0), "r"(bar)
              : "memory");
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
              "%3}], [%4];\n" ::"r"(smem_s + S::kCOff + s * S::kCBytes), "l"(reinterpret_cast<uint64_t>(&code_map)),
              "r"((kt0 + kt) * (kBK / 4)), "r"(n0), "r"(bar)
              : "memory");
        }
      }
      WGMMA_FLUSH(true, 0, nk);
    }
    if constexpr (SPLIT) {  // the MMA warpgroups' two cluster barriers (the split-K reduction below)
      __syncwarp();    // the copying lane rejoins its warp (the barriers are .aligned)
      cluster_barrier<false>();
      cluster_barrier<true>();
    }
    return;
  }

  // MMA warpgroups: wg takes W rows 64 wg .. 64 wg + 63 of the tile (the wgmma's M side, A from
  // registers), all BM tokens (its N side, B = the activation tile in shared memory).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMmaRegs));
  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, t = lane % 4;
  const int r0 = wg * 64 + warp * 16 + lane / 4;  // this thread's W rows r0, r0 + 8
  // A tile's scale blocks go to shared memory as [block][row] (rows past N read row N - 1: never
  // stored), into one of two buffers by tile parity; the host checks they fit
  // kWgmmaMaxScaleCols. Thread tid loads row tid / 2, blocks tid % 2, + 2, ...: the first 16 of
  // them (K up to 4096 at 128-weight blocks) are loaded before the previous tile's epilogue and
  // stored after it; any further ones are loaded and stored after it.
  const int col0 = k_offset / block_size, cols = (k_offset + K - 1) / block_size - col0 + 1;
  const int srow = tid / 2;
  auto scale_row = [&](int n0) {
    return reinterpret_cast<const unsigned short*>(scale) + (size_t)min(n0 + srow, N - 1) * lds + col0;
  };
  auto load_scales = [&](int n0, int c0, unsigned short (&v)[16]) {
    const unsigned short* sg = scale_row(n0);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = c0 + 2 * i < cols ? __ldg(sg + c0 + 2 * i) : 0;
  };
  auto store_scales = [&](int c0, const unsigned short (&v)[16], unsigned short* ssc) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (c0 + 2 * i < cols) ssc[(c0 + 2 * i) * kBN + srow] = v[i];
  };
  auto scale_buffer = [&](int tcount) {
    return reinterpret_cast<unsigned short*>(smem + S::kSOff + (tcount & 1) * S::kScaleBytes);
  };
  auto rest_of_scales = [&](int n0, unsigned short* ssc) {  // blocks past the first 32
    for (int c0 = 32 + tid % 2; c0 < cols; c0 += 32) {
      unsigned short v[16];
      load_scales(n0, c0, v);
      store_scales(c0, v, ssc);
    }
  };
  {
    unsigned short v[16];
    const int n0 = (first_tile % tiles_n) * kBN;
    load_scales(n0, tid % 2, v);
    store_scales(tid % 2, v, scale_buffer(0));
    rest_of_scales(n0, scale_buffer(0));
  }
  mma_sync();
  const int steps_per_block = block_size / kBK;  // the scale block advances every steps_per_block k-steps

  int it = 0;  // k-steps consumed so far, all tiles (the producer's count)
  int tcount = 0;
  for (int tile = first_tile; tile < tiles; tile += tile_stride, ++tcount) {
    const int n0 = (tile % tiles_n) * kBN, m0 = (tile / tiles_n) * BM;
    [[maybe_unused]] const bool first = tcount == 0;  // probe events: the first tile's k-steps
    const unsigned short* ssc = scale_buffer(tcount);
    // the k-step's scale block (relative to col0) and k-step within it, counted from kt0
    int col = (k_offset + kt0 * kBK) / block_size - col0, step_in_block = (k_offset + kt0 * kBK) % block_size / kBK;

    // Waits for k-step kt's stage and decodes its A fragments (the codes of rows r0, r0 + 8).
    auto decode = [&](uint32_t (&a)[4][4], int kt) {
      const int g = it + kt;
      mbar_wait(full_bar + 8 * (g % STAGES), (g / STAGES) & 1);
      WGMMA_EVENT(tid == 0 && first, 1, kt);
      const uint8_t* codes = smem + S::kCOff + (g % STAGES) * S::kCBytes;
      const uint4 c0 = *reinterpret_cast<const uint4*>(codes + r0 * (kBK / 4));
      const uint4 c1 = *reinterpret_cast<const uint4*>(codes + (r0 + 8) * (kBK / 4));
      const uint32_t s0 = scale_pair<T>(ssc[col * kBN + r0]), s1 = scale_pair<T>(ssc[col * kBN + r0 + 8]);
      if (++step_in_block == steps_per_block) step_in_block = 0, ++col;
      if constexpr (!(WGMMA_PROBE & 1)) decode_fragments<T>(a, c0, c1, t, s0, s1);
      WGMMA_EVENT(tid == 0 && first, 2, kt);
    };
    // Issues k-step kt's wgmma (A = a), then waits for k-step kt - 1's and frees its stage.
    auto mma = [&](float (&acc)[BM / 2], const uint32_t (&a)[4][4], int kt) {
      const int g = it + kt;
      fence_accumulators(acc);
      wgmma_arrive();
      const uint32_t xb = smem_s + (g % STAGES) * S::kXBytes;
#pragma unroll
      for (int k16 = 0; k16 < kBK / 16 && !(WGMMA_PROBE & 2); ++k16)
        wgmma_rs<T, BM>(acc, a[k16], sw128_desc(xb + 32 * k16));
      wgmma_commit();
      WGMMA_EVENT(tid == 0 && first, 3, kt);
      wgmma_wait<1>();
      fence_accumulators(acc);
      WGMMA_EVENT(tid == 0 && first, 4, kt);
      if (kt > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((g - 1) % STAGES));
    };

    float acc[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
    // Two fragment sets: k-step kt + 1 is decoded into one while k-step kt's wgmma reads the other.
    uint32_t a0[4][4], a1[4][4];
    decode(a0, 0);
    for (int kt = 0; kt < nk; kt += 2) {
      mma(acc, a0, kt);
      if (kt + 1 >= nk) break;
      decode(a1, kt + 1);
      mma(acc, a1, kt + 1);
      if (kt + 2 < nk) decode(a0, kt + 2);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    it += nk;
    if (lane == 0) mbar_arrive(empty_bar + 8 * ((it - 1) % STAGES));  // the tile's last stage

    // This CTA writes the tile's tokens [t_lo, t_hi): all of them, or with splits > 1 its share
    // (BM / splits tokens), after adding every CTA's partial sums of it.
    int t_lo = 0, t_hi = BM;
    if constexpr (SPLIT) {
      float* red = reinterpret_cast<float*>(smem);
      if (splits == 2) split_k_reduce<BM, STAGES, 2>(acc, red, rank, tid);
      else if (splits == 4) split_k_reduce<BM, STAGES, 4>(acc, red, rank, tid);
      else split_k_reduce<BM, STAGES, 8>(acc, red, rank, tid);  // the host launches 2, 4 or 8
      t_lo = rank * (BM / splits), t_hi = t_lo + BM / splits;
    }

    // The next tile's first scale blocks, in flight through the epilogue.
    const int next = tile + tile_stride, next_n0 = (next % tiles_n) * kBN;
    unsigned short next_scales[16];
    if (next < tiles) load_scales(next_n0, tid % 2, next_scales);

    // The output tile in shared memory as [token][W row] (bias added, rounded once), by stmatrix
    // .trans: a thread's pair (d[4j + 2h], d[4j + 2h + 1]) is two tokens of W row r0 + 8h, the
    // m8n8 fragment layout, and four 8 x 8 blocks (tokens 8j .. 8j + 15 x the warp's 16 W rows)
    // go out transposed in one instruction; lane 8k + i names row i of block k. Rows 272 bytes
    // apart: the 8 rows of a block hit 8 different 4-bank groups ...
    T* out = reinterpret_cast<T*>(smem + S::kOutOff);
    using T2 = typename MmaTraits<T>::T2;
    float bv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + r0 + 8 * h;
      bv[h] = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
    }
    const int blk = lane / 8;
    const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(
        out + (8 * (blk / 2) + lane % 8) * S::kOutLd + wg * 64 + warp * 16 + 8 * (blk % 2)));
#pragma unroll
    for (int part = 0; part < BM / S::kOutTokens; ++part) {  // tokens [lo, hi) of this part, staged
      const int lo = max(t_lo, part * S::kOutTokens), hi = min(t_hi, (part + 1) * S::kOutTokens);
      if (lo >= hi) continue;
      if (lo > t_lo) mma_sync();  // the previous part is written out
#pragma unroll
      for (int jj = 0; jj < S::kOutTokens / 8; jj += 2) {
        const int j = part * (S::kOutTokens / 8) + jj;  // tokens 8 j .. 8 j + 15
        if (8 * j < lo || 8 * j >= hi) continue;
        uint32_t r[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // block q: tokens 8 (j + q / 2) .., W rows + 8 (q % 2)
          const int i = 4 * (j + q / 2) + 2 * (q % 2);
          const T2 v{Vec<T>::from_float(acc[i] + bv[q % 2]), Vec<T>::from_float(acc[i + 1] + bv[q % 2])};
          r[q] = *reinterpret_cast<const uint32_t*>(&v);
        }
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         row_addr + (8 * j - lo) * S::kOutLd * (int)sizeof(T)),
                     "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
      }
      mma_sync();
      WGMMA_EVENT(tid == 0 && first && lo == t_lo, 5, 0);
      // ... then written a token row at a time
      store_tile<T, S::kOutTokens, kBN>(out, S::kOutLd, y, min(M, m0 + hi), N, m0 + lo, n0, tid, kMmaThreads);
    }
    if (next < tiles) {
      store_scales(tid % 2, next_scales, scale_buffer(tcount + 1));
      rest_of_scales(next_n0, scale_buffer(tcount + 1));
    }
    mma_sync();  // the next tile's scales stored, this one's output read: both buffers free to reuse
  }
  WGMMA_FLUSH(tid == 0, 1, nk);
  WGMMA_FLUSH(tid == 0, 2, nk);
  WGMMA_FLUSH(tid == 0, 3, nk);
  WGMMA_FLUSH(tid == 0, 4, nk);
  WGMMA_FLUSH(tid == 0, 5, 1);
#endif  // other targets: never launched (the host checks for an sm_90 device)
}

// Output tiles of 128 W rows x bm tokens (the kernel's grid-stride loop over them, the host's
// grid and tile rules)
long tile_count(int M, int N, int bm) { return (long)((N + kBN - 1) / kBN) * ((M + bm - 1) / bm); }


// The kernel with its shared memory opted in on the current device (once per device).
template <typename T, int STAGES, int BM, bool SPLIT>
cudaError_t prepare_kernel() {
  static int smem_set[kMaxDevices] = {};
  return opt_in_shared_memory(ternary_wgmma_kernel<T, STAGES, BM, SPLIT>, WgShape<STAGES, BM>::kSmemBytes, smem_set);
}

// A launch of `grid` CTAs of the BM-token kernel (wg::cluster_launch_config)
template <int STAGES, int BM>
cudaLaunchConfig_t launch_config(unsigned grid, int splits, cudaStream_t stream, cudaLaunchAttribute& attr) {
  return wg::cluster_launch_config(grid, splits, WgShape<STAGES, BM>::kSmemBytes, stream, attr);
}

// CTAs of the BM-token kernel that run at once in clusters of `splits` (its wave; 1 CTA an SM,
// fewer where the GPCs' SM counts are not multiples of the cluster), asked once per device; <= 0
// where it cannot be asked.
template <int BM>
int cluster_wave(int splits) {
  constexpr int STAGES = kStagesOf<BM>;
  static int cached[3][kMaxDevices] = {};  // by split_slot
  return per_device(cached[split_slot(splits)], [&](int) {
    auto kernel = ternary_wgmma_kernel<__nv_bfloat16, STAGES, BM, true>;  // fp16's has the same resources
    if (prepare_kernel<__nv_bfloat16, STAGES, BM, true>() != cudaSuccess) return -1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config<STAGES, BM>(splits * 64, splits, nullptr, attr);
    int clusters = 0;
    return cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0 ? clusters * splits
                                                                                                   : -1;
  });
}

template <typename T, int STAGES, int BM>
cudaError_t launch_wgmma_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                           int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int splits,
                           cudaStream_t stream) {
  auto kernel = splits > 1 ? ternary_wgmma_kernel<T, STAGES, BM, true> : ternary_wgmma_kernel<T, STAGES, BM, false>;
  if (const cudaError_t err = splits > 1 ? prepare_kernel<T, STAGES, BM, true>() : prepare_kernel<T, STAGES, BM, false>();
      err != cudaSuccess)
    return err;
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // x as a 2-D tensor (K innermost, rows K * 2 bytes apart: K % 8 == 0 keeps them 16-byte aligned)
  // read in boxes of 64 x BM; the TMA writes zeros past M and K.
  CUtensorMap x_map, code_map;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)M}, strides[1] = {(cuuint64_t)K * sizeof(T)};
  const cuuint32_t box[2] = {kBK, BM}, unit[2] = {1, 1};
  if (encode(&x_map, std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             2, const_cast<void*>(x), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  // packed as a 2-D uint8 tensor (rows ldp bytes apart: ldp % 16 == 0) read in boxes of 16 B x 128 rows
  const cuuint64_t cdims[2] = {(cuuint64_t)ldp, (cuuint64_t)N}, cstrides[1] = {(cuuint64_t)ldp};
  const cuuint32_t cbox[2] = {kBK / 4, kBN};
  if (encode(&code_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(packed), cdims, cstrides, cbox, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  // persistent (one CTA an SM), or with splits > 1 one CTA per tile and share of K, a cluster a tile
  const unsigned grid = splits > 1 ? (unsigned)(tile_count(M, N, BM) * splits)
                                   : (unsigned)std::min<long>(tile_count(M, N, BM), std::max(sm_count(), 1));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config<STAGES, BM>(grid, splits, stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, x_map, code_map, scale, static_cast<const T*>(bias), static_cast<T*>(y), M,
                            N, K, lds, block_size, k_offset, splits);
}

}  // namespace

// Whether the current device runs this file's sm_90a code (compute capability 9.0 exactly).
bool wgmma_supported() {
  static int cached[kMaxDevices] = {};
  return per_device(cached, [](int dev) {
           int major = 0, minor = 0;
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
           return major == 9 && minor == 0 ? 1 : 2;
         }) == 1;
}

// The tiling: each candidate's time modelled as (k-steps a CTA walks) x (a k-step's time at its
// tile) + (the split's exchange), the least taken. Fitted on the H200 to benchmarks/probes/
// wgmma_probe.cu's split sweep (every tile x split on the 8 benchmark layers at M 64-4096, CUDA
// graphs, inputs past L2; benchmarks/results/wgmma-split-h200.md): t = 2.66
// + steps x (0.78 us at 256 tokens, 0.55 at 128) + (1.84 / 3.08 / 3.87 us at 128 tokens and 2, 4,
// 8 CTAs; 3.15 / 5.52 / 7.85 at 256), median error 4 %; its pick is within 3.3 % of the sweep's
// best on every (layer, M), 0.2 % in the geometric mean. The exchange is the partial tile through
// distributed shared memory (~12 bytes a cycle an SM there). Auto splits only where the clusters
// fit in one wave: a second wave of split CTAs paid the whole CTA again (qkv M 1024, 256 tokens:
// 16.1 us unsplit, 24.3 at 2 CTAs = 2 waves, 55.6 at 4).
constexpr double kStepUs256 = 0.78, kStepUs128 = 0.55;
constexpr double kSplitUs[2][3] = {{1.84, 3.08, 3.87}, {3.15, 5.52, 7.85}};  // [256 tokens][split_slot]

WgmmaTiling choose_wgmma_tiling(int M, int N, int K, int tokens_per_cta, int k_split) {
  const int steps = (K + kBK - 1) / kBK;
  const long sms = std::max(sm_count(), 1);
  if (k_split > steps) return {0, 0};
  WgmmaTiling best{0, 0};
  double best_us = 0;
  for (int bm : {256, 128}) {
    if (tokens_per_cta != 0 && tokens_per_cta != bm) continue;
    const long tiles = tile_count(M, N, bm);
    const double step_us = bm == 256 ? kStepUs256 : kStepUs128;
    for (int s : {1, 2, 4, 8}) {
      if ((k_split != 0 && k_split != s) || s > steps) continue;
      double us = 0;
      if (s == 1) {
        us = (double)steps * ((tiles + sms - 1) / sms) * step_us;  // persistent: a CTA's tiles in series
      } else {
        const long wave = bm == 256 ? cluster_wave<256>(s) : cluster_wave<128>(s);
        if (k_split == 0 && (wave <= 0 || tiles * s > wave)) continue;
        us = (double)((steps + s - 1) / s) * step_us + kSplitUs[bm == 256][split_slot(s)];
      }
      if (best.tokens == 0 || us < best_us) best = {bm, s}, best_us = us;
    }
  }
  return best;
}

// Tiles of 256 tokens (4 stages of 34 KB) hide the decode under the wgmma (decode work per k-step
// is the W tile's, the same at 128 and 256 tokens; measured on the H200: o at M 4096 25.7 us
// against 35.4 us at 128); tiles of 128 tokens (6 stages of 18 KB) give twice the CTAs: chosen by
// choose_wgmma_tiling.
cudaError_t launch_wgmma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                         int tokens_per_cta, int k_split, cudaStream_t stream) {
  if (!wgmma_supported()) return cudaErrorNotSupported;
  const WgmmaTiling tiling = choose_wgmma_tiling(M, N, K, tokens_per_cta, k_split);
  if (tiling.tokens == 0) return cudaErrorInvalidValue;
  tokens_per_cta = tiling.tokens;
  const int splits = tiling.splits;
#define TERNARY_LAUNCH(T, BM)                                                                                  \
  launch_wgmma_t<T, kStagesOf<BM>, BM>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, splits, \
                                       stream)
  if (tokens_per_cta == 256) return bf16 ? TERNARY_LAUNCH(__nv_bfloat16, 256) : TERNARY_LAUNCH(__half, 256);
  if (tokens_per_cta == 128) return bf16 ? TERNARY_LAUNCH(__nv_bfloat16, 128) : TERNARY_LAUNCH(__half, 128);
#undef TERNARY_LAUNCH
  return cudaErrorInvalidValue;
}

}  // namespace ternary
