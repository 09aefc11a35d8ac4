// Shared by the kernels of csrc/: conversions between the activation dtype and fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// An fp16 scale loaded as raw bits (so the load is not waited for until the value is used).
__device__ __forceinline__ float scale_from_bits(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

}  // namespace ternary
