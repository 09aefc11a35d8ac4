// Ternary GEMM with int8 activations (the W2A8 mode, ternary_plugin/activations.py) on Hopper's
// int8 tensor cores (wgmma s8, twice the bf16 rate; sm_90a only):
//   y[M, N] = sx[M] * sum_b ws[N, b] * (xq[M, K_b] . codes[N, K_b]) (+ bias)
// where xq = int8 activations quantized per token (sx = absmax / 127) by this file's quantize
// kernel, K_b the 128 weights of scale block b, the dots exact in int32, the sum over blocks fp32.
//
// The structure is csrc/ternary_wgmma.cu's (swap AB: W rows are wgmma's M side from registers,
// tokens its N side from shared memory; one producer thread's TMA copies, two MMA warpgroups,
// persistent CTAs or a cluster split along K, shared pieces in ternary_wgmma.cuh). What differs:
//   - a k-step is 128 weights of K: one 128-byte swizzle row of int8 and exactly one scale block
//     (block_size a multiple of 128, k_offset % 128 == 0: the host checks), so the k-step's four
//     m64 x nBM x k32 wgmma write a fresh int32 block sum (scale-d 0 on the first), which the MMA
//     threads promote into fp32 accumulators, acc += float(block sum) x ws[row, b]: DeepGEMM's
//     per-128 promotion, exact up to that fp32 product and sum. Two accumulator sets (int32 +
//     fp32) cap the tile at 128 tokens (wgmma's integer N stops at 224 anyway);
//   - the decode has no scale multiply and is 4 instructions a register of 4 weights
//     (spread_codes), because the activations' K order is permuted inside every 128-block to
//     match the codes' natural order (quantize kernel, kPermute below): a register's 4 bytes are
//     then the same 2-bit field of 4 consecutive code bytes, not 4 fields of one byte;
//   - a tile's scales wait in shared memory, up to kS8MaxScaleCols (96) blocks a row (K 12288:
//     8B's down_proj). Read from global memory a k-step ahead instead, each k-step paid the load's
//     latency (the second H200 run: 8B qkv M 1 took 1.4 us a k-step against ~0.3 of tensor-core
//     work; the wgmma fence waits for the register it lands in). A CTA's first tile's scales are
//     staged by the MMA warpgroups; every later tile's by warps 1-3 of the producer warpgroup (the
//     stagers), into the other of two buffers while the tile before runs (mbarriers per buffer):
//     staged after each epilogue by the MMA threads, two passes of dependent global loads a row,
//     they held the tensor cores idle ~10 % of a 256-row tile (notes, v19);
//   - the epilogue multiplies by the token's sx.
//
//                    K (128 a k-step = one scale block) ->
//   xq tile [BM tok x 128] int8 (K permuted) --(TMA)--------------------- B (shared memory) ---+
//   codes   [128 rows x 32 B]               --(TMA)--> 2 rows x 32 codes -> int8 A (registers) -+-> wgmma s8 -> int32
//                                                                          acc += float(int32) x ws[row, b]
//
// Requires (checked by the host): an sm_90 device; packed 16-byte aligned with rows padded to 16
// bytes (ternary_plugin.ops.pad_packed_rows); block_size % 128 == 0, k_offset % 128 == 0. Any M,
// N, K: the quantize kernel zero-pads K to a multiple of 128 and the TMA zero-fills past M, N.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"
#include "ternary_wgmma.cuh"
#include "ternary_wgmma.h"
#include "ternary_wgmma_s8.h"

