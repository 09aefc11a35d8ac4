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
//   CTA tile: BM = 128 MB tokens (MB = 1, 2) x BN = 128 W rows; consumer warpgroup g (threads
//   128g..128g+127) takes tokens 64 MB g .. 64 MB (g + 1) - 1 against all 128 rows: MB wgmma of
//   m64 x n128 a k16 step, 64 MB fp32 accumulators a thread. The decode per FLOP falls with BM.
//
//                    K (64 a k-step) ->
//   x tile  [BM tok x 64] bf16  --(producer warp: cp.async)--> A (smem desc) --+
//   codes   [128 rows x 16 B], scales [128 x 4 B] --(producer)-->              |-> wgmma m64 x n128 x k16,
//      `-- consumers: decode x block scale --> W tile [128 x 64] bf16 -- B ---+    fp32 accumulators
//
// Both tiles use the 128-byte swizzle of wgmma's K-major layout: a row is 64 elements (128 B),
// 16-byte chunk c of row r sits at chunk c ^ (r & 7), atoms of 8 rows x 128 B, 1024-byte aligned.
// So the decode's 16-byte stores (two threads a W row) and the activation copies hit 8 different
// bank groups per 8 threads.
//
// Warp-specialized (as CUTLASS's sm90 cp.async + GMMA mainloops): warp 8 is the producer, the
// only thread that copies from global memory. It fills STAGES stages (activations, codes, and the
// 4-byte word of each row's scale) with cp.async and signals stage s's mbarrier full[s] when its
// copies land (cp.async.mbarrier.arrive); consumers release a stage on empty[s] once their wgmma
// has read it. Why not every thread copying its share (the first version): the decode's shared
// stores need fence.proxy.async before wgmma reads them, and a thread's fence waited for its own
// outstanding global copies, so every k-step paid a memory round trip (0.8-1.3 us a k-step
// measured, 420 TFLOP/s at M 4096; the scales were also loaded from global one k-step ahead).
//
// One k-step kt of the consumers (256 threads):
//   wait full[kt % STAGES]; decode its codes x scale into W buffer kt % 3; fence.proxy.async;
//   consumer barrier (W tile complete; and every consumer is past k-step kt - 1's barrier, so
//   past its wait for wgmma kt - 2 ... buffer (kt + 1) % 3 = (kt - 2) % 3 is free next step);
//   issue 4 k16 steps x MB wgmma, commit; wait until k-step kt - 1's wgmma is done; release
//   stage (kt - 1) % STAGES. The tensor cores run k-step kt - 1 while the consumers decode kt.
//
// Requires (checked by the host): an sm_90 device, K % 8 == 0 and x 16-byte aligned (16-byte
// cp.async of activations), rows padded to 8 bytes (ternary_plugin.ops.pad_packed_rows), scale
// 4-byte aligned, block_size and k_offset multiples of 64 (a k-step inside one scale block).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"

namespace ternary {
namespace {

constexpr int kConsumers = 256;              // two warpgroups: decode + wgmma
constexpr int kThreads = kConsumers + 32;      // + the producer warp
constexpr int kBK = 64;                        // weights of K a k-step: one 128-byte swizzle row of bf16
constexpr int kRow = kBK * 2;                  // bytes of a tile row
constexpr int kBN = 128;                       // W rows a CTA (two consumer threads a row)
constexpr int kWBufs = 3;                      // decoded W tiles in flight (see the k-step above)

template <int MB, int STAGES>
struct WgShape {
  static constexpr int kBM = 128 * MB;  // tokens a CTA
  static constexpr int kXBytes = kBM * kRow, kWBytes = kBN * kRow, kCBytes = kBN * (kBK / 4), kSBytes = kBN * 4;
  // [activation stages | W tiles | code stages | scale stages | mbarriers full[], empty[]]; the
  // first two 1024-byte aligned from the base
  static constexpr int kWOff = STAGES * kXBytes, kCOff = kWOff + kWBufs * kWBytes;
  static constexpr int kSOff = kCOff + STAGES * kCBytes, kBarOff = kSOff + STAGES * kSBytes;
  static constexpr int kPipeBytes = kBarOff + 2 * STAGES * 8;
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
template <int MB>
__device__ __forceinline__ void fence_accumulators(float (&acc)[MB][64]) {
#pragma unroll
  for (int a = 0; a < MB; ++a)
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[a][i])::"memory");
}

// mbarriers (shared::cta): init, a plain arrive, an arrive when this thread's cp.async land, and
// the wait for the phase of a given parity
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_on_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// A barrier of the 256 consumer threads only (named barrier 1; 0 is __syncthreads')
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }
#endif

