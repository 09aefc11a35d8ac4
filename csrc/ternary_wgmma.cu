// Large-M ternary GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only):
// y[M, N] = x[M, K] @ W^T (+ bias).
//
// Machete's idea with 2-bit codes: a CTA decodes its W tile ONCE per k-step into a bf16/fp16 tile
// in shared memory, which both consumer warpgroups' wgmma instructions read as their B operand;
// the activations are the A operand. The decode cost scales with the W tile (128 x 64 weights a
// k-step for BM tokens), not with warps x tokens as in the mma.sync kernels, which decode each W
// fragment in every warp that uses it (ternary_tiled.cu); and wgmma is the instruction cuBLAS
// reaches Hopper's rate with. No bf16 copy of W exists outside a k-step's shared-memory tile.
//
//   CTA tile: 128 tokens x 128 W rows. Four roles, 13 warps:
//     producer (warp 12, one thread): TMA copies of each k-step's activation tile (128 x 64,
//       swizzled as wgmma reads it) and code tile (128 rows x 16 B) into stage k % STAGES,
//       counted on full[s]; waits empty[s] before refilling a stage;
//     decoders (warps 8-11): codes x block scale -> W tile [128 x 64] bf16 in W buffer k % 3,
//       fence.proxy.async, arrive on wready[b]; wait wfree[b] before overwriting a buffer;
//     MMA (warpgroups 0, 1: tokens 0-63, 64-127): wait full[s] and wready[b], 4 wgmma m64 x n128
//       x k16 (A = activations, B = the W tile, both from shared memory), commit, wait for
//       k-step k - 1's wgmma, then release its stage (empty) and W buffer (wfree).
//
//                    K (64 a k-step) ->
//   x tile  [128 tok x 64] bf16 --(TMA)--------------------------------- A --+
//   codes   [128 rows x 16 B]   --(TMA)--> decoders: x scale --> W tile -- B --+-> wgmma, fp32 accumulators
//
// Why the decoders are warps of their own: with the decode in the MMA warps (v1-v3), decode, copy
// and MMA time added up (gate_up M 4096: 110 us; 47 us with neither decode nor wgmma), and the
// decode's fence.proxy.async (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS) was the suspect: it
// orders everything its thread has in flight. Here no fencing thread has a wgmma in flight. It did
// not help: every version takes ~0.75 us a k-step against ~0.28 us of tensor-core work, a latency
// chain whose cause is not found yet (docs/kernel_notes.md, v8), so the op does not dispatch this
// kernel by default (TERNARY_WGMMA_MIN_M).
//
// Both tiles use the 128-byte swizzle of wgmma's K-major layout: a row is 64 elements (128 B),
// 16-byte chunk c of row r sits at chunk c ^ (r & 7), atoms of 8 rows x 128 B, 1024-byte aligned
// (the TMA writes the activations so; the decoders' 16-byte stores follow it and hit 8 different
// bank groups per 8 threads).
//
// Requires (checked by the host): an sm_90 device; K % 8 == 0, x and packed 16-byte aligned and
// rows padded to 16 bytes (ternary_plugin.ops.pad_packed_rows): the TMA's row strides and
// addresses; block_size and k_offset multiples of 64 (a k-step inside one scale block); at most
// kWgmmaMaxScaleCols scale blocks a row.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"
#include "ternary_wgmma.h"