namespace ternary {
namespace {

using namespace wg;

constexpr int kBK = kS8StepK;      // weights of K a k-step: 128 int8 = one 128-byte swizzle row
constexpr int kRow = kBK;          // bytes of an activation tile row
constexpr int kCodeRow = kBK / 4;  // bytes of codes a W row a k-step
// 1.5 x 2^23 and its bits: an integer i with |i| < 2^22 added to the bits (or a float t with
// |t| < 2^22 added to the value, rounded half to even) sits in the low mantissa bits of the sum.
constexpr float kMantissaMagic = 12582912.f;
constexpr int kMantissaMagicBits = 0x4B400000;

// Programmatic dependent launch between the op's two kernels (launch_s8_t sets the attribute):
// the quantize kernel lets the GEMM launch at its entry, and the GEMM waits for it (its xq and sx
// written and flushed) only where it first reads them, after its barriers, its first tile's
// scales and its first stages' codes are under way; the weights are no kernel's output in the op.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Stages: 6 of 20 KB at 128 tokens, 8 of 12 KB at 64; with 256 W rows a tile (RS 2), 4 of 24 KB.
template <int BM, int RS = 1>
constexpr int kS8StagesOf = RS == 2 ? 4 : BM == 128 ? 6 : 8;

// RS: row sets a warpgroup, W rows a tile kBN x RS. RS 2 (folded scales only): each activation
// tile feeds 256 W rows, half the activation traffic from L2 a product (notes, v18); its tile's
// scales wait in shared memory already folded, as int8 (one byte a block and row).
template <int STAGES, int BM, int RS = 1>
struct S8Shape {
  static constexpr int kRows = kBN * RS;
  static constexpr int kXBytes = BM * kRow, kCBytes = kRows * kCodeRow;
  // one tile's scales, [block][row]: fp16 (RS 1), folded int8 (RS 2)
  static constexpr int kScaleBytes = kRows * kS8MaxScaleCols * (RS == 1 ? 2 : 1);
  static constexpr int kOutLd = kRows + 8;  // output staging row ([token][W row]), padded
  // [activation stages (1024-byte aligned) | code stages | scales of two tiles | output tile |
  // ws of two tiles (folded scales) | mbarriers: stages full, empty; scale buffers full, empty]
  static constexpr int kCOff = STAGES * kXBytes, kSOff = kCOff + STAGES * kCBytes;
  static constexpr int kOutOff = kSOff + 2 * kScaleBytes;
  static constexpr int kWsOff = kOutOff + BM * kOutLd * 2;
  static constexpr int kBarOff = kWsOff + 2 * kRows * 4;
  static constexpr int kSmemBytes = kBarOff + 2 * STAGES * 8 + 4 * 8 + 1024;  // + alignment
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (m64 x nBM, int32; d[4j + 2h + e]: W row 16 warp + lane / 4 + 8h, token 8j + 2 (lane % 4) + e)
// = (scale_d ? d : 0) + A (m64 x k32 int8) * B (k32 x nBM int8). A from registers: a[0] row
// lane / 4, k 4 (lane % 4) + byte; a[1] row + 8; a[2], a[3] k + 16 (the m16n8k32 A fragment); B
// from shared memory (descriptor db, K-major, 128-byte swizzle; a k32 step is +32 bytes).
#define TERNARY_WGMMA_S8_N64 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "{%32, %33, %34, %35}, %36, p;\n}\n" \
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
#define TERNARY_WGMMA_S8_N128 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p;\n}\n" \
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
template <int BM>
__device__ __forceinline__ void wgmma_s8(int32_t (&d)[BM / 2], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  if constexpr (BM == 128) {
    TERNARY_WGMMA_S8_N128;
  } else {
    static_assert(BM == 64, "tiles of 64 or 128 tokens");
    TERNARY_WGMMA_S8_N64;
  }
}
#undef TERNARY_WGMMA_S8_N64
#undef TERNARY_WGMMA_S8_N128

// Four int8 weights from the 2-bit codes at bits 4i, 4i + 1 (i < 4) of `sel`, by one prmt over a
// row's table {0, +w, -w, -w} (bytes 0-3 of `table`; code 00 -> 0, 01 -> +w, 10 -> -w, the reserved
// 11 -> -w): w = 1 where the block sums are promoted with exact scales, the row's folded int8
// block scale (fold_table) where they are not. prmt reads the selector's low 16 bits: nibbles 0-3
// pick bytes 0-3; the caller clears bits 2-3 of every nibble (spread_word), so no byte of the other
// operand and no sign mode.
__device__ __forceinline__ uint32_t table_codes(uint32_t table, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(table), "r"(sel));
  return r;
}

// A code word's four prmt selectors: its even codes (w & 0x3333...: code 2i at nibble i) and odd
// codes (shifted down by 2 first), each as is (codes 0-7) and shifted down by 16 (codes 8-15). 5
// instructions for the four, where masking each shifted word took 7.
struct Selectors {
  uint32_t s[4];  // [q]: the selector of wgmma q's register (shift 2 (q & 1) + 16 (q >> 1))
};
__device__ __forceinline__ Selectors spread_word(uint32_t w) {
  const uint32_t even = w & 0x33333333u, odd = (w >> 2) & 0x33333333u;
  return {{even, odd, even >> 16, odd >> 16}};
}
constexpr uint32_t kUnitTable = 0xFFFF0100u;  // {0, +1, -1, -1}
__device__ __forceinline__ uint32_t fold_table(int q) {
  const uint32_t p = (uint32_t)q & 0xffu, n = (uint32_t)(-q) & 0xffu;
  return (p << 8) | (n << 16) | (n << 24);
}

// A block scale s of a row whose largest |scale| is smax, folded into int8 (the rint of
// (s / smax) x 127, 0 where smax is 0), and the row's weight ws = smax / 127:
// activations.fold_block_scales, bit for bit (IEEE quotient and product, round half to even).
__device__ __forceinline__ float fold_scale(float s, float smax) {
  return smax > 0.f ? rintf(__fmul_rn(__fdiv_rn(s, smax), 127.f)) : 0.f;
}
__device__ __forceinline__ float fold_weight(float smax) { return __fdiv_rn(smax, 127.f); }

// An int32 block sum (|v| <= 127 x 128 < 2^22) as fp32, exactly, without the conversion unit
// (cvt.rn.f32.s32 runs at 16 a clock an SM: 128 x 128 of them a k-step took ~1024 cycles, twice
// the k-step's tensor-core time; measured, kernel-h200.md's first s8 run): 2^23 + 2^22 + v has v
// in its low mantissa bits, so one integer add and one float subtraction give v.
__device__ __forceinline__ float block_sum_to_float(int32_t v) {
  return __int_as_float(v + kMantissaMagicBits) - kMantissaMagic;
}

// One k-step's A fragments of a thread (4 k32 wgmma x 4 registers): rows r0 (codes c0, table t0)
// and r0 + 8 (c1, t1), code words 2t (.x) and 2t + 1 (.y) of the row's 32 bytes. Word u's 16
// codes (code j at bits 2j: natural weight 32t + 16u + j) give four registers: wgmma q takes codes
// 2i + (q & 1) + 8 (q >> 1), i < 4, as its bytes i (the word shifted by 2 (q & 1) + 16 (q >> 1),
// then the selector's nibbles hold every other code). Register a[q][2u] (a[q][2u + 1] for
// r0 + 8) byte i sits at wgmma position 32q + 16u + 4t + i: the activations' permutation
// (permuted_column) puts the matching x there. 9 instructions a 16 weights (spread_word, 4 prmt).
__device__ __forceinline__ void decode_s8(uint32_t (&a)[4][4], uint2 c0, uint2 c1, uint32_t t0, uint32_t t1) {
  const Selectors x0 = spread_word(c0.x), y0 = spread_word(c0.y), x1 = spread_word(c1.x), y1 = spread_word(c1.y);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    a[q][0] = table_codes(t0, x0.s[q]), a[q][2] = table_codes(t0, y0.s[q]);
    a[q][1] = table_codes(t1, x1.s[q]), a[q][3] = table_codes(t1, y1.s[q]);
  }
}

// Scale stagers: warps 1-3 of the producer warpgroup (warp 0 issues the copies).
constexpr int kStagerThreads = 96;

// A tile's scales into shared memory as [block][row] (buf), rows n0 .. n0 + ROWS (rows past N read
// row N - 1, never stored): FOLD the rows' folded int8 block scales and ws[row] = S / 127
// (activations.fold_block_scales, bit for bit: S = max |s_b| over the row's blocks), else the raw
// fp16. Thread t of nt takes rows t / TPR, + nt / TPR, ...; with two threads a row (TPR 2) each
// takes every other block and the pair's maximum is one shuffle. Loads 8 at a time: the producer
// warpgroup runs this on its 40 registers.
template <bool FOLD, int ROWS, int TPR>
__device__ __forceinline__ void stage_scales(const __half* __restrict__ scale, int lds, int N, int n0, int col0,
                                             int cols, uint8_t* buf, float* ws, int t, int nt) {
  constexpr int kBatch = 8;
  for (int r = t / TPR; r < ROWS; r += nt / TPR) {
    const unsigned short* sg =
        reinterpret_cast<const unsigned short*>(scale) + (size_t)min(n0 + r, N - 1) * lds + col0;
    auto load = [&](int c0, unsigned short (&v)[kBatch]) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = c0 + TPR * i < cols ? __ldg(sg + c0 + TPR * i) : 0;
    };
    if constexpr (FOLD) {
      float smax = 0.f;
      for (int c0 = t % TPR; c0 < cols; c0 += kBatch * TPR) {
        unsigned short v[kBatch];
        load(c0, v);
#pragma unroll
        for (int i = 0; i < kBatch; ++i) smax = fmaxf(smax, fabsf(scale_from_bits(v[i])));
      }
      if constexpr (TPR == 2) smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
      int8_t* sq = reinterpret_cast<int8_t*>(buf);
      for (int c0 = t % TPR; c0 < cols; c0 += kBatch * TPR) {
        unsigned short v[kBatch];
        load(c0, v);
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (c0 + TPR * i < cols) sq[(c0 + TPR * i) * ROWS + r] = (int8_t)fold_scale(scale_from_bits(v[i]), smax);
      }
      if (t % TPR == 0) ws[r] = fold_weight(smax);
    } else {
      unsigned short* ss = reinterpret_cast<unsigned short*>(buf);
      for (int c0 = t % TPR; c0 < cols; c0 += kBatch * TPR) {
        unsigned short v[kBatch];
        load(c0, v);
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (c0 + TPR * i < cols) ss[(c0 + TPR * i) * ROWS + r] = v[i];
      }
    }
  }
}

