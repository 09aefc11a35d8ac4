// Large-M ternary GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a only):
// y[M, N] = x[M, K] @ W^T (+ bias).
//
// Machete's idea with 2-bit codes: a CTA decodes its W tile ONCE per k-step into a bf16/fp16 tile
// in shared memory, which both warpgroups' wgmma instructions read as their B operand; the
// activations are the A operand, copied global -> shared with cp.async. The decode cost scales
// with the W tile (BN x 64 weights a k-step for 128 tokens), not with warps x tokens as in the
// mma.sync kernels, which decode each W fragment in every warp that uses it (ternary_tiled.cu);
// and wgmma is the instruction cuBLAS reaches Hopper's rate with. No bf16 copy of W exists
// outside the current k-step's shared-memory tile.
//
//   CTA tile: BM = 128 MB tokens x BN = 128 NB W rows (MB x NB <= 2: 128 x 128, 128 x 256 or
//   256 x 128); warpgroup g (threads 128g..128g+127) takes tokens 64 MB g .. 64 MB (g + 1) - 1
//   against all BN rows: MB x NB wgmma of m64 x n128 a k16 step, 64 MB NB fp32 accumulators a
//   thread. The decode per FLOP falls with BM (the W tile is decoded once for BM tokens).
//
//                    K (64 a k-step) ->
//   x tile  [BM tok x 64] bf16  (cp.async, STAGES deep) ------ A (smem desc) --+
//   codes   [BN rows x 16 B]    (cp.async, STAGES deep)                        |-> wgmma m64 x nBN x k16,
//      `-- decode * block scale --> W tile [BN x 64] bf16 (2 buffers) -- B ---+    fp32 accumulators
//
// Both tiles use the 128-byte swizzle of wgmma's K-major layout: a row is 64 elements (128 B),
// 16-byte chunk c of row r sits at chunk c ^ (r & 7), atoms of 8 rows x 128 B, 1024-byte aligned.
// So the decode's 16-byte stores (one W row a thread, chunk c) and the activation copies hit 8
// different bank groups per 8 threads.
//
// One k-step kt (256 threads, no warp specialization):
//   wait for stage kt's copies; barrier (A); start copying k-step kt + STAGES - 2 into the stage
//   k-step kt - 2 used (every warpgroup waited for that k-step's wgmma before (A));
//   decode stage kt's codes x scale into W buffer kt % 2 (also last read by k-step kt - 2);
//   fence.proxy.async (the generic-proxy writes become visible to wgmma); barrier (B);
//   issue 4 k16 steps x NB wgmma, commit, and wait until k-step kt - 1's wgmma is done.
// The tensor cores run k-step kt - 1 while the threads decode k-step kt.
//
// Requires (checked by the host): an sm_90 device, K % 8 == 0 and x 16-byte aligned (16-byte
// cp.async of activations), rows padded to 8 bytes (ternary_plugin.ops.pad_packed_rows),
// block_size and k_offset multiples of 64 (a k-step inside one scale block).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ternary_common.cuh"
#include "ternary_mma.cuh"

namespace ternary {
namespace {

constexpr int kWgThreads = 256;  // two warpgroups
constexpr int kBK = 64;          // weights of K a k-step: one 128-byte swizzle row of bf16
constexpr int kRow = kBK * 2;    // bytes of a tile row

template <int MB, int NB, int STAGES>
struct WgShape {
  static_assert(STAGES >= 3, "copies run STAGES - 2 k-steps ahead");
  static_assert(MB * NB <= 2, "at most 128 fp32 accumulators a thread");
  static constexpr int kBM = 128 * MB, BN = 128 * NB;  // tokens, W rows a CTA
  static constexpr int kXBytes = kBM * kRow, kWBytes = BN * kRow, kCBytes = BN * (kBK / 4);
  // [activation stages | 2 W tiles | code stages], each 1024-byte aligned from the base
  static constexpr int kWOff = STAGES * kXBytes, kCOff = kWOff + 2 * kWBytes;
  static constexpr int kPipeBytes = kCOff + STAGES * kCBytes;
  static constexpr int kOutLd = BN + 8;  // output staging row, padded: conflict-free pair stores
  static constexpr int kOutBytes = kBM * kOutLd * 2;
  static constexpr int kSmemBytes = (kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes) + 1024;  // + alignment
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
template <int MB, int NB>
__device__ __forceinline__ void fence_accumulators(float (&acc)[MB][NB][64]) {
#pragma unroll
  for (int a = 0; a < MB; ++a)
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[a][b][i])::"memory");
}
#endif

template <typename T, int MB, int NB, int STAGES>
__global__ void __launch_bounds__(kWgThreads, 1)
ternary_wgmma_kernel(const T* __restrict__ x,            // [M, K], K % 8 == 0, 16-byte aligned
                     const uint8_t* __restrict__ packed,  // [N, ldp], ldp % 8 == 0
                     const __half* __restrict__ scale,    // [N, lds]
                     const T* __restrict__ bias,          // [N] or nullptr
                     T* __restrict__ y,                   // [M, N]
                     int M, int N, int K, int ldp, int lds, int block_size, int k_offset) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<MB, NB, STAGES>;
  constexpr int kBM = S::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_s & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, wg = tid / 128;
  const int n0 = blockIdx.x * S::BN, m0 = blockIdx.y * kBM;
  const int steps = (K + kBK - 1) / kBK;

