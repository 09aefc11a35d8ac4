// Small M (<= 16 tokens) on a layer that holds Humming's int2 group-128 layout (bf16 / fp16
// activations): this repository's memory-bound kernel over Humming's own tensors, so a layer
// stored in Humming's layout (2 bits a weight, no second copy) runs at M 1-16 without Humming's
// tile machinery. The layout (humming-kernels 0.1.20, HummingLayer.transform() for int2 g128 and
// float activations, the same on every NVIDIA arch; ternary_plugin/humming_backend.py's
// `transformed_reference` is its executable description):
//
//   weight [K/16, N] int32: word T[r, c] holds 16 sign-magnitude codes (0 -> 00, +1 -> 01,
//          -1 -> 11), code p in bits 2p, 2p+1, of W row n = 64(c>>6) + 32(c&1) + 16((p>>2)&1)
//          + 8((p>>1)&1) + ((c>>3)&7) and column k = 16r + 8(p&1) + 2((c>>1)&3) + (p>>3)
//   scale  [K/128, N] x's dtype: scale[G, 64b + 8g + j] is row 64b + 16(j>>1) + 8(j&1) + g's
//
// That is mma.sync m16n8k16's A fragment with W rows as A's rows: lane L = 4g + h of a warp
// loads the 8 bytes T[r, 64b + 2L .. 2L+1] (a warp: 256 contiguous bytes, 64 W rows x 16
// columns), and word jj's codes p = 4a + {0, 2, 1, 3} are the registers a0..a3 of the m16 tile
// 2jj + a. A code pair (p, p + 8) becomes a bf16x2 (or fp16x2) of {0, +2, -2} in two operations,
// (w << (14 - 2p)) & 0xC000C000 (the magnitude bit on the exponent's top bit, the sign bit on
// the sign); the 0.5 is folded into the end. x is B (16 columns x 8 tokens, tokens >= M zero);
// each 128-column group sums in fp32 and is weighed by its 8 scales (one 16-byte load a lane).
//
// Work: a CTA is one 64-row block of W and a run of K's groups, its warps taking the groups in
// turn, each with the next group's 8 loads in flight while it multiplies one. Where N / 64
// blocks leave the GPU under-filled, K is split over CTAs (k_split): each writes its fp32 sums to
// its own slice of a workspace and the block's last CTA to finish (a zeroed counter a block) adds
// the slices in split order and writes y, so the result does not depend on which CTA ran first.
// Accumulation is fp32 throughout; y is rounded once to x's dtype, bias added in fp32.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