// The CTA's first tile's scales, as stage_scales, by the MMA warpgroups where every row's columns
// col0 .. start 16 bytes aligned (scales_vec_ok): a row's scales (at most kS8MaxScaleCols) in one
// round of independent 16-byte loads held in registers, so the first k-step waits one global
// latency instead of one per 8 blocks (and, folded, a second pass over them). Same values, bit for
// bit: blocks past `cols` in the last vector are masked.
constexpr int kS8VecScaleMinCols = 32;  // fewer blocks a row: stage_scales (vectors were 5-15 % slower on 0.6B shapes)
template <bool FOLD, int ROWS, int TPR>
__device__ __forceinline__ void stage_scales_vec(const __half* __restrict__ scale, int lds, int N, int n0, int col0,
                                                 int cols, uint8_t* buf, float* ws, int t, int nt) {
  constexpr int kMaxV = (kS8MaxScaleCols + 8 * TPR - 1) / (8 * TPR);
  const int nv = (cols + 7) / 8;
  for (int r = t / TPR; r < ROWS; r += nt / TPR) {
    const uint4* sg = reinterpret_cast<const uint4*>(scale + (size_t)min(n0 + r, N - 1) * lds + col0);
    uint4 v[kMaxV];
#pragma unroll
    for (int i = 0; i < kMaxV; ++i) {
      const int j = t % TPR + TPR * i;
      v[i] = j < nv ? __ldg(sg + j) : make_uint4(0u, 0u, 0u, 0u);
    }
    float smax = 0.f;
    if constexpr (FOLD) {
#pragma unroll
      for (int i = 0; i < kMaxV; ++i) {
        const unsigned short* e = reinterpret_cast<const unsigned short*>(&v[i]);
#pragma unroll
        for (int u = 0; u < 8; ++u)
          if (8 * (t % TPR + TPR * i) + u < cols) smax = fmaxf(smax, fabsf(scale_from_bits(e[u])));
      }
      if constexpr (TPR == 2) smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
    }
#pragma unroll
    for (int i = 0; i < kMaxV; ++i) {
      const unsigned short* e = reinterpret_cast<const unsigned short*>(&v[i]);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int c = 8 * (t % TPR + TPR * i) + u;
        if (c >= cols) continue;
        if constexpr (FOLD) reinterpret_cast<int8_t*>(buf)[c * ROWS + r] = (int8_t)fold_scale(scale_from_bits(e[u]), smax);
        else reinterpret_cast<unsigned short*>(buf)[c * ROWS + r] = e[u];
      }
    }
    if (FOLD && t % TPR == 0) ws[r] = fold_weight(smax);
  }
}
#endif

// Position p = 32a + 16u + 4b + c (a, b, c < 4, u < 2) of a 128-block of the quantized activations
// holds natural column 32b + 16u + 8 (a >> 1) + 2c + (a & 1) of that block (decode_s8's order).
// Positions 4g .. 4g + 3 hold columns permuted_column(4g) + 0, 2, 4, 6.
__host__ __device__ constexpr int permuted_column(int p) {
  return 32 * ((p >> 2) & 3) + (p & 16) + 8 * ((p >> 6) & 1) + 2 * (p & 3) + ((p >> 5) & 1);
}

// The token's scale from each thread's partial absmax (a CTA of at most 256 threads, every thread
// calls it and gets it): absmax / 127 in IEEE division, 1 where that is 0, as the reference.
__device__ __forceinline__ float token_scale(float amax) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float warp_max[8];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < (int)blockDim.x / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = __fdiv_rn(amax, 127.f);
  return s > 0.f ? s : 1.f;
}

// One activation: clamp(rint(v / s), +-127), the division IEEE as the reference's. inv = 1 / s
// (rounded): t = v x inv is within 2^-15 of the rounded quotient (|v / s| <= 127: each of the two
// roundings and inv's error <= 127 x 2^-24), so where t is more than 2^-14 from a half-integer
// both round to the same integer. t + kMantissaMagic rounds t half to even into the low mantissa bits
// (full-rate adds, where the IEEE division takes a MUFU.RCP, ~8 more instructions and rintf an
// F2I-pipe op); the division runs only within the margin of a tie (~1e-4 of random activations;
// NaN and inf too). The __f*_rn intrinsics keep the compiler from folding or contracting them.
__device__ __forceinline__ int quantize_s8(float v, float s, float inv) {
  const float t = __fmul_rn(v, inv), big = __fadd_rn(t, kMantissaMagic);
  const int q = fabsf(__fsub_rn(t, __fsub_rn(big, kMantissaMagic))) < 0.5f - 0x1p-14f
                    ? __float_as_int(big) - kMantissaMagicBits
                    : __float2int_rn(__fdiv_rn(v, s));
  return max(-127, min(127, q));
}

