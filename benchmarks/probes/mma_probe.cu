// The small-M kernel (csrc/ternary_mma.cu) timed outside torch, in bench_kernel.py's harness (a CUDA
// graph of `copies` calls on rotating weights, min(64, max(2, ceil(2 x L2 / bytes))) copies, the
// median of 50 event-timed replays over the calls), launched as the op launches it at M <= 16
// (16 W rows a CTA, 64-weight units at M 9-16 with K <= 1024, the auto split along K):
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a [-DPDL] [-DMMA_PROBE=b] [-DWARPS=w] \
//        benchmarks/probes/mma_probe.cu -o /tmp/mma && /tmp/mma
//
// Columns (us per call):
//   alone       back-to-back calls of the kernel
//   norm,gemm   a call pair: a row-copy kernel that writes this call's activations (a stand-in for
//               the RMSNorm before qkv / gate_up: one CTA a token, launched plainly, never
//               triggers), then the kernel; the norm's own time is printed once
// With -DPDL the kernel is launched as the plugin launches it, with programmatic stream
// serialization (ternary_mma.cu, pdl_wait): "alone" then overlaps successive calls (the
// harness's view), "norm,gemm" shows what a model's graph gets (its first weights load while the
// norm finishes). MMA_PROBE leaves a stage out (see the kernel's hook); its results are wrong.
// Each build checks its first call against a float64 reference (codes, scales, activations
// random; output poisoned; with the norm: activations poisoned too, then written by the norm):
// "ok" under 1e-2 relative error, else FAILED (expected with MMA_PROBE). run_probes.sh builds
// the variants and runs them on the GPU machine (seconds; no extension build).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../csrc/ternary_mma.cu"
#include "probe_util.cuh"

using bf16 = __nv_bfloat16;
#ifdef PDL
constexpr bool kPdl = true;
#else
constexpr bool kPdl = false;
#endif

// One CTA per token: copies the token's row (a stand-in for an RMSNorm writing the activations).
__global__ void norm_rows(const uint4* __restrict__ src, uint4* __restrict__ dst, int row16) {
  for (int i = threadIdx.x; i < row16; i += blockDim.x) dst[blockIdx.x * row16 + i] = src[blockIdx.x * row16 + i];
}