template <typename T, int MB, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
ternary_wgmma_kernel(const T* __restrict__ x,            // [M, K], K % 8 == 0, 16-byte aligned
                     const uint8_t* __restrict__ packed,  // [N, ldp], ldp % 8 == 0
                     const __half* __restrict__ scale,    // [N, lds], 4-byte aligned
                     const T* __restrict__ bias,          // [N] or nullptr
                     T* __restrict__ y,                   // [M, N]
                     int M, int N, int K, int ldp, int lds, int block_size, int k_offset) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<MB, STAGES>;
  constexpr int kBM = S::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_s & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full_bar = smem_s + S::kBarOff, empty_bar = full_bar + 8 * STAGES;  // + 8 s: stage s's
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM;
  const int steps = (K + kBK - 1) / kBK;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 32);             // the producer warp's 32 lanes, when their copies land
      mbar_init(empty_bar + 8 * s, kConsumers / 32);  // lane 0 of each consumer warp
    }
  }
  __syncthreads();  // the last CTA-wide barrier: the producer warp leaves after its loop

  if (tid >= kConsumers) {
    // The producer warp. Lane l copies, per k-step: chunk l % 8 of activation rows l / 8 + 4 i,
    // code half l % 2 of rows l / 2 + 16 i, the scale word of rows l + 32 i. Past M, K, N or ldp the
    // copy zero-fills (its source is then any valid address). A scale is copied as the aligned
    // 4-byte word that holds it: 2 bytes where it is the word's first half (never past the tensor).
    const int l = tid - kConsumers;
    const int xr = l / 8, xc = l % 8;  // activation rows xr + 4 i, chunk xc
    const T* xg = x + (size_t)min(m0 + xr, M - 1) * K + 8 * xc;
    const int cr = l / 2, ch = l % 2;  // code rows cr + 16 i, half ch
    const uint8_t* cg = packed + (size_t)min(n0 + cr, N - 1) * ldp + 8 * ch;
    for (int kt = 0; kt < steps; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(empty_bar + 8 * s, ((kt / STAGES) & 1) ^ 1);  // round 0 passes at once
      uint8_t* xs = smem + s * S::kXBytes;
      const int rows_left = kt * kBK + 8 * xc < K ? M - m0 - xr : 0;  // rows xr + 4 i < rows_left are copied
      const T* src = xg + kt * kBK;
#pragma unroll 8
      for (int i = 0; i < kBM / 4; ++i, src += 4 * (size_t)K) {
        const bool ok = 4 * i < rows_left;
        cp_async16(xs + sw128(xr + 4 * i, xc), ok ? src : x, ok);
      }
      uint8_t* cs = smem + S::kCOff + s * S::kCBytes;
      const bool byte_ok = kt * (kBK / 4) + 8 * ch < ldp;
#pragma unroll
      for (int i = 0; i < kBN / 16; ++i) {
        const bool ok = byte_ok && n0 + cr + 16 * i < N;
        cp_async8(cs + (cr + 16 * i) * (kBK / 4) + 8 * ch, ok ? cg + (size_t)16 * i * ldp + kt * (kBK / 4) : packed,
                  ok);
      }
      uint8_t* ss = smem + S::kSOff + s * S::kSBytes;
      const int col = (kt * kBK + k_offset) / block_size;
#pragma unroll
      for (int i = 0; i < kBN / 32; ++i) {
        const int row = l + 32 * i;
        const size_t idx = (size_t)min(n0 + row, N - 1) * lds + col;
        const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(ss + 4 * row));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(scale + (idx & ~(size_t)1)),
                     "r"(idx & 1 ? 4 : 2));
      }
      mbar_arrive_on_copies(full_bar + 8 * s);
    }
    cp_async_wait<0>();
    return;
  }

  // Consumers. Decode: W row drow of the tile, code half dpart (8 bytes: 32 weights) a thread.
  const int wg = tid / 128;
  const int drow = tid / 2, dpart = tid % 2;
  // the scale's half of its copied word: the parity of its index (row start + column)
  const bool scale_hi = ((size_t)min(n0 + drow, N - 1) * lds) & 1;
  auto decode = [&](int stage, int buf, int kt) {
    const uint2 codes = *reinterpret_cast<const uint2*>(smem + S::kCOff + stage * S::kCBytes + drow * (kBK / 4) +
                                                        dpart * 8);
    const int col = (kt * kBK + k_offset) / block_size;
    const uint32_t word = *reinterpret_cast<const uint32_t*>(smem + S::kSOff + stage * S::kSBytes + 4 * drow);
    const bool hi = scale_hi ^ (col & 1);
    const uint32_t s2 = scale_pair<T>(static_cast<unsigned short>(hi ? word >> 16 : word));
    uint8_t* ws = smem + S::kWOff + buf * S::kWBytes;
    const uint32_t words[2] = {codes.x, codes.y};
#pragma unroll
    for (int w = 0; w < 2; ++w) {  // weights 16w .. 16w + 15 of the thread's half: chunks 4 dpart + 2w, + 1
      uint32_t p[8];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        decode_byte<T>(words[w], b, p[2 * b], p[2 * b + 1]);
        p[2 * b] = mul2<T>(p[2 * b], s2);
        p[2 * b + 1] = mul2<T>(p[2 * b + 1], s2);
      }
      const int c = 4 * dpart + 2 * w;
      *reinterpret_cast<uint4*>(ws + sw128(drow, c)) = make_uint4(p[0], p[1], p[2], p[3]);
      *reinterpret_cast<uint4*>(ws + sw128(drow, c + 1)) = make_uint4(p[4], p[5], p[6], p[7]);
    }
  };

  float acc[MB][64];