// xq [M, ldq] int8, sx [M] fp32 from x [M, K]: one CTA a token. sx = absmax / 127 (1 where that
// is 0), xq = clamp(rint(x / sx), +-127), both in fp32 with IEEE division as the reference
// (quantize_activations_int8) computes them: bit-identical. PERMUTE: columns permuted per 128-block
// (permuted_column) and zero-padded to ldq = round_up(K, 128), for the GEMM; else natural, ldq = K.
template <typename T, bool PERMUTE>
__global__ void __launch_bounds__(256) quantize_s8_kernel(const T* __restrict__ x, int8_t* __restrict__ xq,
                                                          float* __restrict__ sx, int K, int ldq) {
  pdl_launch_dependents();
  const T* row = x + (size_t)blockIdx.x * K;
  float amax = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(Vec<T>::to_float(row[k])));
  const float s = token_scale(amax), inv = __frcp_rn(s);
  if (threadIdx.x == 0) sx[blockIdx.x] = s;
  auto q = [&](int k) -> int { return k < K ? quantize_s8(Vec<T>::to_float(row[k]), s, inv) : 0; };
  int8_t* out = xq + (size_t)blockIdx.x * ldq;
  if constexpr (PERMUTE) {
    for (int g = threadIdx.x; g < ldq / 4; g += blockDim.x) {  // 4 output bytes, positions 4g .. 4g + 3
      const int p = 4 * g, base = p & ~127, c0 = base + permuted_column(p & 127);
      // positions p .. p + 3 differ in c: natural columns c0, c0 + 2, c0 + 4, c0 + 6
      const uint32_t v = (uint32_t)(q(c0) & 0xff) | ((uint32_t)(q(c0 + 2) & 0xff) << 8) |
                         ((uint32_t)(q(c0 + 4) & 0xff) << 16) | ((uint32_t)(q(c0 + 6) & 0xff) << 24);
      *reinterpret_cast<uint32_t*>(out + p) = v;
    }
  } else {
    for (int k = threadIdx.x; k < K; k += blockDim.x) out[k] = (int8_t)q(k);
  }
}

// The quantizer for rows that take 16-byte loads (K a multiple of 8, x 16-byte aligned) and
// K <= kQuantVecMaxK: the row is read once into registers (8 activations a thread per pass) and
// written 8 bytes a thread and pass. The arithmetic is quantize_s8_kernel's (token_scale,
// quantize_s8). The scalar kernel read each row twice with 2-byte loads: ~8 us a call at M 16,
// ~35 us at M 2048 (K 4096-12288) on the H200, 4x Humming's input step
// (benchmarks/results/w2a8-host-h200.md). PERMUTE (the GEMM's layout, ldq = round_up(K, 128)):
// natural columns 8j .. 8j + 7 of a 128-block are 32b + 16u + 8h + 2c + e with j % 16 = 4b + 2u + h,
// so the even ones (e 0) land at positions 64h + 16u + 4b + c (c < 4: one 4-byte word) and the odd
// ones 32 further (permuted_column); vectors past K write the zero padding. PASSES (1, 2, 4, 8)
// and the CTA's threads (32-256) are sized to the row: one 256-thread CTA of 8 passes a row at
// every K (32 registers of row) ran the K-1024 layers of 0.6B slower than the scalar kernel on the
// H200 (half its threads idle, 3 CTAs an SM; s8-ab-*.json).
constexpr int kQuantThreads = 256, kQuantVecMaxK = 8 * kQuantThreads * 8;

template <typename T, bool PERMUTE, int PASSES>
__global__ void __launch_bounds__(kQuantThreads) quantize_s8_vec_kernel(const T* __restrict__ x,
                                                                       int8_t* __restrict__ xq,
                                                                       float* __restrict__ sx, int K, int ldq) {
  pdl_launch_dependents();
  const uint4* row = reinterpret_cast<const uint4*>(x + (size_t)blockIdx.x * K);
  const int nv = K / 8, nout = PERMUTE ? ldq / 8 : nv;
  uint4 v[PASSES];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < nv) {
      v[i] = __ldg(row + j);
      const T* e = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
      for (int t = 0; t < 8; ++t) amax = fmaxf(amax, fabsf(Vec<T>::to_float(e[t])));
    }
  }
  const float s = token_scale(amax), inv = __frcp_rn(s);
  if (threadIdx.x == 0) sx[blockIdx.x] = s;
  int8_t* out = xq + (size_t)blockIdx.x * ldq;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j >= nout) continue;
    uint32_t w[2] = {0u, 0u};
    if (j < nv) {
      const T* e = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const uint32_t q = (uint32_t)(quantize_s8(Vec<T>::to_float(e[t]), s, inv) & 0xff);
        if constexpr (PERMUTE) w[t % 2] |= q << (8 * (t / 2));
        else w[t / 4] |= q << (8 * (t % 4));
      }
    }
    if constexpr (PERMUTE) {
      const int b = j % 16, p = 128 * (j / 16) + 64 * (b & 1) + 16 * ((b >> 1) & 1) + 4 * (b >> 2);
      *reinterpret_cast<uint32_t*>(out + p) = w[0];
      *reinterpret_cast<uint32_t*>(out + p + 32) = w[1];
    } else {
      reinterpret_cast<uint2*>(out)[j] = make_uint2(w[0], w[1]);
    }
  }
}