namespace ternary {
namespace {

constexpr int kMmaThreads = 256;                     // warpgroups 0, 1
constexpr int kDecoders = 128;                       // warpgroup 2
constexpr int kThreads = kMmaThreads + kDecoders + 32;  // + the producer warp
constexpr int kBK = 64;                              // weights of K a k-step: one 128-byte swizzle row of bf16
constexpr int kRow = kBK * 2;                        // bytes of a tile row
constexpr int kBM = 128, kBN = 128;                  // tokens, W rows a CTA
constexpr int kWBufs = 3;                            // decoded W tiles

template <int STAGES>
struct WgShape {
  static constexpr int kXBytes = kBM * kRow, kWBytes = kBN * kRow, kCBytes = kBN * (kBK / 4);
  // [activation stages | W tiles | code stages | the rows' scales | mbarriers]; the first two
  // 1024-byte aligned from the base. mbarriers: full[STAGES], empty[STAGES], wready[3], wfree[3].
  static constexpr int kWOff = STAGES * kXBytes, kCOff = kWOff + kWBufs * kWBytes;
  static constexpr int kSOff = kCOff + STAGES * kCBytes, kBarOff = kSOff + kBN * kWgmmaMaxScaleCols * 2;
  static constexpr int kPipeBytes = kBarOff + (2 * STAGES + 2 * kWBufs) * 8;
  static constexpr int kOutLd = kBN + 8;  // output staging row, padded: conflict-free pair stores
  static constexpr int kOutBytes = kBM * kOutLd * 2;
  static_assert(kOutBytes <= kWOff, "the output tile is staged over the activation stages");
  static constexpr int kSmemBytes = kPipeBytes + 1024;  // + alignment
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ int sw128(int row, int chunk) { return row * kRow + ((chunk ^ (row & 7)) << 4); }

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: start address >> 4,
// leading-dimension offset 1 (unused by this swizzle), stride 1024 B between 8-row atoms,
// swizzle mode 1 (128 B) in bits 62-63. A k16 step inside the 64-wide row is +32 bytes of start.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// d (m64 x n128, fp32, the m16n8 C-fragment layout repeated: d[4j + 2h + e] is row
// 16 * warp + lane / 4 + 8h, column 8j + 2 (lane % 4) + e) += A (m64 x k16) * B (k16 x n128)
#define TERNARY_WGMMA_N128(TY)                                                                                   \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "   \
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "     \
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "     \
      "%62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                 \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
      : "l"(da), "l"(db), "r"(1))
template <typename T>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) TERNARY_WGMMA_N128("bf16");
  else TERNARY_WGMMA_N128("f16");
}
#undef TERNARY_WGMMA_N128

__device__ __forceinline__ void wgmma_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, the decode's stores) before an async-proxy
// reader (wgmma) sees them.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins the accumulators in place around the asynchronous wgmma (as CUTLASS's
// warpgroup_fence_operand): the compiler must not move or reuse them while wgmma writes them.
__device__ __forceinline__ void fence_accumulators(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");
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
// A barrier of the MMA warpgroups only (named barrier 1; 0 is __syncthreads')
__device__ __forceinline__ void mma_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kMmaThreads) : "memory"); }
#endif