// The op's launch at M <= 16 (ternary_ops.cpp: 64-weight units at M 9-16 where K <=
// TERNARY_MMA64_MAX_K, 1024, and for the 16-warp kernel where K <= 1024; warps, W rows per CTA
// and the split along K automatic). -DWARPS=8 or 16 forces the warps a CTA.
#ifndef WARPS
#define WARPS 0
#endif
static void gemm(const bf16* x, const uint8_t* p, const __half* s, bf16* y, int M, int N, int K, cudaStream_t st) {
  const int unit = M > 8 && K <= 1024 ? 64 : 128, unit16 = K <= 1024 ? 64 : 128;
  CHECK(ternary::launch_mma(true, x, p, s, nullptr, y, M, N, K, K / 4, K / 128, 128, 0, 0, 0, unit, unit16, WARPS,
                            kPdl, st));
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Relative error (Frobenius) of y [M, N] against the float64 product of x [M, K] and the ternary W,
// over W rows 0-511 and the last 64 (the last CTA's tile).
static double rel_err(const std::vector<uint16_t>& y, const std::vector<uint16_t>& x, const std::vector<uint8_t>& p,
                      const std::vector<__half>& s, int M, int N, int K) {
  double num = 0, den = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      if (n >= 512 && n < N - 64) continue;
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        const int code = (p[(size_t)n * (K / 4) + k / 4] >> (2 * (k % 4))) & 3;
        if (code == 1 || code == 2)
          acc += (code == 1 ? 1.0 : -1.0) * __half2float(s[(size_t)n * (K / 128) + k / 128]) *
                 bf16_to_float(x[(size_t)m * K + k]);
      }
      const double d = bf16_to_float(y[(size_t)m * N + n]) - acc;
      num += d * d;
      den += acc * acc;
    }
  return std::sqrt(num / den);
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const long l2 = prop.l2CacheSize;
  std::printf("%s, PDL %s, MMA_PROBE %d\n", prop.name, kPdl ? "on" : "off", MMA_PROBE);
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int ms[] = {1, 8, 16};
  std::printf("| shape | M | copies | check | alone us | norm,gemm us | norm us |\n|---|---|---|---|---|---|---|\n");
  srand(1);
  for (const ProbeShape& sh : kShapes)
    for (int M : ms) {
      const int K = sh.k, N = sh.n;
      const long wbytes = ternary_bytes(K, N), xbytes = (long)M * K * 2;
      const int copies = rotating_copies(l2, wbytes + xbytes);
      std::vector<uint8_t> hp((size_t)N * (K / 4));
      for (auto& b : hp)  // four codes in {0, 1, 2} (11 is reserved)
        b = static_cast<uint8_t>((rand() % 3) | (rand() % 3) << 2 | (rand() % 3) << 4 | (rand() % 3) << 6);
      std::vector<__half> hs((size_t)N * (K / 128));
      for (auto& v : hs) v = __float2half(0.01f + 0.05f * (rand() / (float)RAND_MAX));
      std::vector<uint16_t> hx((size_t)M * K);
      for (auto& v : hx) v = float_to_bf16(2.f * (rand() / (float)RAND_MAX) - 1.f);
      std::vector<uint8_t*> p(copies);
      std::vector<__half*> s(copies);
      std::vector<bf16*> x(copies), x_src(copies), y(copies);
      for (int i = 0; i < copies; ++i) {
        CHECK(cudaMalloc(&p[i], hp.size()));
        CHECK(cudaMalloc(&s[i], hs.size() * 2));
        CHECK(cudaMalloc(&x[i], hx.size() * 2));
        CHECK(cudaMalloc(&x_src[i], hx.size() * 2));
        CHECK(cudaMalloc(&y[i], (size_t)M * N * 2));
        CHECK(cudaMemcpy(p[i], hp.data(), hp.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(s[i], hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(x[i], hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(x_src[i], hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      }
      const int row16 = K * 2 / 16;
      auto norm = [&](cudaStream_t q, int i) {
        norm_rows<<<M, 128, 0, q>>>(reinterpret_cast<const uint4*>(x_src[i]), reinterpret_cast<uint4*>(x[i]), row16);
      };
      // checks: alone, then after the norm with the activations poisoned first
      std::vector<uint16_t> hy((size_t)M * N);
      double err[2];
      for (int c = 0; c < 2; ++c) {
        CHECK(cudaMemset(y[0], 0xff, hy.size() * 2));
        if (c == 1) CHECK(cudaMemset(x[0], 0xff, hx.size() * 2));
        CHECK(cudaDeviceSynchronize());
        if (c == 1) norm(st, 0);
        gemm(x[0], p[0], s[0], y[0], M, N, K, st);
        CHECK(cudaStreamSynchronize(st));
        CHECK(cudaMemcpy(hy.data(), y[0], hy.size() * 2, cudaMemcpyDeviceToHost));
        err[c] = rel_err(hy, hx, hp, hs, M, N, K);
      }
      const bool ok = err[0] < 1e-2 && err[1] < 1e-2;
      const double alone =
          time_graph(st, copies, [&](cudaStream_t q, int i) { gemm(x[i], p[i], s[i], y[i], M, N, K, q); });
      const double pair = time_graph(st, copies, [&](cudaStream_t q, int i) {
        norm(q, i);
        gemm(x[i], p[i], s[i], y[i], M, N, K, q);
      });
      const double norm_us = time_graph(st, copies, [&](cudaStream_t q, int i) { norm(q, i); });
      std::printf("| %s | %d | %d | %s %.1e | %.3f | %.3f | %.3f |\n", sh.name, M, copies, ok ? "ok" : "FAILED",
                  std::max(err[0], err[1]), alone, pair, norm_us);
      for (int i = 0; i < copies; ++i) {
        CHECK(cudaFree(p[i]));
        CHECK(cudaFree(s[i]));
        CHECK(cudaFree(x[i]));
        CHECK(cudaFree(x_src[i]));
        CHECK(cudaFree(y[i]));
      }
    }
  return 0;
}