#pragma unroll
  for (int a = 0; a < MB; ++a)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[a][i] = 0.f;

  for (int kt = 0; kt < steps; ++kt) {
    const int s = kt % STAGES, buf = kt % kWBufs;
    mbar_wait(full_bar + 8 * s, (kt / STAGES) & 1);
    decode(s, buf, kt);
    fence_async_shared();
    consumers_sync();  // the W tile of k-step kt is complete and visible to wgmma

    fence_accumulators(acc);
    wgmma_arrive();
    const uint32_t xa = smem_s + s * S::kXBytes + wg * 64 * MB * kRow;
    const uint32_t wb = smem_s + S::kWOff + buf * S::kWBytes;
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16)
#pragma unroll
      for (int a = 0; a < MB; ++a)
        wgmma_n128<T>(acc[a], sw128_desc(xa + a * 64 * kRow + 32 * k16), sw128_desc(wb + 32 * k16));
    wgmma_commit();
    wgmma_wait<1>();  // k-step kt - 1's wgmma is done: its stage goes back to the producer
    fence_accumulators(acc);
    if (kt > 0 && tid % 32 == 0) mbar_arrive(empty_bar + 8 * ((kt - 1) % STAGES));
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  consumers_sync();  // every wgmma done: the activation stages are free for the output tile

  // The output tile in shared memory as [token][W row] (bias added, rounded once) ...
  T* out = reinterpret_cast<T*>(smem);
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int trow = wg * 64 * MB + warp * 16 + lane / 4;
  using T2 = typename MmaTraits<T>::T2;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * (lane % 4), n = n0 + col;
    const float b0 = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
    const float b1 = (bias != nullptr && n + 1 < N) ? Vec<T>::to_float(bias[n + 1]) : 0.f;
#pragma unroll
    for (int a = 0; a < MB; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const T2 v{Vec<T>::from_float(acc[a][4 * j + 2 * h] + b0), Vec<T>::from_float(acc[a][4 * j + 2 * h + 1] + b1)};
        *reinterpret_cast<T2*>(out + (trow + 64 * a + 8 * h) * S::kOutLd + col) = v;
      }
  }
  consumers_sync();
  // ... then written a token row at a time, 16 bytes per store where N allows
  const bool vec = N % 8 == 0;
  for (int i = tid; i < kBM * (kBN / 8); i += kConsumers) {
    const int tok = i / (kBN / 8), c = i % (kBN / 8), m = m0 + tok, n = n0 + 8 * c;
    if (m >= M || n >= N) continue;
    const T* src = out + tok * S::kOutLd + 8 * c;
    T* dst = y + (size_t)m * N + n;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && n + e < N; ++e) dst[e] = src[e];
    }
  }
#endif  // other targets: never launched (the host checks for an sm_90 device)
}

template <typename T, int MB, int STAGES>
cudaError_t launch_wgmma_shape(const T* x, const uint8_t* packed, const __half* scale, const T* bias, T* y, int M,
                               int N, int K, int ldp, int lds, int block_size, int k_offset, cudaStream_t stream) {
  using S = WgShape<MB, STAGES>;
  auto kernel = ternary_wgmma_kernel<T, MB, STAGES>;
  static int smem_set[kMaxDevices] = {};  // > 48 KB of dynamic shared memory: per function and device
  cudaError_t err = cudaSuccess;
  if (per_device(smem_set, [&](int) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
        return err == cudaSuccess ? 1 : 0;
      }) != 1)
    return err != cudaSuccess ? err : cudaErrorInvalidDevice;
  const dim3 grid((N + kBN - 1) / kBN, (M + S::kBM - 1) / S::kBM);
  kernel<<<grid, kThreads, S::kSmemBytes, stream>>>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size,
                                                     k_offset);
  return cudaGetLastError();
}

// tokens a CTA (x 128 W rows): 128 or 256; 0 = auto: 256 (half the decodes per FLOP) where that
// still gives every SM a CTA.
template <typename T>
cudaError_t launch_wgmma_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                           int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tokens,
                           cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  if (tokens == 0) tokens = (long)((M + 255) / 256) * ((N + kBN - 1) / kBN) >= sm_count() ? 256 : 128;
  if (tokens == 256)  // 4 stages of 34.5 KB + 3 W tiles of 16 KB
    return launch_wgmma_shape<T, 2, 4>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset, stream);
  if (tokens == 128)  // 6 stages of 18.5 KB + 3 W tiles of 16 KB
    return launch_wgmma_shape<T, 1, 6>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset, stream);
  return cudaErrorInvalidValue;
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

// tokens: per CTA (x 128 W rows), 128 or 256; 0 = auto (above).
cudaError_t launch_wgmma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tokens,
                         cudaStream_t stream) {
  if (!wgmma_supported()) return cudaErrorNotSupported;
  return bf16 ? launch_wgmma_t<__nv_bfloat16>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset,
                                              tokens, stream)
              : launch_wgmma_t<__half>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, tokens,
                                       stream);
}

}  // namespace ternary
