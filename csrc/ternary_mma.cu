// Small-M ternary GEMM on the tensor cores: y[M, N] = x[M, K] @ W^T (+ bias), M up to ~64.
//
// Memory-bound regime: the packed codes are streamed once per tile of 8*NT activation rows,
// decoded in registers to bf16/fp16 (exactly -1, 0, +1) and fed to mma.sync m16n8k16 with fp32
// accumulation. W's rows are the MMA's M side and the activation rows its N side ("swap AB"):
// a 16-row tile of W against 8 tokens, so M = 1..8 wastes no more than one n8 tile.
//
// Permuted K (the Marlin trick, done in registers instead of offline). An MMA sums over its 16
// k-columns in any order, so each thread may fill its A-fragment columns {2t, 2t+1, 2t+8, 2t+9}
// with ANY four physical weights as long as its B fragment (the activations) holds the same four
// positions. Thread t (t = lane % 4) takes, at step s of a 128-weight block, the four weights
// of one packed byte: physical k = 32t + 4s .. 32t + 4s + 3 of the block. So per block a thread
// reads 8 consecutive code bytes per W row (one 8-byte load) and 32 consecutive activations per
// token (64 bytes), and every step's 16 columns lie inside one 128-weight block: the block's sum
// is finished in fp32 and multiplied by the block's fp16 scale once. With 64-weight units
// (k_unit 64; the op's auto at M 9-16 with K <= 1024) the same with k = 16t + 4s, 4 steps, a
// 4-byte code load and 16 activations per token: each unit still lies inside one scale block.
//
// Decode (no table, no branch): a byte b of four codes is copied to both halves of a 32-bit word
// W = b | b << 16. For the pair (w0, w1): lo half keeps bit 0 (w0's low code bit), hi half bit 2
// (w1's low code bit); OR-ing an exponent whose unit in the last place sits at that bit gives
// 2^e + bit; the same from W >> 1 gives 2^e + high bit; one bf16x2 subtraction leaves
// low - high = value of code: 00 -> 0, 01 -> +1, 10 -> -1, 11 (reserved) -> 0.
//
// Work split: a CTA owns 16*R rows of W; its 8 warps (16 where the tiles fit in one wave of
// such CTAs: one unit a warp on more of K, half the chain after the loads; launch_mma) take
// the units round-robin (split-K inside the CTA) and add their partial sums through shared
// memory in a fixed order. Where 8 warps leave SMs idle (N / 16R tiles < SM count) and each
// warp would walk 3+ units of K in series, k_split CTAs share a tile: they form a
// thread-block cluster along grid.z (sm_90), each takes every k_split-th group of W units (a
// unit for each of its warps), and they add their partial tiles through distributed shared
// memory, each CTA finishing 1/k_split of the tile's outputs by reading all k_split partials in
// rank order. No workspace,
// no atomics, no second kernel, and the sum's order is fixed: the result is deterministic.
// Requires block_size % 128 == 0 and k_offset % 128 == 0 (true for every layer whose shard
// starts on a block; the others use the gemv or dequantize paths) and rows padded to 8 bytes
// (ternary_plugin.ops.pad_packed_rows).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"