template <typename T, int STAGES, int BM, bool SPLIT, bool FOLD, int RS>
__global__ void __launch_bounds__(kThreads, 1)
ternary_wgmma_s8_kernel(const __grid_constant__ CUtensorMap x_map,     // xq [M, Kp] int8: boxes 128 x BM, 128-byte swizzle
                        const __grid_constant__ CUtensorMap code_map,  // packed [N, ldp]: boxes 32 B x 128 RS rows
                        const float* __restrict__ sx,                  // [M]
                        const __half* __restrict__ scale,              // [N, lds]
                        const T* __restrict__ bias,                    // [N] or nullptr
                        T* __restrict__ y,                             // [M, N]
                        int M, int N, int Kp, int lds, int block_size, int k_offset, int splits,
                        uint32_t step_magic) {  // s8_step_magic(block_size)
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(RS == 1 || (RS == 2 && FOLD && !SPLIT), "256-row tiles: folded scales, no split");
  using S = S8Shape<STAGES, BM, RS>;
  constexpr int kRows = S::kRows;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_s & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full_bar = smem_s + S::kBarOff, empty_bar = full_bar + 8 * STAGES;
  // the two scale buffers (by tile parity): staged (full), and read to the end of the epilogue (empty)
  const uint32_t scales_full = empty_bar + 8 * STAGES, scales_empty = scales_full + 16;
  const int tid = threadIdx.x;
  const int steps = Kp / kBK;
  const int tiles_n = (N + kRows - 1) / kRows, tiles = tiles_n * ((M + BM - 1) / BM);
  // as ternary_wgmma_kernel: SPLIT, clusters of `splits` CTAs a tile, each a run of k-steps
  const int first_tile = SPLIT ? blockIdx.x / splits : blockIdx.x;
  const int tile_stride = SPLIT ? gridDim.x / splits : gridDim.x, rank = SPLIT ? blockIdx.x % splits : 0;
  const int kt0 = SPLIT ? rank * steps / splits : 0;
  const int nk = SPLIT ? (rank + 1) * steps / splits - kt0 : steps;
  const int col0 = k_offset / block_size;  // the scale column of local column 0's block
  // the blocks the k-steps read: the last k-step starts at local column Kp - 128 (< K)
  const int cols = (k_offset + Kp - kBK) / block_size - col0 + 1;
  float* ws_smem = reinterpret_cast<float*>(smem + S::kWsOff);  // FOLD: ws of the two buffers' rows
  auto scale_buffer = [&](int tcount) { return smem + S::kSOff + (tcount & 1) * S::kScaleBytes; };

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kMmaThreads / 32);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(scales_full + 8 * b, kStagerThreads);
      mbar_init(scales_empty + 8 * b, kMmaThreads);
    }
  }
  __syncthreads();

  if (tid >= kMmaThreads) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (tid == kMmaThreads) {
      // stage s's two copies (both complete its full barrier): the activations', then the codes'
      auto copy_x = [&](int s, int kt, int m0) {
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
            "%3}], [%4];\n" ::"r"(smem_s + s * S::kXBytes), "l"(reinterpret_cast<uint64_t>(&x_map)), "r"((kt0 + kt) * kBK),
            "r"(m0), "r"(full_bar + 8 * s)
            : "memory");
      };
      auto copy_codes = [&](int s, int kt, int n0) {
        const uint32_t bar = full_bar + 8 * s;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                     "n"(S::kXBytes + S::kCBytes) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
            "%3}], [%4];\n" ::"r"(smem_s + S::kCOff + s * S::kCBytes), "l"(reinterpret_cast<uint64_t>(&code_map)),
            "r"((kt0 + kt) * kCodeRow), "r"(n0), "r"(bar)
            : "memory");
      };
      int it = 0;
      for (int tile = first_tile; tile < tiles; tile += tile_stride) {
        const int n0 = (tile % tiles_n) * kRows, m0 = (tile / tiles_n) * BM;
        // the first tile's first stages (all empty): their codes before the wait for the
        // quantize kernel, their activations after it
        const int pre = tile == first_tile ? min(STAGES, nk) : 0;
        for (int kt = 0; kt < pre; ++kt) copy_codes(kt, kt, n0);
        if (tile == first_tile) pdl_wait();
        for (int kt = 0; kt < pre; ++kt) copy_x(kt, kt, m0);
        it += pre;
        for (int kt = pre; kt < nk; ++kt, ++it) {
          const int s = it % STAGES;
          mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);
          copy_codes(s, kt, n0);
          copy_x(s, kt, m0);
        }
      }
    } else if (tid >= kMmaThreads + 32) {
      // The stagers: every tile's scales after the CTA's first (which the MMA warpgroups stage
      // before their first k-step), into the buffer of the tile's parity once the tile two back
      // has left it, while the MMA warpgroups run the tile before.
      int tcount = 1;
      for (int tile = first_tile + tile_stride; tile < tiles; tile += tile_stride, ++tcount) {
        mbar_wait(scales_empty + 8 * (tcount & 1), ((tcount >> 1) & 1) ^ 1);
        stage_scales<FOLD, kRows, 1>(scale, lds, N, (tile % tiles_n) * kRows, col0, cols, scale_buffer(tcount),
                                     ws_smem + (tcount & 1) * kRows, tid - kMmaThreads - 32, kStagerThreads);
        mbar_arrive(scales_full + 8 * (tcount & 1));
      }
    }
    if constexpr (SPLIT) {
      __syncwarp();
      cluster_barrier<false>();
      cluster_barrier<true>();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMmaRegs));
  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, t = lane % 4;
  const int r0 = wg * 64 + warp * 16 + lane / 4;  // this thread's W rows r0, r0 + 8
  // the CTA's first tile's scales, by both MMA warpgroups (two threads a row where there are enough)
  constexpr int kFirstTpr = kMmaThreads >= 2 * kRows ? 2 : 1;
  if (cols > kS8VecScaleMinCols && lds % 8 == 0 && col0 % 8 == 0 && reinterpret_cast<uintptr_t>(scale) % 16 == 0)
    stage_scales_vec<FOLD, kRows, kFirstTpr>(scale, lds, N, (first_tile % tiles_n) * kRows, col0, cols,
                                             scale_buffer(0), ws_smem, tid, kMmaThreads);
  else
    stage_scales<FOLD, kRows, kFirstTpr>(scale, lds, N, (first_tile % tiles_n) * kRows, col0, cols, scale_buffer(0),
                                         ws_smem, tid, kMmaThreads);
  pdl_wait();  // sx, read in the epilogue (xq reaches these threads through the producer's copies)
  mma_sync();

  int it = 0, tcount = 0;
  for (int tile = first_tile; tile < tiles; tile += tile_stride, ++tcount) {
    const int n0 = (tile % tiles_n) * kRows, m0 = (tile / tiles_n) * BM;
    if (tcount > 0) mbar_wait(scales_full + 8 * (tcount & 1), ((tcount - 1) >> 1) & 1);  // the stagers'
    const unsigned short* ssc = reinterpret_cast<const unsigned short*>(scale_buffer(tcount));  // exact: fp16
    const int8_t* sq = reinterpret_cast<const int8_t*>(scale_buffer(tcount));                  // FOLD: int8
    // k-step kt's scale column (relative to col0): local column 128 kt is global k_offset + 128 kt,
    // global k-step k_offset / 128 + kt0 + kt, of block (that) / (block_size / 128): a multiply-high
    // by s8_step_magic, not a runtime division (~60 of the 8B down loop's 166 instructions at M 256)
    auto scale_col = [&](int kt) {
      return (int)__umulhi((uint32_t)(k_offset / kBK + kt0 + kt) << 1, step_magic) - col0;
    };

    // Waits for k-step kt's stage and decodes its codes (row set s: rows s kBN + r0, + 8): with the
    // unit table (exact scales: the two rows' scales of the k-step to sc, raw bits) or the rows'
    // folded int8 block scales.
    auto decode = [&](uint32_t (&a)[RS][4][4], unsigned short (&sc)[RS][2], int kt) {
      const int g = it + kt;
      const int c = scale_col(kt);
#pragma unroll
      for (int rs = 0; rs < RS; ++rs) {
        if constexpr (FOLD) {
          sc[rs][0] = (unsigned short)(short)sq[c * kRows + rs * kBN + r0];
          sc[rs][1] = (unsigned short)(short)sq[c * kRows + rs * kBN + r0 + 8];
        } else {
          sc[rs][0] = ssc[c * kBN + r0], sc[rs][1] = ssc[c * kBN + r0 + 8];
        }
      }
      mbar_wait(full_bar + 8 * (g % STAGES), (g / STAGES) & 1);
      const uint8_t* codes = smem + S::kCOff + (g % STAGES) * S::kCBytes;
#pragma unroll
      for (int rs = 0; rs < RS; ++rs) {
        const uint2 c0 = *reinterpret_cast<const uint2*>(codes + (rs * kBN + r0) * kCodeRow + 8 * t);
        const uint2 c1 = *reinterpret_cast<const uint2*>(codes + (rs * kBN + r0 + 8) * kCodeRow + 8 * t);
        if constexpr (FOLD) decode_s8(a[rs], c0, c1, fold_table((short)sc[rs][0]), fold_table((short)sc[rs][1]));
        else decode_s8(a[rs], c0, c1, kUnitTable, kUnitTable);
      }
    };
    // FOLD: int32 dots over all of the CTA's K (the block scales are in the codes' values);
    // else: fp32 sums of the promoted block sums blk.
    using Acc = std::conditional_t<FOLD, int32_t, float>;
    Acc acc[RS][BM / 2];
    int32_t blk[FOLD ? 1 : BM / 2];
#pragma unroll
    for (int rs = 0; rs < RS; ++rs)
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) acc[rs][i] = 0;
    // exact: k-step kt's wgmma (A = a) into blk; while they run, the next k-step's decode (into
    // a_next); then the wait, the stage freed, and the promotion of blk with this k-step's scales.
    // FOLD: k-step kt's wgmma accumulate into acc; the wait lets them run on while k-step kt - 1's
    // are awaited (their A registers are a_next's, their stage is freed), then the next decode.
    auto step = [&](const uint32_t (&a)[RS][4][4], const unsigned short (&sc)[RS][2], uint32_t (&a_next)[RS][4][4],
                    unsigned short (&sc_next)[RS][2], int kt) {
      const int g = it + kt;
      const uint32_t xb = smem_s + (g % STAGES) * S::kXBytes;
      if constexpr (FOLD) {
        wgmma_arrive();
#pragma unroll
        for (int rs = 0; rs < RS; ++rs)
#pragma unroll
          for (int q = 0; q < 4; ++q) wgmma_s8<BM>(acc[rs], a[rs][q], sw128_desc(xb + 32 * q), (kt | q) != 0);
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((g - 1) % STAGES));
        if (kt + 1 < nk) decode(a_next, sc_next, kt + 1);
      } else {
        fence_accumulators(blk);
        wgmma_arrive();
#pragma unroll
        for (int q = 0; q < 4; ++q) wgmma_s8<BM>(blk, a[0][q], sw128_desc(xb + 32 * q), q);
        wgmma_commit();
        if (kt + 1 < nk) decode(a_next, sc_next, kt + 1);
        wgmma_wait<0>();
        fence_accumulators(blk);
        if (lane == 0) mbar_arrive(empty_bar + 8 * (g % STAGES));
        const float s0 = scale_from_bits(sc[0][0]), s1 = scale_from_bits(sc[0][1]);
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) acc[0][i] = fmaf(block_sum_to_float(blk[i]), (i & 2) ? s1 : s0, acc[0][i]);
      }
    };
    uint32_t a0[RS][4][4], a1[RS][4][4];
    unsigned short sc0[RS][2], sc1[RS][2];
    if constexpr (FOLD) {
#pragma unroll
      for (int rs = 0; rs < RS; ++rs) fence_accumulators(acc[rs]);
    }
    decode(a0, sc0, 0);
    for (int kt = 0; kt < nk; kt += 2) {
      step(a0, sc0, a1, sc1, kt);
      if (kt + 1 >= nk) break;
      step(a1, sc1, a0, sc0, kt + 1);
    }
    if constexpr (FOLD) {
      wgmma_wait<0>();
#pragma unroll
      for (int rs = 0; rs < RS; ++rs) fence_accumulators(acc[rs]);
      if (lane == 0) mbar_arrive(empty_bar + 8 * ((it + nk - 1) % STAGES));
    }
    it += nk;

    int t_lo = 0, t_hi = BM;
    if constexpr (SPLIT) {
      Acc* red = reinterpret_cast<Acc*>(smem);
      if (splits == 2) split_k_reduce<BM, STAGES, 2, kRow>(acc[0], red, rank, tid);
      else if (splits == 4) split_k_reduce<BM, STAGES, 4, kRow>(acc[0], red, rank, tid);
      else split_k_reduce<BM, STAGES, 8, kRow>(acc[0], red, rank, tid);
      t_lo = rank * (BM / splits), t_hi = t_lo + BM / splits;
    }
    // The output tile in shared memory as [token][W row]: acc x sx[token] + bias, rounded once, by
    // stmatrix .trans (csrc/ternary_wgmma.cu's epilogue: d[4j + 2h + e] is token 8j + 2t + e of
    // W row r0 + 8h), then written a token row at a time.
    T* out = reinterpret_cast<T*>(smem + S::kOutOff);
    using T2 = typename MmaTraits<T>::T2;
    const int blk_id = lane / 8;
