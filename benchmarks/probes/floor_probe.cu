// What a small-M call can cost at best in bench_kernel.py's harness, measured without torch or the
// extension: one CUDA file, built and run on the GPU machine in seconds.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/floor_probe.cu \
//        -o /tmp/floor && /tmp/floor
//
// Same method as bench_kernel.time_graph: a CUDA graph of `copies` calls (each on its own buffer,
// min(64, max(2, ceil(2 x L2 / bytes))) copies, so past L2 from ~1.6 MB on), 5 replays of
// warm-up, the median of 50 event-timed replays over the calls in the graph. Per call:
//   empty        an empty kernel (1 CTA of 32 threads; and 528 CTAs of 256)
//   stream       a kernel that only reads `bytes` (the packed codes + scales of a shape at M = 1),
//                every 16-byte load of a thread issued before any use, one store per warp: the
//                best a weight-streaming kernel can do here, with no decode and no math
//   stream+pdl   the same launched with programmatic stream serialization, triggering its
//                dependents at entry and waiting (griddepcontrol.wait) only before its store:
//                successive calls overlap, as they would in this harness if the op used PDL
//   norm,stream  a call pair: a one-CTA kernel that reads and writes 2 KB (a stand-in for the
//                RMSNorm before qkv / gate_up; launched plainly, it never triggers), then stream;
//                with pdl, stream is launched with programmatic serialization and loads its bytes
//                before griddepcontrol.wait: what PDL could give in a model's graph
// A second table reads the same bytes the way the small-M kernel (csrc/ternary_mma.cu, M = 1:
// 16 W rows a CTA, 8 warps taking the 128-weight blocks round-robin, thread (g, t) reading 8
// code bytes of rows g and g + 8 and their 2-byte scales) does, adding its stages one by one,
// with no decode and no math (XOR instead): which part of the kernel's time above `stream` is
// the access pattern and which the chain of stages.
//   codes         the 8-byte code loads alone, a store per warp
//   +scales       and the 2-byte scale loads
//   +x            and the activation loads (64 bytes a thread per block, token 0, from L2)
//   +reduce       and the cross-warp reduction through shared memory, a barrier, one store
//                 per W row: the kernel's chain without decode and mma
// (Where a warp has several blocks, K > 1024, these walk them without the kernel's prefetch of
// the next block and without its split along K: compare on K <= 1024 first.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_util.cuh"

__global__ void empty_kernel() {}

// One-CTA stand-in for an RMSNorm at M = 1 (hidden 1024, bf16): 2 KB in, 2 KB out.
__global__ void norm_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst) {
  uint4 v = src[threadIdx.x];
  v.x ^= 0x5a5a5a5a;
  dst[threadIdx.x] = v;
}

template <int PER, bool PDL>
__global__ void __launch_bounds__(256) stream_kernel(const uint4* __restrict__ src, long n16, unsigned* out) {
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long base = static_cast<long>(blockIdx.x) * blockDim.x * PER + threadIdx.x;
  uint4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const long j = base + static_cast<long>(i) * blockDim.x;
    v[i] = j < n16 ? __ldg(src + j) : make_uint4(0, 0, 0, 0);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
#pragma unroll
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x % 32 == 0) out[blockIdx.x * 8 + threadIdx.x / 32] = acc;
}