namespace ternary {
namespace {

// Programmatic dependent launch (sm_90; launch_mma_nt sets the launch attribute where asked):
// the kernel lets the next kernel in the stream launch at its entry (that kernel's CTAs then
// take SM slots this grid no longer needs) and waits for the previous kernel (griddepcontrol.wait:
// its completion and memory flush) only after its first weight loads are in flight, before it
// reads an activation or writes an output. So the weights' memory round trip overlaps the
// previous kernel's tail. The weights must not be written by the kernel just before this one
// on the stream (true of a model's forward, where they are parameters; the op launches this way
// only when asked, pdl=True; ternary_ops.cpp has the measurements). Without the attribute both
// instructions do nothing.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Probe hook: benchmarks/probes/mma_probe.cu leaves one stage out with MMA_PROBE (bits: 1 no
// activation loads, 2 no mma, 4 no reduction across warps; results then wrong). 0 in the
// extension.
#ifndef MMA_PROBE
#define MMA_PROBE 0
#endif

// Weights of K per unit of work (U): 128 (a scale block, 8 mma steps of k16; the default) or 64
// (half a block, 4 steps: for shards starting 64 weights into a block, and at M 9-16 with short K:
// twice the units, each half the dependent chain per warp; see docs/notes/kernel_notes.md, v6).
// Thread t takes the U/4 consecutive weights [U/4 t, U/4 (t+1)) of a unit: U/16 code bytes of
// each row and U/4 activations of each token.

// U/4 activations x[k0 .. k0 + U/4) of one token as U/8 packed pairs; positions >= K read as 0.
// One test for the whole run (tests per 8, through load8 alone, cost up to 22 registers); the
// tail goes through load8's zero-filling path.
template <typename T, int U>
__device__ __forceinline__ void load_x(const T* __restrict__ x, int k0, int K, bool vec_ok, uint32_t out[U / 8]) {
  constexpr int kVecs = U / 32;  // 16-byte loads
  uint4 v[kVecs];
  if (vec_ok && k0 + U / 4 <= K) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = __ldg(reinterpret_cast<const uint4*>(x + k0) + j);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = load8(x, k0 + 8 * j, K, false);
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    out[4 * j] = v[j].x; out[4 * j + 1] = v[j].y; out[4 * j + 2] = v[j].z; out[4 * j + 3] = v[j].w;
  }
}

// One unit's weights for one thread: U/16 code bytes (8: .x and .y; 4: .x) of each of its 2R W
// rows and their fp16 scales (raw bits, converted where used).
template <int R>
struct WeightStage {
  uint2 codes[R][2];
  unsigned short sbits[R][2];
};

template <int R, int U>
__device__ __forceinline__ void load_weights(WeightStage<R>& st, const uint8_t* const (&prow)[R][2],
                                             const unsigned short* const (&srow)[R][2], int b, int t, int ldp,
                                             int block_size, int k_offset) {
  const int byte0 = b * (U / 4) + (U / 16) * t;  // this thread's code bytes of each row
  const bool codes_ok = byte0 < ldp;             // ldp % 8 == 0, byte0 % (U/16) == 0: the load fits
  // the unit's scale column (a unit lies inside a block); without a division where a block is
  // one unit (the format's 128 at U = 128: then k_offset is 0), which cost ~25 instructions before
  // the first load (o at M 1: 3.09 -> 2.95 us, benchmarks/probes/mma_probe.cu)
  const int sb = block_size == U ? b : (b * U + k_offset) / block_size;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (U == 128)
        st.codes[r][h] = codes_ok ? __ldg(reinterpret_cast<const uint2*>(prow[r][h] + byte0)) : make_uint2(0u, 0u);
      else
        st.codes[r][h] = make_uint2(codes_ok ? __ldg(reinterpret_cast<const uint32_t*>(prow[r][h] + byte0)) : 0u, 0u);
      st.sbits[r][h] = __ldg(srow[r][h] + sb);
    }
}

