// Shared by the kernels of csrc/: conversions between the activation dtype and fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ternary {

template <typename T> struct Vec;
template <> struct Vec<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Vec<__half> {
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

// x's rows can take 16-byte loads: K a multiple of 8 and x itself 16-byte aligned (a tensor
// view can start anywhere).
template <typename T>
__device__ __forceinline__ bool rows_vec_ok(const T* x, int K) {
  return K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// 8 activations (16 bytes) at x + k as 4 packed pairs, raw: converted where used, so that
// every load of a block is in flight before the first one is waited for. Positions >= k_end
// read as 0.
template <typename T>
__device__ __forceinline__ uint4 load8(const T* __restrict__ x, int k, int k_end, bool vec_ok) {
  if (vec_ok && k + 8 <= k_end) return __ldg(reinterpret_cast<const uint4*>(x + k));
  const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = k + 2 * i < k_end ? xs[k + 2 * i] : 0u;
    const uint32_t hi = k + 2 * i + 1 < k_end ? xs[k + 2 * i + 1] : 0u;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The scale blocks of the chunk [k, k + len) of a row (len <= block_size, so at most two):
// weights before `split` (relative to k) use block b0, the rest block b0 + 1. k_offset is where
// the row's first weight sits inside its first block (a shard starting inside a block).
struct BlockSplit {
  int b0, split;
};
__device__ __forceinline__ BlockSplit block_split(int k, int len, int k_offset, int block_size) {
  const int p = k + k_offset;
  const int b0 = p / block_size;
  return {b0, min(block_size - (p - b0 * block_size), len)};
}

// An fp16 scale loaded as raw bits (so the load is not waited for until the value is used).
__device__ __forceinline__ float scale_from_bits(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

// Host: a value asked of the current device once (cache[dev] == 0: not asked yet; a fetch that
// returns 0 is asked again next time). 0 where the current device cannot be named.
constexpr int kMaxDevices = 64;
template <typename Fetch>
inline int per_device(int (&cache)[kMaxDevices], Fetch fetch) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  if (cache[dev] == 0) cache[dev] = fetch(dev);
  return cache[dev];
}

// More than 48 KB of dynamic shared memory is an opt-in, per kernel function and device: asked
// once per device (the caller's static cache, one per function).
template <typename Kernel>
inline cudaError_t opt_in_shared_memory(Kernel kernel, int bytes, int (&cache)[kMaxDevices]) {
  cudaError_t err = cudaSuccess;
  if (per_device(cache, [&](int) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        return err == cudaSuccess ? 1 : 0;
      }) != 1)
    return err != cudaSuccess ? err : cudaErrorInvalidDevice;
  return cudaSuccess;
}

// The current device's SM count (0 if it cannot be asked); one cache for every kernel file.
inline int sm_count() {
  static int cached[kMaxDevices] = {};
  return per_device(cached, [](int dev) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? v : 0;
  });
}

}  // namespace ternary