#pragma unroll
    for (int rs = 0; rs < RS; ++rs) {
      float bv[2], wv[2];  // the bias and (FOLD) ws of rows rs kBN + r0 + 8h
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = rs * kBN + r0 + 8 * h, n = n0 + row;
        bv[h] = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
        wv[h] = FOLD ? ws_smem[(tcount & 1) * kRows + row] : 0.f;
      }
      // exact: acc x sx + bias in one fma; FOLD: ((float(acc) x sx) x ws) + bias, each rounded, as
      // activations.reference_linear_w2a8_folded
      auto out_value = [&](Acc v, float sxv, int h) {
        if constexpr (FOLD) return __fadd_rn(__fmul_rn(__fmul_rn(__int2float_rn(v), sxv), wv[h]), bv[h]);
        else return fmaf(v, sxv, bv[h]);
      };
      const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(
          out + (8 * (blk_id / 2) + lane % 8) * S::kOutLd + rs * kBN + wg * 64 + warp * 16 + 8 * (blk_id % 2)));
#pragma unroll
      for (int j = 0; j < BM / 8; j += 2) {  // tokens 8 j .. 8 j + 15
        if (8 * j < t_lo || 8 * j >= t_hi) continue;
        float tx[2][2];  // sx of tokens 8 (j + jj) + 2t + e
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
          for (int e = 0; e < 2; ++e) tx[jj][e] = __ldg(sx + min(m0 + 8 * (j + jj) + 2 * t + e, M - 1));
        uint32_t r[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // block q: tokens 8 (j + q / 2) .., W rows + 8 (q % 2)
          const int i = 4 * (j + q / 2) + 2 * (q % 2);
          const T2 v{Vec<T>::from_float(out_value(acc[rs][i], tx[q / 2][0], q % 2)),
                     Vec<T>::from_float(out_value(acc[rs][i + 1], tx[q / 2][1], q % 2))};
          r[q] = *reinterpret_cast<const uint32_t*>(&v);
        }
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         row_addr + (8 * j - t_lo) * S::kOutLd * (int)sizeof(T)),
                     "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
      }
    }
    mbar_arrive(scales_empty + 8 * (tcount & 1));  // this tile's scales and ws read: the stagers may refill
    mma_sync();
    store_tile<T, BM, kRows>(out, S::kOutLd, y, min(M, m0 + t_hi), N, m0 + t_lo, n0, tid, kMmaThreads);
    mma_sync();  // the output tile read: free for the next epilogue
  }