// The small-M kernel's access pattern at M = 1 (see the header); STAGE 0 codes, 1 +scales,
// 2 +x, 3 +reduce. Loads of a block are all issued before any use, as in the kernel.
template <int STAGE>
__global__ void __launch_bounds__(256)
pattern_kernel(const uint8_t* __restrict__ codes, const uint16_t* __restrict__ sc, const uint4* __restrict__ x, int K,
               unsigned* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int ldp = K / 4, lds = K / 128, nblocks = K / 128;
  const int n0 = blockIdx.x * 16;
  const uint8_t* row0 = codes + static_cast<size_t>(n0 + g) * ldp;
  const uint8_t* row8 = row0 + static_cast<size_t>(8) * ldp;
  unsigned acc = 0;
  for (int b = warp; b < nblocks; b += 8) {
    const uint2 c0 = __ldg(reinterpret_cast<const uint2*>(row0 + b * 32 + 8 * t));
    const uint2 c8 = __ldg(reinterpret_cast<const uint2*>(row8 + b * 32 + 8 * t));
    unsigned v = c0.x ^ c0.y ^ c8.x ^ c8.y;
    if (STAGE >= 1)
      v ^= __ldg(sc + static_cast<size_t>(n0 + g) * lds + b) ^ __ldg(sc + static_cast<size_t>(n0 + g + 8) * lds + b);
    if (STAGE >= 2) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // 32 activations = 64 bytes of token 0
        const uint4 xv = __ldg(x + (b * 128 + 32 * t) / 8 + j);
        v ^= xv.x ^ xv.y ^ xv.z ^ xv.w;
      }
    }
    acc ^= v;
  }
  if (STAGE < 3) {
    if (lane == 0) out[blockIdx.x * 8 + warp] = acc;
    return;
  }
  __shared__ unsigned red[8][32];
  red[warp][lane] = acc;
  __syncthreads();
  if (threadIdx.x < 16) {  // one output per W row, summed over the warps in a fixed order
    unsigned v = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) v ^= red[w][(threadIdx.x % 8) * 4] ^ red[w][(threadIdx.x % 8) * 4 + 1];
    out[blockIdx.x * 16 + threadIdx.x] = v;
  }
}

using PatternFn = void (*)(const uint8_t*, const uint16_t*, const uint4*, int, unsigned*);
constexpr PatternFn kPatterns[4] = {pattern_kernel<0>, pattern_kernel<1>, pattern_kernel<2>, pattern_kernel<3>};

using StreamFn = void (*)(const uint4*, long, unsigned*);

template <int PER>
static StreamFn stream_fn(bool pdl) {
  return pdl ? stream_kernel<PER, true> : stream_kernel<PER, false>;
}

