// Ternary GEMM for the H200 (and any sm_80+ GPU): y[M, N] = x[M, K] @ W^T (+ bias).
//
// W is never materialised in full precision by the small-M kernel: it reads the packed
// 2-bit codes of docs/quant_format.md straight from global memory, decodes them in
// registers and accumulates in fp32, applying each float16 scale once per block segment.
//
//   x       [M, K]        bf16 or fp16, row-major, contiguous
//   packed  [N, ldp]      uint8; row n holds ceil(K/4) bytes of codes (4 a byte, first
//                         weight in bits 0-1), then zero padding up to ldp (ldp % 8 == 0:
//                         the plugin pads rows once in process_weights_after_loading so
//                         every row starts 8-byte aligned for the vector loads below)
//   scale   [N, lds]      fp16; weight k of a row uses scale[(k + k_offset) / block_size]
//   bias    [N] or null   x's dtype
//   y       [M, N]        x's dtype
//
// The kernels of this file; ternary_ops.cpp chooses by M (the tensor-core kernel of
// ternary_mma.cu first, up to TERNARY_MMA_MAX_M rows, where a layer's blocks start on
// 128-weight boundaries):
//
//   M <= TERNARY_GEMV_MAX_M (default 1): ternary_gemv_kernel. Memory-bound: every weight byte is read once per
//     tile of MT activation rows. One warp per output row n; the warp walks K in chunks of
//     32 weights (8 bytes of codes) per lane:
//
//        lane:      0        1        2              31
//        K:     [0, 32) [32, 64) [64, 96)  ...  [992, 1024)   then +1024 per iteration
//
//     A chunk of 32 weights spans at most two scale blocks (block_size >= 32, whatever the
//     shard's k_offset), so each lane keeps two partial sums per activation row and multiplies each by
//     its scale once per chunk. The warp then reduces across lanes with shuffles.
//
//   larger M: ternary_dequant_kernel writes W (x's dtype) to a transient buffer and cuBLAS
//     multiplies (the same split as vLLM's AWQ path for >= 256 tokens). Compute-bound there,
//     the dequantization costs N*K*2 bytes of writes against 2*M*N*K flops.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"

namespace ternary {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;   // one warp per output row: 256 threads a block
constexpr int kChunk = 32;         // weights per lane per step (8 bytes of codes)

// Code -> value without a branch: 00 -> 0, 01 -> +1, 10 -> -1, 11 (reserved) -> 0.
__device__ __forceinline__ float code_value(uint32_t word, int i) {
  uint32_t c = (word >> (2 * i)) & 3u;
  return float(int(c & 1u) - int(c >> 1));
}

template <typename T, int MT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp)
ternary_gemv_kernel(const T* __restrict__ x,          // [M, K]
                    const uint8_t* __restrict__ packed,  // [N, ldp]
                    const __half* __restrict__ scale,    // [N, lds]
                    const T* __restrict__ bias,          // [N] or nullptr
                    T* __restrict__ y,                   // [M, N]
                    int M, int N, int K, int ldp, int lds, int block_size, int k_offset) {
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  const int m0 = blockIdx.y * MT;
  if (n >= N) return;
  const int mt = min(MT, M - m0);
  const bool vec_ok = rows_vec_ok(x, K);

  const uint8_t* prow = packed + (size_t)n * ldp;
  const unsigned short* srow = reinterpret_cast<const unsigned short*>(scale) + (size_t)n * lds;
  // Activation rows past M read row M-1 (never stored): no branch around the loads.
  const T* xrow[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) xrow[m] = x + (size_t)min(m0 + m, M - 1) * K;
  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[m] = 0.f;

  for (int k0 = lane * kChunk; k0 < K; k0 += kWarp * kChunk) {
    // Every load of the chunk first: 32 codes (bytes [k0/4, k0/4 + 8) of the row; ldp padding
    // keeps the load in bounds), both scale blocks it may touch, 32 activations per row.
    const uint2 codes = __ldg(reinterpret_cast<const uint2*>(prow + k0 / 4));
    const auto [b0, split] = block_split(k0, kChunk, k_offset, block_size);
    const bool two_blocks = split < kChunk && (k0 + split) < K;
    const unsigned short s0bits = __ldg(srow + b0);
    const unsigned short s1bits = __ldg(srow + min(b0 + 1, lds - 1));
    uint4 xr[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int g = 0; g < 4; ++g) xr[m][g] = load8(xrow[m], k0 + g * 8, K, vec_ok);

    float part0[MT], part1[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) part0[m] = part1[m] = 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {  // 4 groups of 8 weights
      const uint32_t word = (g < 2) ? codes.x : codes.y;
      const int base = (g & 1) * 8;  // first code of this group inside `word`
      float w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = code_value(word, base + i);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const T* xv = reinterpret_cast<const T*>(&xr[m][g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float prod = w[i] * Vec<T>::to_float(xv[i]);
          if (g * 8 + i < split) part0[m] += prod; else part1[m] += prod;
        }
      }
    }
    const float s0 = scale_from_bits(s0bits);
    const float s1 = two_blocks ? scale_from_bits(s1bits) : 0.f;
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] += part0[m] * s0 + part1[m] * s1;
  }

#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float v = acc[m];
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    acc[m] = v;
  }
  if (lane == 0) {
    const float b = bias ? Vec<T>::to_float(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < mt) y[(size_t)(m0 + m) * N + n] = Vec<T>::from_float(acc[m] + b);
  }
}