#endif  // other targets: never launched (the host checks for an sm_90 device)
}

template <typename T, int STAGES, int BM, bool SPLIT, bool FOLD, int RS = 1>
cudaError_t prepare_s8_kernel() {
  static int smem_set[kMaxDevices] = {};
  return opt_in_shared_memory(ternary_wgmma_s8_kernel<T, STAGES, BM, SPLIT, FOLD, RS>,
                              S8Shape<STAGES, BM, RS>::kSmemBytes, smem_set);
}

long s8_tile_count(int M, int N, int bm, int rows = kBN) { return (long)((N + rows - 1) / rows) * ((M + bm - 1) / bm); }

// CTAs of the BM-token kernel that run at once in clusters of `splits` (<= 0 where not asked)
template <int BM>
int s8_cluster_wave(int splits) {
  constexpr int STAGES = kS8StagesOf<BM>;
  static int cached[3][kMaxDevices] = {};
  return per_device(cached[split_slot(splits)], [&](int) {
    auto kernel = ternary_wgmma_s8_kernel<__nv_bfloat16, STAGES, BM, true, false, 1>;
    if (prepare_s8_kernel<__nv_bfloat16, STAGES, BM, true, false>() != cudaSuccess) return -1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        cluster_launch_config(splits * 64, splits, S8Shape<STAGES, BM>::kSmemBytes, nullptr, attr);
    int clusters = 0;
    return cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0 ? clusters * splits
                                                                                                   : -1;
  });
}

// The kernel's divisor of global k-steps into scale blocks, q = block_size / 128, as a magic
// number: __umulhi(2 n, ceil(2^31 / q)) = floor(n / q) exactly for n < 2^16 and q <= 2^15
// (the error n (2^31 mod -q) / (q 2^31) < n / 2^31 < 1 / q); the op checks those bounds
// (kS8MaxBlockSize, kS8MaxKEnd).
uint32_t s8_step_magic(int block_size) {
  const uint64_t q = (uint64_t)(block_size / kBK);
  return (uint32_t)(((1ull << 31) + q - 1) / q);
}

