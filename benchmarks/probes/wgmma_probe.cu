// The wgmma kernel (csrc/ternary_wgmma.cu) measured piece by piece, outside torch: one CUDA
// file, built and run on the GPU machine in seconds (no extension build).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DWGMMA_PROBE=0 \
//        benchmarks/probes/wgmma_probe.cu -o /tmp/probe0 && /tmp/probe0
//
// WGMMA_PROBE (bits, see the kernel's hooks): 0 the kernel as served; 1 no decode; 2 no wgmma
// (results then wrong: the check says FAILED). Prints a float64 check of both tiles, then per
// tile (128 and 256 tokens) and shape the mean time of 20 launches (CUDA events; inputs hot in
// L2: a probe of the pipeline, not the benchmark) and, for CTA (0, 0) of the traced shapes at
// the 256 tile, the clock64 of each event per k-step relative to the producer's first issue:
//   issue  the producer issued k-step kt's copies (its stage was free)
//   full   MMA thread 0 saw them land             dec    it finished decoding k-step kt
//   mma    it issued k-step kt's wgmma            done   its wait<1> returned (k-step kt-1 finished)
// Build with -DNO_TRACE for the times without the trace's stores. benchmarks/probes/run_probes.sh
// builds and runs the variants on the GPU machine (seconds; no extension build).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <vector>

#ifndef NO_TRACE
// Events go to shared memory (one predicated st.shared in straight-line PTX) and each role copies
// its own to global memory when it is done. Not to global memory directly: each role's next
// mbarrier arrive (a release) then waited for that store, ~500 cycles an event, and a branch
// inside the MMA warps' wgmma pipeline made ptxas serialize the wgmma (warning C7515).
__device__ long long g_events[6][64];
__shared__ long long s_events[6][64];
#define WGMMA_EVENT(cond, role, kt)                                                                        \
  asm volatile("{\n.reg .pred p;\n.reg .u64 c;\nsetp.ne.u32 p, %1, 0;\nmov.u64 c, %%clock64;\n@p st.shared.u64 [%0], c;\n}\n" \
               ::"r"((unsigned)__cvta_generic_to_shared(&s_events[role][(kt) & 63])),                    \
               "r"((unsigned)((cond) && blockIdx.x == 0 && blockIdx.y == 0 && (kt) < 64))                  \
               : "memory")
#define WGMMA_FLUSH(cond, role, n)                                                                    \
  do {                                                                                                \
    if ((cond) && blockIdx.x == 0 && blockIdx.y == 0)                                                 \
      for (int i_ = 0; i_ < (n) && i_ < 64; ++i_) g_events[role][i_] = s_events[role][i_];            \
  } while (0)
#endif

#include "../../csrc/ternary_wgmma.cu"
#include "probe_util.cuh"

// The tile of bm tokens and `splits` CTAs a tile along K (0 = the launcher's choice).
static cudaError_t launch_bm(int bm, int splits, const void* x, const uint8_t* p, const void* sc, void* y, int M,
                             int N, int K, int ldp, int lds, int block_size, int k_offset) {
  return ternary::launch_wgmma(true, x, p, static_cast<const __half*>(sc), nullptr, y, M, N, K, ldp, lds, block_size,
                               k_offset, bm, splits, 0);
}

static float bits_to_float(unsigned short v, bool bf16) {
  if (bf16) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
  return __half2float(__ushort_as_half(v));
}