// kSplit: the CTAs of a cluster along grid.z share the tile's K (gridDim.z = cluster size).
// U: weights of K per unit of work (128 or 64, above). W: warps a CTA (8, or 16 where the
// tiles fit in one wave of 16-warp CTAs: launch_mma).
template <typename T, int R, int NT, bool kSplit, int U, int W>
__global__ void __launch_bounds__(W * 32)
ternary_mma_kernel(const T* __restrict__ x,            // [M, K]
                   const uint8_t* __restrict__ packed,  // [N, ldp], ldp % 8 == 0
                   const __half* __restrict__ scale,    // [N, lds]
                   const T* __restrict__ bias,          // [N] or nullptr
                   T* __restrict__ y,                   // [M, N]
                   int M, int N, int K, int ldp, int lds, int block_size, int k_offset) {
  pdl_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 16 * R;
  const int m0 = blockIdx.y * 8 * NT;
  const int nblocks = (K + U - 1) / U;  // units ("blocks" below)
  const bool vec_ok = rows_vec_ok(x, K);
  // this warp's first block and the stride between its blocks (all warps of the cluster)
  const int first = (kSplit ? blockIdx.z * W : 0) + warp;
  const int stride = kSplit ? gridDim.z * W : W;

  float acc[R][NT][4];
  zero_tiles(acc);

  // This thread's two W rows per tile (n0 + 16r + g and + 8) and its token rows. Rows past N
  // or M read row N-1 / M-1 instead: their products land only in accumulators that are never
  // stored, and no load needs a branch. (A guarded load inside a branch made ptxas convert the
  // scale inside the branch, so each of the 2R scale loads waited a full memory round trip
  // before the next load was issued; see docs/notes/kernel_notes.md.)
  const uint8_t* prow[R][2];
  const unsigned short* srow[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = min(n0 + 16 * r + g + 8 * h, N - 1);
      prow[r][h] = packed + (size_t)n * ldp;
      srow[r][h] = reinterpret_cast<const unsigned short*>(scale) + (size_t)n * lds;
    }
  const T* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xrow[j] = x + (size_t)min(m0 + 8 * j + g, M - 1) * K;

  // Every load of a block is issued before any of them is used, and a warp with more than one
  // block (K > 1024) issues the next block's weight loads (from DRAM) before it decodes the
  // current one. The activations (the same for every CTA, so from L2) are loaded per block:
  // prefetching them too cost 35-65 more registers at NT = 2 and 4.
  WeightStage<R> cur, nxt;
  if (first < nblocks) load_weights<R, U>(cur, prow, srow, first, t, ldp, block_size, k_offset);
  pdl_wait();
  for (int b = first; b < nblocks; b += stride) {
    if (b + stride < nblocks) load_weights<R, U>(nxt, prow, srow, b + stride, t, ldp, block_size, k_offset);
    uint32_t xf[NT][U / 8];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if constexpr (MMA_PROBE & 1) {
#pragma unroll
        for (int i = 0; i < U / 8; ++i) xf[j][i] = 0x3c003c00u ^ static_cast<uint32_t>(b + i);
      } else {
        load_x<T, U>(xrow[j], b * U + (U / 4) * t, K, vec_ok, xf[j]);
      }
    }
    const auto& codes = cur.codes;
    const auto& sbits = cur.sbits;

    float blk[R][NT][4];
    zero_tiles(blk);
#pragma unroll
    for (int st = 0; st < U / 16; ++st) {  // step st: code byte st of each row, activations 4st .. 4st+3
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint32_t a[4];
        const uint32_t w0 = st < 4 ? codes[r][0].x : codes[r][0].y;
        const uint32_t w8 = st < 4 ? codes[r][1].x : codes[r][1].y;
        decode_byte<T>(w0, st & 3, a[0], a[2]);  // row g: cols (2t, 2t+1), (2t+8, 2t+9)
        decode_byte<T>(w8, st & 3, a[1], a[3]);  // row g + 8
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if constexpr (MMA_PROBE & 2)
            blk[r][j][st & 3] += __uint_as_float((a[0] ^ a[1] ^ a[2] ^ a[3] ^ xf[j][2 * st]) & 0x3fffffffu);
          else
            mma<T>(blk[r][j], a, xf[j][2 * st], xf[j][2 * st + 1]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float s0 = scale_from_bits(sbits[r][0]);
        const float s1 = scale_from_bits(sbits[r][1]);
        acc[r][j][0] += s0 * blk[r][j][0];
        acc[r][j][1] += s0 * blk[r][j][1];
        acc[r][j][2] += s1 * blk[r][j][2];
        acc[r][j][3] += s1 * blk[r][j][3];
      }
    cur = nxt;
  }

  // split-K inside the CTA: warps add their partial tiles in a fixed order
  constexpr int kPerWarp = R * NT * 4 * 32;
  if constexpr ((MMA_PROBE & 4) != 0 && !kSplit) {  // each warp stores its own partial (racy)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = min(n0 + 16 * r + g, N - 1), m = min(m0 + 8 * j + 2 * t, M - 1);
        y[(size_t)m * N + n] = Vec<T>::from_float(acc[r][j][0] + acc[r][j][1] + acc[r][j][2] + acc[r][j][3]);
      }
    return;
  }
  __shared__ float red[W][kPerWarp];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][((r * NT + j) * 4 + i) * 32 + lane] = acc[r][j][i];
  __syncthreads();
  auto cta_sum = [&](int e) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) v += red[w][e];
    return v;
  };
  auto store = [&](int e, float v) {
    const int l = e % 32, i = (e / 32) % 4, j = (e / 128) % NT, r = e / (128 * NT);
    // C fragment: c0, c1 -> row g, cols 2t, 2t+1; c2, c3 -> row g + 8 (rows = W rows, cols = tokens)
    const int n = n0 + 16 * r + l / 4 + 8 * (i / 2);
    const int m = m0 + 8 * j + 2 * (l % 4) + (i % 2);
    if (n < N && m < M) {
      if (bias != nullptr) v += Vec<T>::to_float(bias[n]);
      y[(size_t)m * N + n] = Vec<T>::from_float(v);
    }
  };
  if constexpr (!kSplit) {
    for (int e = threadIdx.x; e < kPerWarp; e += W * 32) store(e, cta_sum(e));
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // split-K across the cluster: each CTA's partial tile in its shared memory, then each CTA
    // finishes its share of the outputs from every CTA's partial, in rank order
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float part[kPerWarp];
    for (int e = threadIdx.x; e < kPerWarp; e += W * 32) part[e] = cta_sum(e);
    cluster.sync();
    const int ranks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int share = (kPerWarp + ranks - 1) / ranks;
    const int e_end = min(kPerWarp, (rank + 1) * share);
    for (int e = rank * share + threadIdx.x; e < e_end; e += W * 32) {
      float v = 0.f;
      for (int q = 0; q < ranks; ++q) v += cluster.map_shared_rank(part, q)[e];
      store(e, v);
    }
    cluster.sync();  // no CTA leaves (freeing its shared memory) while another still reads it
#else
    __trap();  // never launched: the host splits only where the sm_90 binary runs (sm90_binary)
#endif
  }
}