namespace ternary {
namespace {

constexpr int kHgWarps = 4;
constexpr int kHgThreads = kHgWarps * 32;

template <typename T>
struct HgMma;

template <>
struct HgMma<__nv_bfloat16> {
  __device__ static void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <>
struct HgMma<__half> {
  __device__ static void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};

// Code pair (p, p + 8) of w as a 16-bit float pair of {0, +2, -2}.
template <int P>
__device__ __forceinline__ uint32_t hg_pair(uint32_t w) {
  return (P == 7 ? w : (w << (14 - 2 * P))) & 0xC000C000u;
}

// One group (8 k16 rows) of one warp: acc[tile][token tile][4] += W tile x x tile.
template <typename T, int NT>
__device__ __forceinline__ void hg_group(const uint2 (&w)[8], const T* __restrict__ x, int M, int K, int group,
                                         int g, int h, float (&acc)[4][NT][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int k0 = (group * 8 + s) * 16 + 2 * h;
    uint32_t b[NT][2];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int tok = 8 * t + g;
      if (tok < M) {
        const T* xr = x + (size_t)tok * K + k0;
        b[t][0] = __ldg(reinterpret_cast<const uint32_t*>(xr));
        b[t][1] = __ldg(reinterpret_cast<const uint32_t*>(xr + 8));
      } else {
        b[t][0] = b[t][1] = 0u;
      }
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const uint32_t word = jj ? w[s].y : w[s].x;
      const uint32_t a0[4] = {hg_pair<0>(word), hg_pair<2>(word), hg_pair<1>(word), hg_pair<3>(word)};
      const uint32_t a1[4] = {hg_pair<4>(word), hg_pair<6>(word), hg_pair<5>(word), hg_pair<7>(word)};
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        HgMma<T>::run(acc[2 * jj][t], a0, b[t][0], b[t][1]);
        HgMma<T>::run(acc[2 * jj + 1][t], a1, b[t][0], b[t][1]);
      }
    }
  }
}

template <typename T, int NT>
__global__ void __launch_bounds__(kHgThreads)
humming_gemv_kernel(const T* __restrict__ x,            // [M, K]
                    const uint32_t* __restrict__ wq,    // [K/16, N]
                    const T* __restrict__ scale,        // [K/128, N]
                    const T* __restrict__ bias,         // [N] or nullptr
                    T* __restrict__ y,                  // [M, N]
                    float* __restrict__ work,           // k_split > 1: [k_split, M, N] fp32
                    unsigned int* __restrict__ counters,  // k_split > 1: [N/64], zeroed
                    int M, int N, int K, int k_split) {
  const int block = blockIdx.x, split = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, h = lane % 4;
  const int groups = K / 128, per_split = (groups + k_split - 1) / k_split;
  const int g_begin = split * per_split, g_end = min(groups, g_begin + per_split);

  float tot[4][NT][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[i][t][e] = 0.f;

  const uint32_t* wcol = wq + (size_t)block * 64 + 2 * lane;
  auto load_group = [&](int grp, uint2 (&w)[8]) {
#pragma unroll
    for (int s = 0; s < 8; ++s) w[s] = __ldg(reinterpret_cast<const uint2*>(wcol + (size_t)(grp * 8 + s) * N));
  };
  uint2 cur[8], nxt[8];
  int grp = g_begin + warp;
  if (grp < g_end) load_group(grp, cur);
  while (grp < g_end) {
    const int next = grp + kHgWarps;
    if (next < g_end) load_group(next, nxt);
    const uint4 sv = __ldg(reinterpret_cast<const uint4*>(scale + (size_t)grp * N + (size_t)block * 64 + 8 * g));
    const T* sc = reinterpret_cast<const T*>(&sv);
    float acc[4][NT][4];
    hg_group<T, NT>(cur, x, M, K, grp, g, h, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float s_lo = HgMma<T>::to_float(sc[2 * i]), s_hi = HgMma<T>::to_float(sc[2 * i + 1]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        tot[i][t][0] = fmaf(acc[i][t][0], s_lo, tot[i][t][0]);
        tot[i][t][1] = fmaf(acc[i][t][1], s_lo, tot[i][t][1]);
        tot[i][t][2] = fmaf(acc[i][t][2], s_hi, tot[i][t][2]);
        tot[i][t][3] = fmaf(acc[i][t][3], s_hi, tot[i][t][3]);
      }
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) cur[s] = nxt[s];
    grp = next;
  }

  // the warps' sums, [reg][warp][lane] (a lane's registers apart: no bank conflicts), then one
  // thread an output: reg = (4 t + i) * 4 + e <-> row 16 i + g + 8 (e >> 1), token 8 t + 2 h + (e & 1)
  constexpr int kRegs = 4 * NT * 4;
  __shared__ float part[kRegs][kHgWarps][32];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(4 * t + i) * 4 + e][warp][lane] = tot[i][t][e];
  __syncthreads();
  const bool last_pass = k_split == 1;
  for (int o = threadIdx.x; o < kRegs * 32; o += kHgThreads) {
    const int reg = o / 32, l = o % 32;
    const int t = reg / 16, i = (reg / 4) % 4, e = reg % 4;
    const int n = block * 64 + 16 * i + (l / 4) + 8 * (e >> 1), tok = 8 * t + 2 * (l % 4) + (e & 1);
    if (tok >= M) continue;
    float v = 0.f;
#pragma unroll
    for (int wi = 0; wi < kHgWarps; ++wi) v += part[reg][wi][l];
    v *= 0.5f;  // the codes were decoded as +-2
    if (last_pass) {
      if (bias) v += HgMma<T>::to_float(bias[n]);
      y[(size_t)tok * N + n] = HgMma<T>::from_float(v);
    } else {
      work[((size_t)split * M + tok) * N + n] = v;
    }
  }
  if (last_pass) return;
  // k_split > 1: the block's last CTA to add its sums writes y
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counters + block, 1u) == (unsigned int)(k_split - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int o = threadIdx.x; o < 64 * M; o += kHgThreads) {
    const int tok = o / 64, n = block * 64 + o % 64;
    float v = 0.f;
    for (int sp = 0; sp < k_split; ++sp) v += __ldcg(work + ((size_t)sp * M + tok) * N + n);
    if (bias) v += HgMma<T>::to_float(bias[n]);
    y[(size_t)tok * N + n] = HgMma<T>::from_float(v);
  }
}