// The kernel against a float64 reference on one small shape: max |y - ref| / max |ref|.
static double check(int bm, int splits, int M, int K, int N, int block_size, int k_offset) {
  const int ldp = ((K + 3) / 4 + 15) / 16 * 16, lds = (k_offset + K + block_size - 1) / block_size;
  std::vector<unsigned short> hx((size_t)M * K), hs((size_t)N * lds), hy((size_t)M * N);
  std::vector<uint8_t> hp((size_t)N * ldp, 0);
  for (auto& v : hx) v = 0x3f80 ^ (rand() & 0x807f);  // bf16 in +-[1, 2)
  for (auto& v : hs) v = 0x2000 | (rand() & 0x3ff);
  for (int n = 0; n < N; ++n)
    for (int b = 0; b < (K + 3) / 4; ++b) hp[(size_t)n * ldp + b] = rand() & 0xff;
  void *x, *y, *sc;
  uint8_t* p;
  CHECK(cudaMalloc(&x, hx.size() * 2)); CHECK(cudaMalloc(&y, hy.size() * 2));
  CHECK(cudaMalloc(&sc, hs.size() * 2)); CHECK(cudaMalloc(&p, hp.size()));
  CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(sc, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(p, hp.data(), hp.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0xff, hy.size() * 2));  // poisoned: NaN in bf16
  CHECK(launch_bm(bm, splits, x, p, sc, y, M, N, K, ldp, lds, block_size, k_offset));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> w((size_t)N * K);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const int c = (hp[(size_t)n * ldp + k / 4] >> (2 * (k % 4))) & 3;
      w[(size_t)n * K + k] = (c == 1 ? 1.0 : c == 2 ? -1.0 : 0.0) *
                             bits_to_float(hs[(size_t)n * lds + (k + k_offset) / block_size], false);
    }
  double max_ref = 0, max_err = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double r = 0;
      for (int k = 0; k < K; ++k) r += bits_to_float(hx[(size_t)m * K + k], true) * w[(size_t)n * K + k];
      const double got = bits_to_float(hy[(size_t)m * N + n], true);
      max_ref = std::max(max_ref, std::fabs(r));
      max_err = std::max(max_err, std::isnan(got) ? 1e30 : std::fabs(got - r));
    }
  cudaFree(x); cudaFree(y); cudaFree(sc); cudaFree(p);
  return max_err / max_ref;
}