static void launch_stream(cudaStream_t s, StreamFn fn, int per, const uint4* src, long n16, unsigned* out, bool pdl) {
  const long grid = std::max<long>(1, (n16 + 256L * per - 1) / (256L * per));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr[1] = {pdl_attribute()};
  cfg.attrs = pdl ? attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  CHECK(cudaLaunchKernelEx(&cfg, fn, src, n16, out));
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const long l2 = prop.l2CacheSize;
  std::printf("%s, %d SMs, L2 %ld MB\n", prop.name, prop.multiProcessorCount, l2 >> 20);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::printf("empty kernel, 1 CTA x 32: %.3f us/call\n",
              time_graph(s, 64, [](cudaStream_t st, int) { empty_kernel<<<1, 32, 0, st>>>(); }));
  std::printf("empty kernel, 528 CTAs x 256: %.3f us/call\n",
              time_graph(s, 64, [](cudaStream_t st, int) { empty_kernel<<<528, 256, 0, st>>>(); }));

  const long max_bytes = 1024L * 6144 * 2;  // gate_up's bf16 weight, the largest read here
  uint4* norm_in;
  uint4* norm_out;
  CHECK(cudaMalloc(&norm_in, 2048));
  CHECK(cudaMalloc(&norm_out, 2048));
  CHECK(cudaMemset(norm_in, 1, 2048));
  std::vector<uint4*> src(64);
  std::vector<unsigned*> out(64);
  for (int i = 0; i < 64; ++i) {
    CHECK(cudaMalloc(&src[i], max_bytes));
    CHECK(cudaMemset(src[i], i, max_bytes));
    CHECK(cudaMalloc(&out[i], 1 << 16));
  }
  const double norm_us =
      time_graph(s, 64, [&](cudaStream_t st, int) { norm_kernel<<<1, 128, 0, st>>>(norm_in, norm_out); });
  std::printf("norm stand-in alone: %.3f us/call\n\n", norm_us);
  std::printf("| shape | MB | copies | stream us (per 1/2/4 loads a thread) | stream+pdl us | norm,stream us | "
              "norm,stream+pdl us | best stream GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  // Each shape's packed codes + scales (the weights a call reads at M = 1), then gate_up's bf16
  // weight (what cuBLAS reads).
  auto stream_row = [&](const char* name, long bytes) {
    const long n16 = bytes / 16;
    const int copies = rotating_copies(l2, bytes);
    double plain[3], best = 1e30, best_pdl = 1e30, pair = 1e30, pair_pdl = 1e30;
    const int pers[3] = {1, 2, 4};
    for (int pi = 0; pi < 3; ++pi) {
      const int per = pers[pi];
      const StreamFn f = per == 1 ? stream_fn<1>(false) : per == 2 ? stream_fn<2>(false) : stream_fn<4>(false);
      const StreamFn fp = per == 1 ? stream_fn<1>(true) : per == 2 ? stream_fn<2>(true) : stream_fn<4>(true);
      plain[pi] = time_graph(s, copies, [&](cudaStream_t st, int i) {
        launch_stream(st, f, per, src[i], n16, out[i], false);
      });
      best = std::min(best, plain[pi]);
      best_pdl = std::min(best_pdl, time_graph(s, copies, [&](cudaStream_t st, int i) {
        launch_stream(st, fp, per, src[i], n16, out[i], true);
      }));
      pair = std::min(pair, time_graph(s, copies, [&](cudaStream_t st, int i) {
        norm_kernel<<<1, 128, 0, st>>>(norm_in, norm_out);
        launch_stream(st, f, per, src[i], n16, out[i], false);
      }));
      pair_pdl = std::min(pair_pdl, time_graph(s, copies, [&](cudaStream_t st, int i) {
        norm_kernel<<<1, 128, 0, st>>>(norm_in, norm_out);
        launch_stream(st, fp, per, src[i], n16, out[i], true);
      }));
    }
    std::printf("| %s | %.3f | %d | %.3f / %.3f / %.3f | %.3f | %.3f | %.3f | %.0f |\n", name, bytes / 1e6, copies,
                plain[0], plain[1], plain[2], best_pdl, pair, pair_pdl, bytes / (best * 1e-6) / 1e9);
  };
  for (const ProbeShape& sh : kShapes) stream_row(sh.name, ternary_bytes(sh.k, sh.n));
  stream_row("gate_up bf16", max_bytes);

  // The small-M kernel's access pattern (second table in the header): codes and scales of each
  // copy in one buffer (codes first, scales after them), x (token 0) one shared 6 KB buffer.
  uint4* xbuf;
  CHECK(cudaMalloc(&xbuf, 3072 * 2));
  CHECK(cudaMemset(xbuf, 3, 3072 * 2));
  std::printf("\nThe small-M kernel's access pattern at M = 1 (us per call; no decode, no math):\n\n");
  std::printf("| shape | stream | codes | +scales | +x | +reduce |\n|---|---|---|---|---|---|\n");
  for (const ProbeShape& sh : kShapes) {
    const long cbytes = static_cast<long>(sh.n) * (sh.k / 4), bytes = ternary_bytes(sh.k, sh.n);
    const int copies = rotating_copies(l2, bytes);
    const int k = sh.k, grid = sh.n / 16;
    double t[5];
    t[0] = time_graph(s, copies, [&](cudaStream_t st, int i) {
      launch_stream(st, stream_fn<1>(false), 1, src[i], bytes / 16, out[i], false);
    });
    for (int v = 0; v < 4; ++v)
      t[v + 1] = time_graph(s, copies, [&](cudaStream_t st, int i) {
        const uint8_t* c = reinterpret_cast<const uint8_t*>(src[i]);
        kPatterns[v]<<<grid, 256, 0, st>>>(c, reinterpret_cast<const uint16_t*>(c + cbytes), xbuf, k, out[i]);
      });
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |\n", sh.name, t[0], t[1], t[2], t[3], t[4]);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}
