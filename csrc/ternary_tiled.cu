// Mid/large-M ternary GEMM on the tensor cores: y[M, N] = x[M, K] @ W^T (+ bias), M >= ~64.
//
// The weights never leave their 2-bit form in memory: a CTA copies a tile's packed codes and
// activations into shared memory with cp.async, STAGES - 1 stages ahead, and each warp decodes
// its codes in registers straight into mma.sync A fragments. No bf16 copy of W exists at any
// point (the dequantize + cuBLAS path writes and reads one per call).
//
// Layout and decode are those of the small-M kernel (ternary_mma.cu, its header explains them):
// W rows are the MMA's M side, tokens its N side; thread t of a quad takes physical weights
// 32t + 4s .. 32t + 4s + 3 of a 128-weight unit (one scale block) at step s (one code byte per
// W row, 4 activations per token). Unlike the small-M kernel, the block's scale is multiplied
// into the decoded weights (one bf16x2/half2 multiply per A register: the same W values the
// dequantize path gives cuBLAS, fp32 accumulation): a per-block fp32 partial sum would cost a
// second accumulator tile in registers and halve the tokens a warp can take. The activations
// come from shared memory, 16 bytes (two steps) of a token row per load; the 16-byte chunks of
// a token row are XOR-swizzled (`swizzle`) so that the 8 lanes of each load phase hit 8
// different bank groups.
//
// Work split: a CTA of 8 warps owns BW = WW*16R W rows x BT = WT*8NT tokens; its warps form a
// WW x WT x WK grid. A pipeline stage holds WK consecutive units and warp_k takes the
// warp_k-th, whole (so the decode and the scale multiply of a unit are paid once per 8 mma
// steps); the WK partial tiles are added through shared memory in a fixed order (deterministic)
// at the end. The output tile is staged in shared memory and written with 16-byte row stores.
//
// Requires (checked by the host): K % 8 == 0 and x 16-byte aligned (16-byte cp.async of
// activations), rows padded to 8 bytes (ternary_plugin.ops.pad_packed_rows), block_size and
// k_offset multiples of 128.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"