// Whether `kernel` runs from an sm_90+ binary on this device: the cluster (split-K) kernels trap
// and griddepcontrol is left out where an sm_80 or PTX-only image was loaded. Asked once per
// device and activation type (every instantiation comes from the same fat binary).
template <typename Kernel>
bool sm90_binary(Kernel kernel) {
  static int cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  return per_device(cached, [&](int) {
           cudaFuncAttributes attr{};
           return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion >= 90 ? 1 : 2;
         }) == 1;
}

// CTAs per tile along K: auto (k_split 0) splits only where the tiles leave SMs idle and each
// warp would otherwise walk 3 or more blocks in series. Measured on the H200 (kernel-h200.md,
// "by CTAs per tile along K", M = 1 / 8 / 16): down (K 3072, N 1024, 3 blocks a warp) 5.03 ->
// 4.50, 5.23 -> 4.87, 6.33 -> 5.66 us at 3 CTAs; o (K 2048, 2 blocks a warp) 3.38 -> 3.65,
// 3.65 -> 3.87, 4.51 -> 4.38 at 2: the cluster's two barriers and remote reads cost about what
// one block in series does. A forced k_split (tests, benchmarks) is capped at 8 (the portable
// cluster size) and at the number of groups of `warps` blocks, so every CTA has a block.
int choose_k_split(int k_split, int tiles, int nblocks, int warps) {
  const int groups = (nblocks + warps - 1) / warps;
  if (k_split == 0) {
    const int sms = sm_count();
    if (sms == 0 || tiles >= sms || groups < 3) return 1;
    k_split = (sms + tiles - 1) / tiles;
  }
  return max(1, min(k_split, min(groups, 8)));
}