  // Copies of one k-step. Activations: BM rows x 8 chunks of 16 B, a thread takes chunk tid % 8
  // of rows tid / 8 + 32 it; codes: BN rows x 2 halves of 8 B, half tid % 2 of rows tid / 2 +
  // 128 it. Past M, K, N or ldp the copy zero-fills (the source is then any valid address).
  const int xc = tid % 8, xr = tid / 8;
  const T* xg = x + (size_t)min(m0 + xr, M - 1) * K + 8 * xc;
  const int cr = tid / 2, ch = tid % 2;
  const uint8_t* cg = packed + (size_t)min(n0 + cr, N - 1) * ldp + 8 * ch;
  auto load_stage = [&](int stage, int kt) {
    uint8_t* xs = smem + stage * S::kXBytes;
    const bool k_ok = kt * kBK + 8 * xc < K;
#pragma unroll
    for (int it = 0; it < kBM / 32; ++it) {
      const int row = xr + 32 * it;
      const bool ok = k_ok && m0 + row < M;
      cp_async16(xs + sw128(row, xc), ok ? xg + (size_t)32 * it * K + kt * kBK : x, ok);
    }
    uint8_t* cs = smem + S::kCOff + stage * S::kCBytes;
    const bool byte_ok = kt * (kBK / 4) + 8 * ch < ldp;
#pragma unroll
    for (int it = 0; it < NB; ++it) {
      const int row = cr + 128 * it;
      const bool ok = byte_ok && n0 + row < N;
      cp_async8(cs + row * (kBK / 4) + 8 * ch, ok ? cg + (size_t)128 * it * ldp + kt * (kBK / 4) : packed, ok);
    }
  };