template <typename T, int NT>
cudaError_t launch_hg(const void* x, const uint32_t* wq, const void* scale, const void* bias, void* y, float* work,
                      unsigned int* counters, int M, int N, int K, int k_split, cudaStream_t stream) {
  const dim3 grid(N / 64, k_split);
  humming_gemv_kernel<T, NT><<<grid, kHgThreads, 0, stream>>>(
      static_cast<const T*>(x), wq, static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y),
      work, counters, M, N, K, k_split);
  return cudaGetLastError();
}

// CTAs an SM of the kernel that M takes (M <= 8: one 8-token tile, else two), from the runtime's
// occupancy calculator for this build (sm_90a: 98 registers a thread -> 4 CTAs an SM, 156 -> 3;
// sm_80: 96 -> 5, 153 -> 3; the fp16 kernels use as many as the bf16 ones). Asked once per
// process, on the device current then.
template <int NT>
int hg_resident_ctas() {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, humming_gemv_kernel<__nv_bfloat16, NT>, kHgThreads, 0) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return std::max(1, n);
}

}  // namespace

// CTAs along K for N / 64 row blocks: the largest power of two that keeps the grid in one wave
// (N / 64 x k_split <= resident CTAs an SM x SMs), at most K / 512 (a group a warp). The 8B layers'
// sweep on the H200 (132 SMs; benchmarks/results/humming-gemv-h200.md, 2026-12-05, us), one wave
// = 528 CTAs at M 1-8, 396 at M 9-16:
// - M 1 and 4, the best k_split is the largest inside the wave: qkv 4 (384 CTAs) 9.13 / 9.92,
//   o 8 (512) 7.97 / 8.68, gate_up 1 (384) 17.54 / 17.87, down 8 (512) 12.62 / 13.43; the next
//   power, out of the wave, costs 19-34 % (qkv 8: 11.34, o 16: 10.69, gate_up 2: 22.70, down 16:
//   15.08 at M 1), and so does overshooting it a little (ceil(4 x SMs / blocks), the rule before:
//   qkv 6 and down 9, 576 CTAs, 11.49 and 15.55).
// - M 16, the same with 3 CTAs an SM: o 4 (256) 13.15 against 8 (512) 16.90, down 4 20.98 against
//   26.34, gate_up 1 25.01 against 33.74, qkv 4 (384) 14.94 (best: 1, 14.64).
// On the 0.6B shapes K / 512 binds first: the same k_split as the rule before.
int humming_gemv_k_split(int M, int N, int K, int sms) {
  static const int resident[2] = {hg_resident_ctas<1>(), hg_resident_ctas<2>()};
  const int blocks = N / 64, groups = K / 128;
  const long long wave = (long long)resident[M <= 8 ? 0 : 1] * sms;
  int split = 1;
  while ((long long)blocks * split * 2 <= wave) split *= 2;
  return std::max(1, std::min(split, groups / kHgWarps));
}

cudaError_t launch_humming_gemv(bool bf16, const void* x, const uint32_t* wq, const void* scale, const void* bias,
                                void* y, float* work, unsigned int* counters, int M, int N, int K, int k_split,
                                cudaStream_t stream) {
#define TERNARY_HG(T, NT) launch_hg<T, NT>(x, wq, scale, bias, y, work, counters, M, N, K, k_split, stream)
  if (bf16) return M <= 8 ? TERNARY_HG(__nv_bfloat16, 1) : TERNARY_HG(__nv_bfloat16, 2);
  return M <= 8 ? TERNARY_HG(__half, 1) : TERNARY_HG(__half, 2);
#undef TERNARY_HG
}

}  // namespace ternary