// One call's operands and shape, as the launchers hand them down.
template <typename T>
struct MmaCall {
  const T* x;
  const uint8_t* packed;
  const __half* scale;
  const T* bias;
  T* y;
  int M, N, K, ldp, lds, block_size, k_offset, k_split;
  bool pdl;
  cudaStream_t stream;
};

template <typename T, int R, int NT, int U, int W>
cudaError_t launch_mma_nt(const MmaCall<T>& c) {
  const dim3 grid((c.N + 16 * R - 1) / (16 * R), (c.M + 8 * NT - 1) / (8 * NT));
  int ks = choose_k_split(c.k_split, grid.x * grid.y, (c.K + U - 1) / U, W);
  if (ks > 1 && !sm90_binary(ternary_mma_kernel<T, R, NT, true, U, W>)) ks = 1;
  auto kernel = ks > 1 ? ternary_mma_kernel<T, R, NT, true, U, W> : ternary_mma_kernel<T, R, NT, false, U, W>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid.x, grid.y, ks);
  cfg.blockDim = dim3(W * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = c.stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (ks > 1) {  // the CTAs of a tile form a cluster along grid.z
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = ks;
    ++n;
  }
  if (c.pdl && sm90_binary(kernel)) {  // programmatic dependent launch (pdl_wait in the kernel)
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, c.x, c.packed, c.scale, c.bias, c.y, c.M, c.N, c.K, c.ldp, c.lds,
                            c.block_size, c.k_offset);
}

// NT, the 8-token tiles a CTA of 16 R W rows takes at this M: 1, 2, or 4 past M 16. R * NT <= 8
// keeps the split-K exchange in 32 KB of static shared memory (34 KB at 16 warps); larger M loops
// over token tiles in grid.y (re-reading the codes, from L2 at these sizes).
constexpr int token_tiles(int M, int R) { return M <= 8 ? 1 : (M <= 16 || R >= 4) ? 2 : 4; }

template <typename T, int R, int U, int W>
cudaError_t launch_mma_r(const MmaCall<T>& c) {
  const int nt = token_tiles(c.M, R);
  if (nt == 1) return launch_mma_nt<T, R, 1, U, W>(c);
  if constexpr (R < 4) {
    if (nt == 4) return launch_mma_nt<T, R, 4, U, W>(c);
  }
  return launch_mma_nt<T, R, 2, U, W>(c);
}

// Whether `tiles` CTAs of the W-warp kernel (16 W rows, NT token tiles, U-weight units, no
// split) run in one wave on this device: its occupancy, asked once per device.
template <typename T, int NT, int U, int W>
bool one_wave(int tiles) {
  static int cached[kMaxDevices] = {};
  const int per_sm = per_device(cached, [](int) {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ternary_mma_kernel<T, 1, NT, false, U, W>, W * 32,
                                                         0) == cudaSuccess ? n : 0;
  });
  return per_sm > 0 && tiles <= per_sm * sm_count();
}

// The same at the token tiles launch_mma_r gives M (16 W rows a CTA).
template <typename T, int U, int W>
bool one_wave_at(int M, int tiles) {
  switch (token_tiles(M, 1)) {
    case 1: return one_wave<T, 1, U, W>(tiles);
    case 2: return one_wave<T, 2, U, W>(tiles);
    default: return one_wave<T, 4, U, W>(tiles);
  }
}