template <typename T, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
ternary_wgmma_kernel(const __grid_constant__ CUtensorMap x_map,     // x [M, K]: boxes 64 x 128, 128-byte swizzle
                     const __grid_constant__ CUtensorMap code_map,  // packed [N, ldp]: boxes 16 B x 128 rows
                     const __half* __restrict__ scale,              // [N, lds]
                     const T* __restrict__ bias,                    // [N] or nullptr
                     T* __restrict__ y,                             // [M, N]
                     int M, int N, int K, int lds, int block_size, int k_offset) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<STAGES>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_s & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full_bar = smem_s + S::kBarOff, empty_bar = full_bar + 8 * STAGES;  // + 8 s: stage s's
  const uint32_t wready_bar = empty_bar + 8 * STAGES, wfree_bar = wready_bar + 8 * kWBufs;  // + 8 b: buffer b's
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM;
  const int steps = (K + kBK - 1) / kBK;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                        // the producer's arrive, with the TMA's bytes
      mbar_init(empty_bar + 8 * s, (kMmaThreads + kDecoders) / 32);  // lane 0 of each MMA and decoder warp
    }
    for (int b = 0; b < kWBufs; ++b) {
      mbar_init(wready_bar + 8 * b, kDecoders);      // every decoder thread, after its fence
      mbar_init(wfree_bar + 8 * b, kMmaThreads / 32);  // lane 0 of each MMA warp, its wgmma done
    }
  }
  __syncthreads();  // the last CTA-wide barrier: the roles part here

  if (tid >= kMmaThreads + kDecoders) {  // the producer warp
    if (tid == kMmaThreads + kDecoders) {
      for (int kt = 0; kt < steps; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(empty_bar + 8 * s, ((kt / STAGES) & 1) ^ 1);  // round 0 passes at once
        const uint32_t bar = full_bar + 8 * s;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                     "n"(S::kXBytes + S::kCBytes) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
            "[%4];\n" ::"r"(smem_s + s * S::kXBytes), "l"(reinterpret_cast<uint64_t>(&x_map)), "r"(kt * kBK), "r"(m0),
            "r"(bar)
            : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
            "[%4];\n" ::"r"(smem_s + S::kCOff + s * S::kCBytes), "l"(reinterpret_cast<uint64_t>(&code_map)),
            "r"(kt * (kBK / 4)), "r"(n0), "r"(bar)
            : "memory");
      }
    }
    return;
  }

  if (tid >= kMmaThreads) {
    // Decoders: thread d owns W row d of the tile (16 code bytes, 64 weights a k-step). Its scale
    // blocks go to shared memory once (rows past N read row N - 1: never stored); the host checks
    // they fit kWgmmaMaxScaleCols.
    const int drow = tid - kMmaThreads;
    const int col0 = k_offset / block_size, cols = (k_offset + K - 1) / block_size - col0 + 1;
    unsigned short* srow = reinterpret_cast<unsigned short*>(smem + S::kSOff) + drow * kWgmmaMaxScaleCols;
    const unsigned short* sg = reinterpret_cast<const unsigned short*>(scale) + (size_t)min(n0 + drow, N - 1) * lds + col0;
    for (int c0 = 0; c0 < cols; c0 += 16) {  // 16 loads in flight, then their stores
      unsigned short v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = c0 + i < cols ? __ldg(sg + c0 + i) : 0;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (c0 + i < cols) srow[c0 + i] = v[i];
    }
    for (int kt = 0; kt < steps; ++kt) {
      const int s = kt % STAGES, b = kt % kWBufs;
      mbar_wait(wfree_bar + 8 * b, ((kt / kWBufs) & 1) ^ 1);  // round 0 passes at once
      mbar_wait(full_bar + 8 * s, (kt / STAGES) & 1);
      const uint4 v = *reinterpret_cast<const uint4*>(smem + S::kCOff + s * S::kCBytes + drow * (kBK / 4));
      __syncwarp();
      if (tid % 32 == 0) mbar_arrive(empty_bar + 8 * s);  // this warp is done with the stage's codes
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      const uint32_t s2 = scale_pair<T>(srow[(kt * kBK + k_offset) / block_size - col0]);
      uint8_t* ws = smem + S::kWOff + b * S::kWBytes;
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // weights 16w .. 16w + 15: chunks 2w, 2w + 1
        uint32_t p[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          decode_byte<T>(words[w], q, p[2 * q], p[2 * q + 1]);
          p[2 * q] = mul2<T>(p[2 * q], s2);
          p[2 * q + 1] = mul2<T>(p[2 * q + 1], s2);
        }
        *reinterpret_cast<uint4*>(ws + sw128(drow, 2 * w)) = make_uint4(p[0], p[1], p[2], p[3]);
        *reinterpret_cast<uint4*>(ws + sw128(drow, 2 * w + 1)) = make_uint4(p[4], p[5], p[6], p[7]);
      }
      fence_async_shared();
      mbar_arrive(wready_bar + 8 * b);
    }
    return;
  }

  // MMA warpgroups: wg takes tokens 64 wg .. 64 wg + 63 of the tile.
  const int wg = tid / 128;
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < steps; ++kt) {
    const int s = kt % STAGES, b = kt % kWBufs;
    mbar_wait(full_bar + 8 * s, (kt / STAGES) & 1);
    mbar_wait(wready_bar + 8 * b, (kt / kWBufs) & 1);
    fence_accumulators(acc);
    wgmma_arrive();
    const uint32_t xa = smem_s + s * S::kXBytes + wg * 64 * kRow;
    const uint32_t wb = smem_s + S::kWOff + b * S::kWBytes;
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16) wgmma_n128<T>(acc, sw128_desc(xa + 32 * k16), sw128_desc(wb + 32 * k16));
    wgmma_commit();
    wgmma_wait<1>();  // k-step kt - 1's wgmma is done: its stage and W buffer go back
    fence_accumulators(acc);
    if (kt > 0 && tid % 32 == 0) {
      mbar_arrive(empty_bar + 8 * ((kt - 1) % STAGES));
      mbar_arrive(wfree_bar + 8 * ((kt - 1) % kWBufs));
    }
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  mma_sync();  // every wgmma done and every stage landed: the activation stages hold the output tile

  // The output tile in shared memory as [token][W row] (bias added, rounded once) ...
  T* out = reinterpret_cast<T*>(smem);
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int trow = wg * 64 + warp * 16 + lane / 4;
  using T2 = typename MmaTraits<T>::T2;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * (lane % 4), n = n0 + col;
    const float b0 = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
    const float b1 = (bias != nullptr && n + 1 < N) ? Vec<T>::to_float(bias[n + 1]) : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T2 v{Vec<T>::from_float(acc[4 * j + 2 * h] + b0), Vec<T>::from_float(acc[4 * j + 2 * h + 1] + b1)};
      *reinterpret_cast<T2*>(out + (trow + 8 * h) * S::kOutLd + col) = v;
    }
  }
  mma_sync();
  // ... then written a token row at a time
  store_tile<T, kBM, kBN>(out, S::kOutLd, y, M, N, m0, n0, tid, kMmaThreads);