  // The decode: W row drow of the tile, 16 / (2 / NB) code bytes of it a thread (NB = 2: the
  // whole row's 16; NB = 1: half dpart, 8 bytes); its scale block's bits are loaded a k-step
  // ahead (rows past N read row N - 1: never stored).
  constexpr int kWords = 2 * NB;  // 32-bit code words (16 weights each) a thread decodes a k-step
  const int drow = NB == 2 ? tid : tid / 2, dpart = NB == 2 ? 0 : tid % 2;
  const unsigned short* srow = reinterpret_cast<const unsigned short*>(scale) + (size_t)min(n0 + drow, N - 1) * lds;
  auto scale_bits = [&](int kt) { return __ldg(srow + (min(kt, steps - 1) * kBK + k_offset) / block_size); };
  auto decode = [&](int stage, int buf, unsigned short sbits) {
    const uint8_t* cs = smem + S::kCOff + stage * S::kCBytes + drow * (kBK / 4) + dpart * 8;
    uint32_t words[kWords];
    if constexpr (NB == 2) {
      const uint4 v = *reinterpret_cast<const uint4*>(cs);
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(cs);
      words[0] = v.x, words[1] = v.y;
    }
    const uint32_t s2 = scale_pair<T>(sbits);
    uint8_t* ws = smem + S::kWOff + buf * S::kWBytes;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {  // weights 16w .. 16w + 15 of the thread's part: chunks 2w, 2w + 1
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

  float acc[MB][NB][64];
#pragma unroll
  for (int a = 0; a < MB; ++a)
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[a][b][i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < steps) load_stage(s, s);
    cp_async_commit();
  }
  unsigned short s_cur = scale_bits(0);
  for (int kt = 0; kt < steps; ++kt) {
    cp_async_wait<STAGES - 3>();  // k-step kt has landed (this thread's copies) ...
    __syncthreads();              // (A) ... everyone's; k-step kt - 2's wgmma done in both warpgroups
    if (kt + STAGES - 2 < steps) load_stage((kt + STAGES - 2) % STAGES, kt + STAGES - 2);
    cp_async_commit();
    const unsigned short s_nxt = scale_bits(kt + 1);
    decode(kt % STAGES, kt % 2, s_cur);
    fence_async_shared();
    __syncthreads();  // (B) the W tile and the activations of k-step kt, visible to wgmma

    fence_accumulators(acc);
    wgmma_arrive();
    const uint32_t xa = smem_s + (kt % STAGES) * S::kXBytes + wg * 64 * MB * kRow;
    const uint32_t wb = smem_s + S::kWOff + (kt % 2) * S::kWBytes;
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16)
#pragma unroll
      for (int a = 0; a < MB; ++a)
#pragma unroll
        for (int b = 0; b < NB; ++b)
          wgmma_n128<T>(acc[a][b], sw128_desc(xa + a * 64 * kRow + 32 * k16),
                        sw128_desc(wb + b * 128 * kRow + 32 * k16));
    wgmma_commit();
    wgmma_wait<1>();  // k-step kt - 1's wgmma is done: its buffers are free after the next (A)
    fence_accumulators(acc);
    s_cur = s_nxt;
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup's wgmma done: the pipeline's shared memory is free

  // The output tile in shared memory as [token][W row] (bias added, rounded once) ...
  T* out = reinterpret_cast<T*>(smem);
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int trow = wg * 64 * MB + warp * 16 + lane / 4;
  using T2 = typename MmaTraits<T>::T2;
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = b * 128 + 8 * j + 2 * (lane % 4), n = n0 + col;
      const float b0 = (bias != nullptr && n < N) ? Vec<T>::to_float(bias[n]) : 0.f;
      const float b1 = (bias != nullptr && n + 1 < N) ? Vec<T>::to_float(bias[n + 1]) : 0.f;
#pragma unroll
      for (int a = 0; a < MB; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const T2 v{Vec<T>::from_float(acc[a][b][4 * j + 2 * h] + b0),
                     Vec<T>::from_float(acc[a][b][4 * j + 2 * h + 1] + b1)};
          *reinterpret_cast<T2*>(out + (trow + 64 * a + 8 * h) * S::kOutLd + col) = v;
        }
    }
  __syncthreads();
  // ... then written a token row at a time, 16 bytes per store where N allows
  const bool vec = N % 8 == 0;
  for (int i = tid; i < kBM * (S::BN / 8); i += kWgThreads) {
    const int tok = i / (S::BN / 8), c = i % (S::BN / 8), m = m0 + tok, n = n0 + 8 * c;
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

template <typename T, int MB, int NB, int STAGES>
cudaError_t launch_wgmma_shape(const T* x, const uint8_t* packed, const __half* scale, const T* bias, T* y, int M,
                               int N, int K, int ldp, int lds, int block_size, int k_offset, cudaStream_t stream) {
  using S = WgShape<MB, NB, STAGES>;
  auto kernel = ternary_wgmma_kernel<T, MB, NB, STAGES>;
  static int smem_set[kMaxDevices] = {};  // > 48 KB of dynamic shared memory: per function and device
  cudaError_t err = cudaSuccess;
  if (per_device(smem_set, [&](int) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
        return err == cudaSuccess ? 1 : 0;
      }) != 1)
    return err != cudaSuccess ? err : cudaErrorInvalidDevice;
  const dim3 grid((N + S::BN - 1) / S::BN, (M + S::kBM - 1) / S::kBM);
  kernel<<<grid, kWgThreads, S::kSmemBytes, stream>>>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size,
                                                       k_offset);
  return cudaGetLastError();
}

// tokens x W rows a CTA: 128 x 128, 128 x 256 or 256 x 128; 0 x 0 = auto: the largest tile
// (fewest decodes per FLOP: 256 x 128, then 128 x 256) that still gives every SM a CTA.
template <typename T>
cudaError_t launch_wgmma_t(const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                           int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tokens, int rows,
                           cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  if (tokens == 0 && rows == 0) {
    auto tiles = [&](int bm, int bn) { return (long)((M + bm - 1) / bm) * ((N + bn - 1) / bn); };
    const long sms = sm_count();
    tokens = tiles(256, 128) >= sms ? 256 : 128;
    rows = tokens == 128 && tiles(128, 256) >= sms ? 256 : 128;
  }
  if (tokens == 256 && rows == 128)  // 4 stages: 128 KB activations + 32 KB W tiles + 8 KB codes
    return launch_wgmma_shape<T, 2, 1, 4>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset, stream);
  if (tokens == 128 && rows == 256)  // 5 stages: 80 + 64 + 20 KB
    return launch_wgmma_shape<T, 1, 2, 5>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset, stream);
  if (tokens == 128 && rows == 128)  // 6 stages: 96 + 32 + 12 KB
    return launch_wgmma_shape<T, 1, 1, 6>(xt, packed, scale, bt, yt, M, N, K, ldp, lds, block_size, k_offset, stream);
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

// tokens x rows: the CTA tile (above); 0 x 0 = auto.
cudaError_t launch_wgmma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tokens,
                         int rows, cudaStream_t stream) {
  if (!wgmma_supported()) return cudaErrorNotSupported;
  return bf16 ? launch_wgmma_t<__nv_bfloat16>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset,
                                              tokens, rows, stream)
              : launch_wgmma_t<__half>(x, packed, scale, bias, y, M, N, K, ldp, lds, block_size, k_offset, tokens,
                                       rows, stream);
}

}  // namespace ternary
