// The wgmma kernel's host interface (csrc/ternary_wgmma.cu), shared with the op's checks
// (csrc/ternary_ops.cpp) so that the two agree on its limits.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ternary {

// Scale blocks of a row the kernel holds in shared memory (K <= 8192 at 128-weight blocks).
constexpr int kWgmmaMaxScaleCols = 64;
// Weights of K a k-step (one 128-byte swizzle row of bf16); a split gives each CTA whole k-steps.
constexpr int kWgmmaStepK = 64;

// Whether the current device runs the kernel's sm_90a code (compute capability 9.0 exactly).
bool wgmma_supported();

// A launch's tile (tokens x 128 W rows) and CTAs a tile along K (a cluster; 1 = persistent CTAs).
struct WgmmaTiling {
  int tokens, splits;
};

// The tiling for an M x N x K product: tokens_per_cta 128 or 256, k_split 1, 2, 4 or 8 as given,
// 0 = chosen (the rule and its measurements beside the definition). {0, 0} where a given
// k_split exceeds the k-steps (64 weights each) of K.
WgmmaTiling choose_wgmma_tiling(int M, int N, int K, int tokens_per_cta, int k_split);

// Tiles of tokens_per_cta (128 or 256; 0 = auto) tokens x 128 W rows, k_split CTAs a tile along
// K (0 = auto); requirements in ternary_wgmma.cu's header.
cudaError_t launch_wgmma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                         int tokens_per_cta, int k_split, cudaStream_t stream);

}  // namespace ternary