// Every tile (256, 128 tokens) x CTAs a tile along K (1, 2, 4, 8) on the benchmark's layers at
// M 64-4096, and the launcher's own choice (auto), timed as bench_kernel times (CUDA graphs,
// inputs rotated past L2, median us a call): what choose_wgmma_tiling's model is fitted to.
static void split_sweep() {
  int l2 = 0;
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("\nsplit sweep (us a call: CUDA graphs, inputs rotated past L2; tile x CTAs a tile along K; - = not "
              "valid)\n%-12s %5s", "layer", "M");
  for (int bm : {256, 128})
    for (int s : {1, 2, 4, 8}) std::printf(" %6dx%d", bm, s);
  std::printf("   auto\n");
  for (int M : {64, 128, 256, 512, 1024, 2048, 4096})
    for (const ProbeShape& l : kShapes) {
      const int K = l.k, N = l.n, ldp = ((K + 3) / 4 + 15) / 16 * 16, lds = (K + 127) / 128;
      const size_t xb = (size_t)M * K * 2, pb = (size_t)N * ldp, sb = (size_t)N * lds * 2;
      const int copies = rotating_copies(l2, (long)(xb + pb + sb));
      uint8_t *x, *p, *sc;
      void* y;
      CHECK(cudaMalloc(&x, xb * copies));
      CHECK(cudaMalloc(&p, pb * copies));
      CHECK(cudaMalloc(&sc, sb * copies));
      CHECK(cudaMalloc(&y, (size_t)M * N * 2));
      CHECK(cudaMemset(x, 0x3c, xb * copies));
      CHECK(cudaMemset(sc, 0x20, sb * copies));
      CHECK(cudaMemset(p, 0x96, pb * copies));
      auto time = [&](int bm, int s) {
        return time_graph(st, copies, [&](cudaStream_t, int i) {
          CHECK(ternary::launch_wgmma(true, x + xb * i, p + pb * i, reinterpret_cast<const __half*>(sc + sb * i),
                                      nullptr, y, M, N, K, ldp, lds, 128, 0, bm, s, st));
        });
      };
      std::printf("%-12s %5d", l.name, M);
      for (int bm : {256, 128})
        for (int s : {1, 2, 4, 8}) {
          if (s > (K + 63) / 64) { std::printf(" %8s", "-"); continue; }
          std::printf(" %8.2f", time(bm, s));
        }
      const ternary::WgmmaTiling t = ternary::choose_wgmma_tiling(M, N, K, 0, 0);
      std::printf("   %dx%d %.2f\n", t.tokens, t.splits, time(0, 0));
      CHECK(cudaFree(x));
      CHECK(cudaFree(y));
      CHECK(cudaFree(sc));
      CHECK(cudaFree(p));
    }
  CHECK(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
  struct Shape { const char* name; int M, K, N; bool trace; };
  const std::vector<Shape> shapes = {
      {"o/tp4", 64, 512, 1024, true},    {"gate_up", 64, 1024, 6144, false}, {"gate_up", 256, 1024, 6144, true},
      {"o", 64, 2048, 1024, false},      {"gate_up", 4096, 1024, 6144, true}, {"o", 4096, 2048, 1024, false},
      {"qkv", 4096, 1024, 4096, false},  {"down", 4096, 3072, 1024, false}, {"o/tp4", 4096, 512, 1024, false},
      {"gate_up", 16384, 1024, 6144, false}};
  std::printf("WGMMA_PROBE=%d, %s\n", WGMMA_PROBE,
#ifdef NO_TRACE
              "no trace");
#else
              "trace");
#endif
  for (int bm : {128, 256})
    for (int splits : {1, 2, 4, 8}) {
      const double e1 = check(bm, splits, 200, 640, 384, 128, 0), e2 = check(bm, splits, 300, 576, 136, 256, 64),
                   e3 = check(bm, splits, 37, 1000, 200, 128, 0);
      std::printf("tile %d, %d CTAs a tile along K: check against float64: %.2e (M 200 K 640 N 384), %.2e (M 300 K "
                  "576 N 136, blocks of 256, offset 64), %.2e (M 37 K 1000 N 200)%s\n",
                  bm, splits, e1, e2, e3, e1 < 1e-2 && e2 < 1e-2 && e3 < 1e-2 ? "" : "  FAILED");
    }
  for (int bm : {128, 256})
  for (const Shape& sh : shapes) {
    const int ldp = ((sh.K + 3) / 4 + 15) / 16 * 16, lds = (sh.K + 127) / 128;
    std::vector<unsigned short> hx((size_t)sh.M * sh.K), hs((size_t)sh.N * lds);
    std::vector<uint8_t> hp((size_t)sh.N * ldp);
    srand(1);
    for (auto& v : hx) v = 0x3c00 ^ (rand() & 0x83ff);  // fp16/bf16 bit patterns of modest size
    for (auto& v : hs) v = 0x2000 | (rand() & 0x3ff);
    for (auto& v : hp) v = rand() & 0xff;
    void *x, *y, *sc;
    uint8_t* p;
    CHECK(cudaMalloc(&x, hx.size() * 2));
    CHECK(cudaMalloc(&y, (size_t)sh.M * sh.N * 2));
    CHECK(cudaMalloc(&sc, hs.size() * 2));
    CHECK(cudaMalloc(&p, hp.size()));
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(sc, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(p, hp.data(), hp.size(), cudaMemcpyHostToDevice));
    auto launch = [&] {
      CHECK(launch_bm(bm, 1, x, p, sc, y, sh.M, sh.N, sh.K, ldp, lds, 128, 0));
    };
    for (int i = 0; i < 3; ++i) launch();
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    const int steps = (sh.K + 63) / 64, ctas = ((sh.N + 127) / 128) * ((sh.M + bm - 1) / bm);
    const double us = ms * 1000 / 20;
    std::printf("tile %d %-8s M %5d K %5d N %5d: %8.2f us  (%d CTAs, %d k-steps, %.1f TFLOP/s)\n", bm, sh.name, sh.M, sh.K, sh.N,
                us, ctas, steps, 2.0 * sh.M * sh.K * sh.N / us / 1e6);
#ifndef NO_TRACE
    if (sh.trace && bm == 256) {
      long long ev[6][64];
      CHECK(cudaMemcpyFromSymbol(ev, g_events, sizeof(ev)));
      const long long t0 = ev[0][0];
      std::printf("  cycles from the first issue; the first 128 tokens of the output staged in shared memory at %lld\n", ev[5][0] - t0);
      std::printf("  %4s %8s %8s %8s %8s %8s\n", "kt", "issue", "full", "dec", "mma", "done");
      for (int kt = 0; kt < steps && kt < 64; ++kt)
        std::printf("  %4d %8lld %8lld %8lld %8lld %8lld\n", kt, ev[0][kt] - t0, ev[1][kt] - t0, ev[2][kt] - t0,
                    ev[3][kt] - t0, ev[4][kt] - t0);
    }
#endif
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(sc));
    CHECK(cudaFree(p));
  }
  split_sweep();
  int clk = 0;
  CHECK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  std::printf("SM clock (attribute): %d MHz\n", clk / 1000);
  return 0;
}