template <typename T>
cudaError_t launch_mma_t(const MmaCall<T>& c, int rows_per_cta, int k_unit, int unit16, int warps) {
  if (warps == 0) {  // auto (see launch_mma)
    const bool may = c.M <= 16 && rows_per_cta == 16 && c.k_split <= 1 && (c.K + unit16 - 1) / unit16 <= 32;
    const int tiles = (c.N + 15) / 16;
    const bool fits = may && (unit16 == 64 ? one_wave_at<T, 64, 16>(c.M, tiles) : one_wave_at<T, 128, 16>(c.M, tiles));
    warps = fits ? 16 : 8;
    if (fits) k_unit = unit16;
  }
  if (warps == 16 || k_unit == 64) {  // 16 rows per CTA only (the tile that won; fewer instantiations)
    if (rows_per_cta != 16) return cudaErrorInvalidValue;
    if (warps == 16) return k_unit == 64 ? launch_mma_r<T, 1, 64, 16>(c) : launch_mma_r<T, 1, 128, 16>(c);
    return launch_mma_r<T, 1, 64, 8>(c);
  }
  switch (rows_per_cta) {
    case 16: return launch_mma_r<T, 1, 128, 8>(c);
    case 32: return launch_mma_r<T, 2, 128, 8>(c);
    case 64: return launch_mma_r<T, 4, 128, 8>(c);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// rows_per_cta: 16, 32 or 64; 0 (auto) = 16. Measured on the H200 (kernel-h200.md, "by W rows per
// CTA", v4): 16 rows was fastest or within 1 % in 22 of the 24 (shape, M <= 16) cases, and the
// earlier rule (32 rows once N / 32 >= the SM count) cost gate_up 11 % (4.29 vs 4.80 us at M = 1);
// qkv at M = 8, 16 is the exception (32 rows 4-8 % faster), 64 rows never won.
// k_split: CTAs per tile along K (a cluster); 0 = auto (choose_k_split), 1 = none.
// k_unit: weights of K per unit of work, 128 or 64 (needs block_size and k_offset multiples of
// 64; 16 rows per CTA); gemm_path resolves its auto (0) to 128, since it checks the multiples.
// warps: a CTA's warps, 8 or 16 (16 W rows a CTA), 0 = auto: 16 where M <= 16, the tile and the
// split along K are auto, a row has at most 32 units of `unit16` weights (the unit the 16-warp
// kernel then takes, 64 where the op allows it) and the 16-row tiles fit in one wave of 16-warp
// CTAs; else 8. Measured on the H200 (mma_probe.cu, tenth session): 16 warps (a warp per unit,
// half the chain) against 8, M = 1 / 8 / 16: o 2.93 / 3.53 / 4.44 -> 2.64 / 3.18 / 4.06 us,
// down 4.21 / 4.55 / 5.27 -> 3.89 / 4.24 / 5.28, qkv 3.08 / 3.48 / 4.11 -> 3.10 / 3.25 / 3.96,
// tp 4 shards up to -0.25 us at M 16; gate_up (384 tiles: 1.45 waves of 16-warp CTAs) 3.91 ->
// 4.90, so it keeps 8.
// pdl: launch with programmatic stream serialization where the sm_90 binary runs (the contract
// at pdl_wait: the weights are not written by the kernel just before this one).
cudaError_t launch_mma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                       int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int rows_per_cta,
                       int k_split, int k_unit, int unit16, int warps, bool pdl, cudaStream_t stream) {
  if (rows_per_cta == 0) rows_per_cta = 16;
  if (warps != 0 && warps != 8 && warps != 16) return cudaErrorInvalidValue;
  if (bf16) {
    using T = __nv_bfloat16;
    const MmaCall<T> c{static_cast<const T*>(x), packed, scale, static_cast<const T*>(bias), static_cast<T*>(y), M, N,
                       K, ldp, lds, block_size, k_offset, k_split, pdl, stream};
    return launch_mma_t(c, rows_per_cta, k_unit, unit16, warps);
  }
  using T = __half;
  const MmaCall<T> c{static_cast<const T*>(x), packed, scale, static_cast<const T*>(bias), static_cast<T*>(y), M, N, K,
                     ldp, lds, block_size, k_offset, k_split, pdl, stream};
  return launch_mma_t(c, rows_per_cta, k_unit, unit16, warps);
}

}  // namespace ternary