namespace ternary {
namespace {

constexpr int kTiledWarps = 8;
constexpr int kUnit = 128;            // weights of K per stage (one scale block)
constexpr int kXRowBytes = kUnit * 2;    // one token's activations of a unit: 16 chunks of 16 bytes
constexpr int kCodeRowBytes = kUnit / 4;  // one W row's codes of a unit

// Chunk c (0..15) of token row `row` is stored at chunk swizzle(row, c). A load phase is 8 lanes
// (4 t x 2 rows g, g + 1) reading chunk 4t + q: c % 8 = 4 (t & 1) + q, and the XOR folds in
// t >> 1 (= c >> 3) and row & 1, so the 8 lanes land on 8 different 16-byte bank groups.
__device__ __forceinline__ int swizzle(int row, int c) { return c ^ (((row & 1) << 1) | ((c >> 3) & 1)); }

template <int WW, int WT, int WK, int R, int NT, int STAGES>
struct TiledShape {
  static_assert(WW * WT * WK == kTiledWarps && WK >= 1, "8 warps");
  static constexpr int BW = WW * 16 * R, BT = WT * 8 * NT;
  static_assert(BT * 16 % (kTiledWarps * 32) == 0 && BW * 4 % (kTiledWarps * 32) == 0, "whole copy rounds");
  // a stage holds WK consecutive units, one for each warp_k
  static constexpr int kXUnitBytes = BT * kXRowBytes, kCUnitBytes = BW * kCodeRowBytes;
  static constexpr int kStageBytes = WK * (kXUnitBytes + kCUnitBytes);
  static constexpr int kTileFloats = R * NT * 4 * 32;  // one warp's accumulators
  static constexpr int kOutLd = BW + 8;                 // output tile row, padded: no bank conflicts
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kRedBytes = (WK - 1) * WW * WT * kTileFloats * 4;
  static constexpr int kOutBytes = BT * kOutLd * 2;
  static constexpr int kSmemBytes =
      kPipeBytes > kRedBytes ? (kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes)
                             : (kRedBytes > kOutBytes ? kRedBytes : kOutBytes);
};

template <typename T, int WW, int WT, int WK, int R, int NT, int STAGES>
__global__ void __launch_bounds__(kTiledWarps * 32, 1)
ternary_tiled_kernel(const T* __restrict__ x,            // [M, K], K % 8 == 0, 16-byte aligned
                     const uint8_t* __restrict__ packed,  // [N, ldp], ldp % 8 == 0
                     const __half* __restrict__ scale,    // [N, lds]
                     const T* __restrict__ bias,          // [N] or nullptr
                     T* __restrict__ y,                   // [M, N]
                     int M, int N, int K, int ldp, int lds, int block_size, int k_offset) {
  using S = TiledShape<WW, WT, WK, R, NT, STAGES>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_w = warp % WW, warp_t = (warp / WW) % WT, warp_k = warp / (WW * WT);
  const int n0 = blockIdx.x * S::BW, m0 = blockIdx.y * S::BT;
  const int units = (K + kUnit - 1) / kUnit;
  const int groups = (units + WK - 1) / WK;  // stages' worth of units: warp_k takes unit WK*grp + warp_k

  // One stage's WK units: activations past M or K and codes past N or ldp are zero-filled by
  // cp.async (the source pointer is then any valid address; nothing is read). A round of the
  // 256 threads copies 16 token rows (16 chunks of 16 bytes each) and 64 W rows (4 chunks of 8
  // bytes); a thread's chunk column and its rows' parity (the swizzle) are the same in every
  // round and unit, so only the unit's k and the round's row move its addresses.
  constexpr int kThreads = kTiledWarps * 32, kXRounds = S::BT * 16 / kThreads, kCRounds = S::BW * 4 / kThreads;
  const int xr = threadIdx.x / 16, xc = threadIdx.x % 16;
  const int xs_off = xr * kXRowBytes + 16 * swizzle(xr, xc);  // + 16 rows a round (even: same swizzle)
  const T* xg = x + (size_t)min(m0 + xr, M - 1) * K + 8 * xc;
  const int cr = threadIdx.x / 4, cc = threadIdx.x % 4;
  const uint8_t* cg = packed + (size_t)min(n0 + cr, N - 1) * ldp + 8 * cc;
  auto load_group = [&](int stage, int grp) {
#pragma unroll
    for (int i = 0; i < WK; ++i) {
      const int u = grp * WK + i;
      if (u >= units) break;
      uint8_t* xs = smem + stage * S::kStageBytes + i * S::kXUnitBytes;
      uint8_t* cs = smem + stage * S::kStageBytes + WK * S::kXUnitBytes + i * S::kCUnitBytes;
      const bool k_ok = u * kUnit + 8 * xc < K;
#pragma unroll
      for (int it = 0; it < kXRounds; ++it) {
        const bool ok = k_ok && m0 + xr + 16 * it < M;
        cp_async16(xs + xs_off + it * 16 * kXRowBytes, ok ? xg + (size_t)it * 16 * K + u * kUnit : x, ok);
      }
      const bool byte_ok = u * kCodeRowBytes + 8 * cc < ldp;
#pragma unroll
      for (int it = 0; it < kCRounds; ++it) {
        const bool ok = byte_ok && n0 + cr + 64 * it < N;
        cp_async8(cs + cr * kCodeRowBytes + 8 * cc + it * 64 * kCodeRowBytes,
                  ok ? cg + (size_t)it * 64 * ldp + u * kCodeRowBytes : packed, ok);
      }
    }
  };

  // This thread's W rows (tile-local) and their scale rows (clamped past N: never stored). The
  // scales of the warp's next unit are loaded one group ahead (their latency is not waited for).
  int wrow[R][2];
  const unsigned short* srow[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wrow[r][h] = warp_w * 16 * R + 16 * r + g + 8 * h;
      srow[r][h] = reinterpret_cast<const unsigned short*>(scale) + (size_t)min(n0 + wrow[r][h], N - 1) * lds;
    }
  auto load_scales = [&](unsigned short (&sb)[R][2], int u) {
    const int col = (min(u, units - 1) * kUnit + k_offset) / block_size;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) sb[r][h] = __ldg(srow[r][h] + col);
  };

