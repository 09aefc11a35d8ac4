// Shared by the tensor-core kernels (ternary_mma.cu: small M; ternary_tiled.cu: M >= 64;
// ternary_wgmma.cu: large M on Hopper): the mma.sync wrapper, the register decode of a code byte
// into packed pairs, the scale multiply, and cp.async.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "ternary_common.cuh"

namespace ternary {

// Per dtype: the packed pair type, and exponents whose ulp is mantissa bit 0 / 2 (pair 0) and
// bit 4 / 6 (pair 1), lo | hi << 16 (the decode below).
template <typename T> struct MmaTraits;
template <> struct MmaTraits<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic0 = 0x42004300u, kMagic1 = 0x40004100u;
};
template <> struct MmaTraits<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic0 = 0x5C006400u, kMagic1 = 0x4C005400u;
};

// a - b on two packed T values
template <typename T>
__device__ __forceinline__ uint32_t sub2(uint32_t a, uint32_t b) {
  using T2 = typename MmaTraits<T>::T2;
  T2 r = __hsub2(*reinterpret_cast<T2*>(&a), *reinterpret_cast<T2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// d += A (16x16, row) * B (16x8, col) in fp32, A and B in T
#define TERNARY_MMA_16816(TY)                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%0,%1,%2,%3};\n"                                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename T>
__device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) TERNARY_MMA_16816("bf16");
  else TERNARY_MMA_16816("f16");
}
#undef TERNARY_MMA_16816

// (a & B) | C in one LOP3 (written as two C operations, ptxas emits an AND and an OR: a SASS
// LOP3 takes one immediate, so it does not merge two constants; here it keeps C in a register).
template <uint32_t B, uint32_t C>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(B), "n"(C));
  return d;
}

// Code byte `k` (0..3) of `word` in both halves of a word: b | b << 16 (the decode's input).
__device__ __forceinline__ uint32_t byte_twice(uint32_t word, int k) {
  return __byte_perm(word, 0u, 0x4040u | (uint32_t)k | ((uint32_t)k << 8));
}
// The first two weights (the low nibble) of code byte `k` of `word` as a packed pair (w0, w1).
template <typename T>
__device__ __forceinline__ uint32_t decode_nibble(uint32_t word, int k) {
  const uint32_t w = byte_twice(word, k);
  constexpr uint32_t m0 = MmaTraits<T>::kMagic0;
  return sub2<T>(and_or<0x00040001u, m0>(w), and_or<0x00040001u, m0>(w >> 1));
}
// The four weights of code byte `k` (0..3) of `word` as two packed pairs: lo = (w0, w1), hi = (w2, w3).
template <typename T>
__device__ __forceinline__ void decode_byte(uint32_t word, int k, uint32_t& lo, uint32_t& hi) {
  const uint32_t w = byte_twice(word, k);
  constexpr uint32_t m1 = MmaTraits<T>::kMagic1;
  lo = decode_nibble<T>(word, k);
  hi = sub2<T>(and_or<0x00400010u, m1>(w), and_or<0x00400010u, m1>(w >> 1));
}

// x2 (a packed pair) * s2, elementwise in T
template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  using T2 = typename MmaTraits<T>::T2;
  T2 r = __hmul2(*reinterpret_cast<T2*>(&a), *reinterpret_cast<T2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// An fp16 scale's bits as the pair (s, s) in T (exact for fp16; bf16 rounds it, as the
// dequantize kernel does).
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(unsigned short bits) {
  using T2 = typename MmaTraits<T>::T2;
  const T s = Vec<T>::from_float(scale_from_bits(bits));
  T2 p{s, s};
  return *reinterpret_cast<uint32_t*>(&p);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// An output tile staged in shared memory ([rows][ld] in T: token m0 + r, W row n0 + c) written to
// y [M, N] a token row at a time, 16 bytes per store where N allows, by threads tid, tid +
// threads, ... (the tiled and wgmma kernels' epilogue)
template <typename T, int kRows, int kCols>
__device__ __forceinline__ void store_tile(const T* out, int ld, T* __restrict__ y, int M, int N, int m0, int n0,
                                           int tid, int threads) {
  const bool vec = N % 8 == 0;
  for (int i = tid; i < kRows * (kCols / 8); i += threads) {
    const int tok = i / (kCols / 8), c = i % (kCols / 8), m = m0 + tok, n = n0 + 8 * c;
    if (m >= M || n >= N) continue;
    const T* src = out + tok * ld + 8 * c;
    T* dst = y + (size_t)m * N + n;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && n + e < N; ++e) dst[e] = src[e];
    }
  }
}

// R x NT accumulator tiles of an m16n8 C fragment (4 floats a thread), zeroed
template <int R, int NT>
__device__ __forceinline__ void zero_tiles(float (&c)[R][NT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) c[r][j][i] = 0.f;
}

}  // namespace ternary
