// The int8-activation wgmma kernel's host interface (csrc/ternary_wgmma_s8.cu), shared with the
// op's checks (csrc/ternary_ops.cpp).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ternary {

// Weights of K a k-step: one scale block of 128 (block_size and k_offset multiples of it).
constexpr int kS8StepK = 128;
// Scale blocks of a row the kernel holds in shared memory (K <= 12288 at 128-weight blocks).
constexpr int kS8MaxScaleCols = 96;
// The kernel counts 128-weight k-steps in 16 bits (its scale column is a multiply-high, not a
// division): block_size <= 2^22 (2^15 k-steps) and k_offset + K <= 2^23 - 128.
constexpr long kS8MaxBlockSize = 1l << 22;
constexpr long kS8MaxKEnd = (1l << 23) - kS8StepK;

struct S8Tiling {
  int tokens, splits, rows;  // rows: W rows a tile, 128 or 256 (folded scales only, no split)
};

// The tiling for an M x N x K product (k_split 1, 2, 4, 8 as given, 0 = chosen; rows 128 or 256
// as given, 0 = chosen); {0, 0, 0} where a given k_split exceeds K's k-steps or 256 rows are asked
// without fold or with a split.
S8Tiling choose_s8_tiling(int M, int N, int K, int k_split, bool fold, int rows);

// xq [M, ldq] int8 and sx [M] fp32 from x [M, K] bf16/fp16 (activations.quantize_activations_int8's
// numerics); permute: the GEMM's layout (columns permuted per 128-block, ldq = round_up(K, 128)).
cudaError_t launch_quantize_s8(bool bf16, const void* x, int8_t* xq, float* sx, int M, int K, int ldq, bool permute,
                               cudaStream_t stream);

// y [M, N] in x's dtype from the permuted xq [M, Kp] (Kp % 128 == 0) and sx; requirements in
// ternary_wgmma_s8.cu's header. fold: each row's block scales folded into int8 weights
// (activations.reference_linear_w2a8_folded's numerics, bit for bit), one int32 dot over K;
// else exact per-block scales (reference_linear_w2a8's, fp32 promotion a block).
cudaError_t launch_wgmma_s8(bool bf16, const int8_t* xq, const float* sx, const uint8_t* packed, const __half* scale,
                            const void* bias, void* y, int M, int N, int Kp, int ldp, int lds, int block_size,
                            int k_offset, int k_split, bool fold, int rows, cudaStream_t stream);


}  // namespace ternary