#endif  // other targets: never launched (the host checks for an sm_90 device)
}

// The driver's cuTensorMapEncodeTiled, found once through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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

template <typename T, int STAGES>
cudaError_t launch_wgmma_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                           int M, int N, int K, int ldp, int lds, int block_size, int k_offset, cudaStream_t stream) {
  using S = WgShape<STAGES>;
  auto kernel = ternary_wgmma_kernel<T, STAGES>;
  static int smem_set[kMaxDevices] = {};
  if (const cudaError_t err = opt_in_shared_memory(kernel, S::kSmemBytes, smem_set); err != cudaSuccess) return err;
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // x as a 2-D tensor (K innermost, rows K * 2 bytes apart: K % 8 == 0 keeps them 16-byte aligned)
  // read in boxes of 64 x 128; the TMA writes zeros past M and K.
  CUtensorMap x_map, code_map;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)M}, strides[1] = {(cuuint64_t)K * sizeof(T)};
  const cuuint32_t box[2] = {kBK, kBM}, unit[2] = {1, 1};
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
  const dim3 grid((N + kBN - 1) / kBN, (M + kBM - 1) / kBM);
  kernel<<<grid, kThreads, S::kSmemBytes, stream>>>(x_map, code_map, scale, static_cast<const T*>(bias),
                                                     static_cast<T*>(y), M, N, K, lds, block_size, k_offset);
  return cudaGetLastError();
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

// One tile, 128 tokens x 128 W rows: 6 stages of 18 KB, 3 W tiles of 16 KB, 16 KB of scales.
cudaError_t launch_wgmma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                         cudaStream_t stream) {
  if (!wgmma_supported()) return cudaErrorNotSupported;
  return bf16 ? launch_wgmma_t<__nv_bfloat16, 6>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset,
                                                 stream)
              : launch_wgmma_t<__half, 6>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, stream);
}

}  // namespace ternary
