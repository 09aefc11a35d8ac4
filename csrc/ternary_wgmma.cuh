// What the wgmma kernels share (csrc/ternary_wgmma.cu: bf16/fp16 activations; csrc/ternary_wgmma_s8.cu:
// int8 activations): the warp roles, PTX wrappers (wgmma, mbarriers, cluster barriers), the split-K
// reduction through distributed shared memory, and the host's tensor-map encoder and launch
// configuration. Device code for sm_90a only (the guards), host code everywhere.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace ternary {
namespace wg {

constexpr int kMmaThreads = 256;                     // warpgroups 0, 1
constexpr int kThreads = kMmaThreads + 128;         // + the producer warpgroup (one thread of it copies)
// Registers a thread after setmaxnreg: the producer's warpgroup gives its registers to the MMA
// warpgroups (128 x 40 + 256 x 232 <= 64 K), whose 128 accumulators, two A fragment sets and
// decode need ~200 at 256 tokens (168, the even share of 384 threads, spilled and serialized the wgmma).
[[maybe_unused]] constexpr int kProducerRegs = 40, kMmaRegs = 232;  // used by the sm_90a code only
// Rows of a CTA's tile on the W side (two MMA warpgroups of 64)
constexpr int kBN = 128;

// Index of a split (CTAs a tile along K: 2, 4, 8) in the per-split tables below.
constexpr int split_slot(int splits) { return splits == 2 ? 0 : splits == 4 ? 1 : 2; }

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: start address >> 4,
// leading-dimension offset 1 (unused by this swizzle), stride 1024 B between 8-row atoms,
// swizzle mode 1 (128 B) in bits 62-63. A k16 step inside the 64-wide row is +32 bytes of start.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the accumulators in place around the asynchronous wgmma (as CUTLASS's
// warpgroup_fence_operand): the compiler must not move or reuse them while wgmma writes them.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// mbarriers (shared::cta): init, arrive, and the wait for the phase of a given parity
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Every thread of the cluster (all CTAs, all warps) waits for all. RELEASE: shared-memory writes
// before it, remote ones included, are seen by every thread after it (ptxas emits a GPU-scope
// fence for it); without, it orders execution only (enough where the writes come after it).
template <bool RELEASE>
__device__ __forceinline__ void cluster_barrier() {
  if constexpr (RELEASE)
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  else
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// A barrier of the MMA warpgroups only (named barrier 1; 0 is __syncthreads')
__device__ __forceinline__ void mma_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kMmaThreads) : "memory"); }
// An int32 accumulator pinned the same way (the s8 kernel's block sums)
template <int R>
__device__ __forceinline__ void fence_accumulators(int32_t (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(acc[i])::"memory");
}
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Split-K across a cluster of `splits` CTAs that computed partial sums of one tile: CTA q ends up
// with the whole sums of its share, accumulators [q ch, (q + 1) ch) of every thread (ch = BM / 2 /
// splits: tokens q BM / splits .. + BM / splits - 1, as d[4j + 2h + e] is token 8j + ...). Each CTA
// stores the other shares into their owners' shared memory (the activation stages, free once
// every CTA of the cluster has passed the first barrier: copies landed and wgmma done), as
// [sender][ch / 4][thread] float4 so a warp's stores are 512 contiguous bytes; then each adds the
// partials of its share in rank order (the same order on every run: deterministic).
// Acc: float (fp32 partial sums) or int32_t (the s8 kernel's folded-scale dots, added exactly).
template <int BM, int STAGES, int SPLITS, int ROW = 128, typename Acc>
__device__ __forceinline__ void split_k_reduce(Acc (&acc)[BM / 2], Acc* red, int rank, int tid) {
  static_assert(STAGES * BM * ROW >= BM * 512, "the receive buffer fits in the activation stages");
  using V4 = std::conditional_t<std::is_same_v<Acc, float>, float4, int4>;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int ch = BM / 2 / SPLITS;
  Acc* mine = red + 4 * tid;  // + 4 kMmaThreads (sender ch / 4 + v): 4-vector v of the sender's share
  cluster_barrier<false>();  // every CTA's stages are read (copies landed, wgmma done): free to receive
#pragma unroll
  for (int q = 0; q < SPLITS; ++q) {
    if (q == rank) continue;
    Acc* dst = cluster.map_shared_rank(mine, q) + 4 * kMmaThreads * (rank * (ch / 4));
#pragma unroll
    for (int v = 0; v < ch / 4; ++v) {
      const int i = q * ch + 4 * v;
      *reinterpret_cast<V4*>(dst + 4 * kMmaThreads * v) = V4{acc[i], acc[i + 1], acc[i + 2], acc[i + 3]};
    }
  }
  cluster_barrier<true>();  // every share has arrived
#pragma unroll
  for (int r = 0; r < SPLITS; ++r) {
    if (r != rank) continue;
#pragma unroll
    for (int v = 0; v < ch / 4; ++v) {
      const int i = r * ch + 4 * v;
      V4 s{0, 0, 0, 0};
#pragma unroll
      for (int q = 0; q < SPLITS; ++q) {
        const V4 p = q == r ? V4{acc[i], acc[i + 1], acc[i + 2], acc[i + 3]}
                            : *reinterpret_cast<const V4*>(mine + 4 * kMmaThreads * (q * (ch / 4) + v));
        s.x += p.x, s.y += p.y, s.z += p.z, s.w += p.w;
      }
      acc[i] = s.x, acc[i + 1] = s.y, acc[i + 2] = s.z, acc[i + 3] = s.w;
    }
  }
}
#endif

// The driver's cuTensorMapEncodeTiled, found once through the runtime (no link to libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p) : nullptr;
  }();
  return fn;
}

// A launch of `grid` CTAs of `threads`, in clusters of `splits` along x where splits > 1 (`attr`
// is the cluster attribute the configuration points to: the caller keeps it alive).
inline cudaLaunchConfig_t cluster_launch_config(unsigned grid, int splits, int smem_bytes, cudaStream_t stream,
                                                cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = splits;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = splits > 1 ? 1 : 0;
  return cfg;
}

}  // namespace wg
}  // namespace ternary