  float acc[R][NT][4];
  zero_tiles(acc);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < groups) load_group(s, s);
    cp_async_commit();
  }
  unsigned short sb_cur[R][2], sb_nxt[R][2];
  if (units > 0) load_scales(sb_cur, warp_k);
  for (int grp = 0; grp < groups; ++grp) {
    cp_async_wait<STAGES - 2>();  // group grp has landed (this thread's copies) ...
    __syncthreads();              // ... everyone's, and stage (grp - 1) % STAGES is free
    if (grp + STAGES - 1 < groups) load_group((grp + STAGES - 1) % STAGES, grp + STAGES - 1);
    cp_async_commit();
    load_scales(sb_nxt, (grp + 1) * WK + warp_k);

    const int u = grp * WK + warp_k;
    if (u < units) {  // warp-uniform
      const uint8_t* xs = smem + (grp % STAGES) * S::kStageBytes + warp_k * S::kXUnitBytes;
      const uint8_t* cs = smem + (grp % STAGES) * S::kStageBytes + WK * S::kXUnitBytes + warp_k * S::kCUnitBytes;
      uint2 codes[R][2];
      uint32_t s2[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          codes[r][h] = *reinterpret_cast<const uint2*>(cs + wrow[r][h] * kCodeRowBytes + 8 * t);
          s2[r][h] = scale_pair<T>(sb_cur[r][h]);
        }
      // token rows warp_t*8NT + 8j + g: all of g's parity, so one swizzled chunk per step pair
      const uint8_t* xrow = xs + (warp_t * 8 * NT + g) * kXRowBytes;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // steps 2q, 2q + 1: code bytes 2q, 2q + 1 of the thread's 8
        uint32_t a[2][R][4];
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int st = 2 * q + half;
            uint32_t* f = a[half][r];
            decode_byte<T>(st < 4 ? codes[r][0].x : codes[r][0].y, st & 3, f[0], f[2]);  // row g
            decode_byte<T>(st < 4 ? codes[r][1].x : codes[r][1].y, st & 3, f[1], f[3]);  // row g + 8
            // the block's scale goes into the weights (as the dequantize path's bf16 W does)
            f[0] = mul2<T>(f[0], s2[r][0]);
            f[2] = mul2<T>(f[2], s2[r][0]);
            f[1] = mul2<T>(f[1], s2[r][1]);
            f[3] = mul2<T>(f[3], s2[r][1]);
          }
        const uint8_t* xq = xrow + 16 * swizzle(g, 4 * t + q);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4 xb = *reinterpret_cast<const uint4*>(xq + j * 8 * kXRowBytes);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            mma<T>(acc[r][j], a[0][r], xb.x, xb.y);
            mma<T>(acc[r][j], a[1][r], xb.z, xb.w);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) sb_cur[r][h] = sb_nxt[r][h];
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory is free from here

  // WK > 1: warps 1.. of each output tile hand their partials to warp 0, added in warp order
  if constexpr (WK > 1) {
    float* red = reinterpret_cast<float*>(smem);
    const int tile = warp % (WW * WT);
    if (warp_k > 0) {
      float* dst = red + ((warp_k - 1) * WW * WT + tile) * S::kTileFloats;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) dst[((r * NT + j) * 4 + i) * 32 + lane] = acc[r][j][i];
    }
    __syncthreads();
    if (warp_k == 0) {
      for (int kk = 1; kk < WK; ++kk) {
        const float* src = red + ((kk - 1) * WW * WT + tile) * S::kTileFloats;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][j][i] += src[((r * NT + j) * 4 + i) * 32 + lane];
      }
    }
    __syncthreads();
  }

  // The output tile in shared memory as [token][W row] (bias added, rounded once) ...
  T* out = reinterpret_cast<T*>(smem);
  if (warp_k == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + wrow[r][h];
        const float b = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {  // C fragment: c[2h + e] -> W row g + 8h, token 2t + e
            const int tok = warp_t * 8 * NT + 8 * j + 2 * t + e;
            out[tok * S::kOutLd + wrow[r][h]] = Vec<T>::from_float(acc[r][j][2 * h + e] + b);
          }
      }
  }
  __syncthreads();
  // ... then written a token row at a time
  store_tile<T, S::BT, S::BW>(out, S::kOutLd, y, M, N, m0, n0, threadIdx.x, kTiledWarps * 32);
}

template <typename T, int WW, int WT, int WK, int R, int NT, int STAGES>
cudaError_t launch_shape(const T* x, const uint8_t* packed, const __half* scale, const T* bias, T* y, int M, int N,
                         int K, int ldp, int lds, int block_size, int k_offset, cudaStream_t stream) {
  using S = TiledShape<WW, WT, WK, R, NT, STAGES>;
  auto kernel = ternary_tiled_kernel<T, WW, WT, WK, R, NT, STAGES>;
  static int smem_set[kMaxDevices] = {};
  if (const cudaError_t err = opt_in_shared_memory(kernel, S::kSmemBytes, smem_set); err != cudaSuccess) return err;
  const dim3 grid((N + S::BW - 1) / S::BW, (M + S::BT - 1) / S::BT);
  kernel<<<grid, kTiledWarps * 32, S::kSmemBytes, stream>>>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size,
                                                             k_offset);
  return cudaGetLastError();
}

// Auto: the large tile where it still gives every SM a CTA, else the small one.
int auto_tile(int M, int N) {
  const long large = (long)((N + 127) / 128) * ((M + 127) / 128);
  return large >= sm_count() ? 128 : 64;
}

// Two tiles, 3 stages of 72 KB each: "large" 128 W rows x 128 tokens (warps 4 x 1 x 2: four
// 32 x 128 output tiles, two units a stage) and "small" 64 x 64 (warps 2 x 1 x 4: two 32 x 64
// output tiles, four units a stage, for shapes whose large tiles would leave SMs idle).
template <typename T>
cudaError_t launch_tiled_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                           int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tile,
                           cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  if (tile == 0) tile = auto_tile(M, N);
  switch (tile) {
    case 128:
      return launch_shape<T, 4, 1, 2, 2, 16, 3>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset,
                                            stream);
    case 64:
      return launch_shape<T, 2, 1, 4, 2, 8, 3>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset,
                                            stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// tile: W rows (and tokens) per CTA, 64 or 128; 0 = auto (above).
cudaError_t launch_tiled(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tile,
                         cudaStream_t stream) {
  return bf16 ? launch_tiled_t<__nv_bfloat16>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset,
                                              tile, stream)
              : launch_tiled_t<__half>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, tile,
                                       stream);
}

}  // namespace ternary