// W[n, k] = value(code) * scale, in T, for the large-M path. A thread makes CHUNKS chunks of 8
// weights (2 bytes of codes, one 16-byte store each); chunk i of the flattened [N, K / 8] grid
// goes to w + 8 i, and a block's chunks for one j are consecutive, so each store instruction of
// a warp writes 512 contiguous bytes. All loads of a thread (codes, scales) are issued before the
// first conversion. Row and column come from one 32-bit division per chunk (v5 divided in 64
// bits). 4 chunks a thread on layers of 2M weights and more, 1 below (measured on the H200, this
// session's probe: 4 chunks cut the dequantize of o, qkv, gate_up at M 4096 by 0.2-0.6 us and cost
// the 0.5-1.5M-weight tp-4 shards 0.1-0.5 us). (16 weights a thread, two 16-byte stores 32
// bytes apart per thread, was 0.3-0.7 us slower on every large-M shape: v5's run.)
constexpr int kDequantThreads = 256;
template <typename T, int CHUNKS>
__global__ void __launch_bounds__(kDequantThreads)
ternary_dequant_kernel(const uint8_t* __restrict__ packed,  // [N, ldp]
                       const __half* __restrict__ scale,    // [N, lds]
                       T* __restrict__ w,                   // [N, K]
                       int N, int K, int ldp, int lds, int block_size, int k_offset) {
  const unsigned groups = (K + 7) / 8, chunks = (unsigned)N * groups;  // the host checks < 2^32
  const unsigned base = blockIdx.x * (kDequantThreads * CHUNKS) + threadIdx.x;
  const bool even_rows = ldp % 2 == 0;  // two code bytes in one aligned load (k0 / 4 is even)
  uint32_t word[CHUNKS];
  unsigned short s0[CHUNKS], s1[CHUNKS];
  unsigned n[CHUNKS];
  int k0[CHUNKS], split[CHUNKS];
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const unsigned i = min(base + j * kDequantThreads, chunks - 1);  // past the end: the last chunk, not stored
    n[j] = i / groups;
    k0[j] = (int)(i - n[j] * groups) * 8;
    const uint8_t* prow = packed + (size_t)n[j] * ldp;
    const int kb = k0[j] / 4;  // the chunk's first code byte
    word[j] = even_rows ? __ldg(reinterpret_cast<const unsigned short*>(prow + kb))
                        : prow[kb] | ((kb + 1 < ldp ? (uint32_t)prow[kb + 1] : 0u) << 8);
    const auto [b0, sp] = block_split(k0[j], 8, k_offset, block_size);
    const unsigned short* srow = reinterpret_cast<const unsigned short*>(scale) + (size_t)n[j] * lds;
    split[j] = sp;
    s0[j] = __ldg(srow + b0);
    s1[j] = (sp < 8 && k0[j] + sp < K) ? __ldg(srow + b0 + 1) : 0;
  }
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    if (base + j * kDequantThreads >= chunks) return;
    const float f0 = scale_from_bits(s0[j]), f1 = scale_from_bits(s1[j]);
    T out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = Vec<T>::from_float(code_value(word[j], e) * (e < split[j] ? f0 : f1));
    T* dst = w + (size_t)n[j] * K + k0[j];
    if (K % 8 == 0) {  // rows 16-byte aligned
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (k0[j] + e < K) dst[e] = out[e];
    }
  }
}

template <typename T>
static cudaError_t launch_gemv_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                                 void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                                 cudaStream_t stream) {
  const dim3 block(kRowsPerBlock * kWarp);
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  // Largest activation tile that M fills; bigger M loops over tiles in grid.y.
#define TERNARY_LAUNCH(MT_)                                                                          \
  ternary_gemv_kernel<T, MT_><<<dim3((N + kRowsPerBlock - 1) / kRowsPerBlock, (M + MT_ - 1) / MT_), \
                                block, 0, stream>>>(xt, packed, scale, bt, yt, M, N, K, ldp, lds,   \
                                                    block_size, k_offset)
  // (MT = 8 took 255 registers once every load of a chunk is hoisted: M > 4 uses tiles of 4.)
  if (M <= 1) TERNARY_LAUNCH(1);
  else if (M <= 2) TERNARY_LAUNCH(2);
  else TERNARY_LAUNCH(4);
#undef TERNARY_LAUNCH
  return cudaGetLastError();
}

cudaError_t launch_gemv(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                        void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                        cudaStream_t stream) {
  return bf16 ? launch_gemv_t<__nv_bfloat16>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, stream)
              : launch_gemv_t<__half>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, stream);
}

cudaError_t launch_dequant(bool bf16, const uint8_t* packed, const __half* scale, void* w, int N, int K, int ldp,
                           int lds, int block_size, int k_offset, cudaStream_t stream) {
  const long chunks = (long)N * ((K + 7) / 8);
  if (chunks >= (1l << 32)) return cudaErrorInvalidValue;  // the kernel's 32-bit chunk index
  const bool four = (long)N * K >= (1l << 21);
#define TERNARY_LAUNCH(T, C)                                                                               \
  ternary_dequant_kernel<T, C><<<(unsigned)((chunks + kDequantThreads * C - 1) / (kDequantThreads * C)), \
                                 kDequantThreads, 0, stream>>>(packed, scale, static_cast<T*>(w), N, K, ldp, lds,  \
                                                               block_size, k_offset)
  if (bf16) {
    if (four) TERNARY_LAUNCH(__nv_bfloat16, 4);
    else TERNARY_LAUNCH(__nv_bfloat16, 1);
  } else {
    if (four) TERNARY_LAUNCH(__half, 4);
    else TERNARY_LAUNCH(__half, 1);
  }
#undef TERNARY_LAUNCH
  return cudaGetLastError();
}

}  // namespace ternary