template <typename T, int BM, bool FOLD, int RS = 1>
cudaError_t launch_s8_t(const int8_t* xq, const float* sx, const uint8_t* packed, const __half* scale,
                        const void* bias, void* y, int M, int N, int Kp, int ldp, int lds, int block_size,
                        int k_offset, int splits, cudaStream_t stream) {
  constexpr int STAGES = kS8StagesOf<BM, RS>;
  constexpr int kRows = S8Shape<STAGES, BM, RS>::kRows;
  constexpr bool kCanSplit = RS == 1;  // 256-row tiles run persistent only
  auto kernel = splits > 1 && kCanSplit ? ternary_wgmma_s8_kernel<T, STAGES, BM, kCanSplit, FOLD, RS>
                                        : ternary_wgmma_s8_kernel<T, STAGES, BM, false, FOLD, RS>;
  if (const cudaError_t err = splits > 1 && kCanSplit ? prepare_s8_kernel<T, STAGES, BM, kCanSplit, FOLD, RS>()
                                                      : prepare_s8_kernel<T, STAGES, BM, false, FOLD, RS>();
      err != cudaSuccess)
    return err;
  if (splits > 1 && !kCanSplit) return cudaErrorInvalidValue;
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  CUtensorMap x_map, code_map;
  const cuuint64_t dims[2] = {(cuuint64_t)Kp, (cuuint64_t)M}, strides[1] = {(cuuint64_t)Kp};
  const cuuint32_t box[2] = {kBK, BM}, unit[2] = {1, 1};
  if (encode(&x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(xq), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  const cuuint64_t cdims[2] = {(cuuint64_t)ldp, (cuuint64_t)N}, cstrides[1] = {(cuuint64_t)ldp};
  const cuuint32_t cbox[2] = {kCodeRow, kRows};
  if (encode(&code_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(packed), cdims, cstrides, cbox, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  const unsigned grid = splits > 1 ? (unsigned)(s8_tile_count(M, N, BM) * splits)
                                   : (unsigned)std::min<long>(s8_tile_count(M, N, BM, kRows), std::max(sm_count(), 1));
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = cluster_launch_config(grid, splits, S8Shape<STAGES, BM, RS>::kSmemBytes, stream, attr[0]);
  // programmatic dependent launch after the op's quantize kernel (pdl_wait in the kernel)
  attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs += 1;
  return cudaLaunchKernelEx(&cfg, kernel, x_map, code_map, sx, scale, static_cast<const T*>(bias), static_cast<T*>(y),
                            M, N, Kp, lds, block_size, k_offset, splits, s8_step_magic(block_size));
}

}  // namespace

// The tiling: 128 tokens a tile above M 64, else 64; splits along K by the same kind of cost
// model as choose_wgmma_tiling (k-steps a CTA walks x a k-step's time + the exchange), its
// constants first estimates from the bf16 kernel's fit (a k-step here is 128 weights at twice
// the tensor rate: ~ the bf16 kernel's 64-weight k-step at 128 tokens).
constexpr double kS8StepUs[2] = {0.45, 0.55};         // [64, 128 tokens]
constexpr double kS8SplitUs[3] = {1.84, 3.08, 3.87};  // 2, 4, 8 CTAs
// A k-step of a 256-row tile (folded scales, 128 tokens): twice the products of a 128-row one
// from the same activation tile, measured at 1.54x its time (8B gate_up M 16384 on the H100,
// s8-fold-h100.md: 1.03 against 0.67 us a k-step and wave); with the waves counted this picks the
// faster of the two on all 32 (layer, M >= 256) points of that run (8B and 0.6B shapes).
constexpr double kS8WideStepUs = 0.85;

S8Tiling choose_s8_tiling(int M, int N, int K, int k_split, bool fold, int rows) {
  const int steps = (K + kBK - 1) / kBK;
  const long sms = std::max(sm_count(), 1);
  if (k_split > steps) return {0, 0, 0};
  if (rows == 2 * kBN) return fold && k_split <= 1 ? S8Tiling{128, 1, rows} : S8Tiling{0, 0, 0};
  S8Tiling best{0, 0, kBN};
  double best_us = 0;
  if (fold && rows == 0 && k_split <= 1 && M > 64) {  // 256 W rows x 128 tokens, persistent
    best = {128, 1, 2 * kBN};
    best_us = (double)steps * ((s8_tile_count(M, N, 128, 2 * kBN) + sms - 1) / sms) * kS8WideStepUs;
  }
  for (int bm : {64, 128}) {
    if (bm == 64 && M > 64) continue;  // 64-token tiles only where they hold all of M
    const long tiles = s8_tile_count(M, N, bm);
    const double step_us = kS8StepUs[bm == 128];
    for (int s : {1, 2, 4, 8}) {
      // the epilogue writes a CTA's share of the tile in 16-token stmatrix blocks
      if ((k_split != 0 && k_split != s) || s > steps || bm / s < 16) continue;
      double us = 0;
      if (s == 1) {
        us = (double)steps * ((tiles + sms - 1) / sms) * step_us;
      } else {
        const long wave = bm == 128 ? s8_cluster_wave<128>(s) : s8_cluster_wave<64>(s);
        if (k_split == 0 && (wave <= 0 || tiles * s > wave)) continue;
        us = (double)((steps + s - 1) / s) * step_us + kS8SplitUs[split_slot(s)];
      }
      if (best.tokens == 0 || us < best_us) best = {bm, s, kBN}, best_us = us;
    }
  }
  return best;
}

cudaError_t launch_quantize_s8(bool bf16, const void* x, int8_t* xq, float* sx, int M, int K, int ldq, bool permute,
                               cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  const dim3 grid(M), block(256);
  // natural order: ldq == K, so 8-byte aligned rows; permuted: ldq % 128 == 0, 4-byte words
  if (K % 8 == 0 && K <= kQuantVecMaxK && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(xq) % (permute ? 4 : 8) == 0) {
    // 16-byte vectors to write (the padding's too), the passes that cover them with at most 256
    // threads, and the threads (whole warps) that need
    const int nout = (permute ? ldq : K) / 8;
    const int passes = nout <= kQuantThreads ? 1 : nout <= 2 * kQuantThreads ? 2 : nout <= 4 * kQuantThreads ? 4 : 8;
    const int threads = std::min(kQuantThreads, ((nout + passes - 1) / passes + 31) / 32 * 32);
#define TERNARY_QUANT_VEC(T, P, N) \
  quantize_s8_vec_kernel<T, P, N><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), xq, sx, K, ldq)
#define TERNARY_QUANT_VEC_PASSES(T, P)                                                                   \
  (passes == 1 ? TERNARY_QUANT_VEC(T, P, 1) : passes == 2 ? TERNARY_QUANT_VEC(T, P, 2)                   \
                                            : passes == 4 ? TERNARY_QUANT_VEC(T, P, 4) : TERNARY_QUANT_VEC(T, P, 8))
    if (bf16) permute ? TERNARY_QUANT_VEC_PASSES(__nv_bfloat16, true) : TERNARY_QUANT_VEC_PASSES(__nv_bfloat16, false);
    else permute ? TERNARY_QUANT_VEC_PASSES(__half, true) : TERNARY_QUANT_VEC_PASSES(__half, false);
#undef TERNARY_QUANT_VEC_PASSES
#undef TERNARY_QUANT_VEC
    return cudaGetLastError();
  }
  if (bf16) {
    if (permute) quantize_s8_kernel<__nv_bfloat16, true><<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), xq, sx, K, ldq);
    else quantize_s8_kernel<__nv_bfloat16, false><<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), xq, sx, K, ldq);
  } else {
    if (permute) quantize_s8_kernel<__half, true><<<grid, block, 0, stream>>>(static_cast<const __half*>(x), xq, sx, K, ldq);
    else quantize_s8_kernel<__half, false><<<grid, block, 0, stream>>>(static_cast<const __half*>(x), xq, sx, K, ldq);
  }
  return cudaGetLastError();
}

cudaError_t launch_wgmma_s8(bool bf16, const int8_t* xq, const float* sx, const uint8_t* packed, const __half* scale,
                            const void* bias, void* y, int M, int N, int Kp, int ldp, int lds, int block_size,
                            int k_offset, int k_split, bool fold, int rows, cudaStream_t stream) {
  if (!wgmma_supported()) return cudaErrorNotSupported;
  const S8Tiling tiling = choose_s8_tiling(M, N, Kp, k_split, fold, rows);
  if (tiling.tokens == 0) return cudaErrorInvalidValue;
  if (tiling.rows == 2 * kBN)
    return bf16 ? launch_s8_t<__nv_bfloat16, 128, true, 2>(xq, sx, packed, scale, bias, y, M, N, Kp, ldp, lds,
                                                           block_size, k_offset, 1, stream)
                : launch_s8_t<__half, 128, true, 2>(xq, sx, packed, scale, bias, y, M, N, Kp, ldp, lds, block_size,
                                                    k_offset, 1, stream);
#define TERNARY_LAUNCH(T, BM) \
  (fold ? launch_s8_t<T, BM, true>(xq, sx, packed, scale, bias, y, M, N, Kp, ldp, lds, block_size, k_offset, \
                                   tiling.splits, stream)                                                     \
        : launch_s8_t<T, BM, false>(xq, sx, packed, scale, bias, y, M, N, Kp, ldp, lds, block_size, k_offset, \
                                    tiling.splits, stream))
  if (tiling.tokens == 128) return bf16 ? TERNARY_LAUNCH(__nv_bfloat16, 128) : TERNARY_LAUNCH(__half, 128);
  return bf16 ? TERNARY_LAUNCH(__nv_bfloat16, 64) : TERNARY_LAUNCH(__half, 64);
#undef TERNARY_LAUNCH
}

}  // namespace ternary
