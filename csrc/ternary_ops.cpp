// torch.ops.ternary_serve.gemm: input checks, dispatch by M, launch on the current stream.
// Declared once in csrc/ternary_schema.cpp; the fake (meta) implementation is in ternary_plugin/ops.py.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "ternary_check.h"
#include "ternary_wgmma.h"
#include "ternary_wgmma_s8.h"

namespace ternary {
cudaError_t launch_gemv(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                        void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset,
                        cudaStream_t stream);
cudaError_t launch_dequant(bool bf16, const uint8_t* packed, const __half* scale, void* w, int N, int K, int ldp,
                           int lds, int block_size, int k_offset, cudaStream_t stream);
cudaError_t launch_mma(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias, void* y,
                       int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int rows_per_cta,
                       int k_split, int k_unit, int unit16, int warps, bool pdl, cudaStream_t stream);
cudaError_t launch_tiled(bool bf16, const void* x, const uint8_t* packed, const __half* scale, const void* bias,
                         void* y, int M, int N, int K, int ldp, int lds, int block_size, int k_offset, int tile,
                         cudaStream_t stream);
int humming_gemv_k_split(int M, int N, int K, int sms);
cudaError_t launch_humming_gemv(bool bf16, const void* x, const uint32_t* wq, const void* scale, const void* bias,
                                void* y, float* work, unsigned int* counters, int M, int N, int K, int k_split,
                                cudaStream_t stream);
}  // namespace ternary

namespace {

// Which kernel a call takes is decided in Python, by one table: ternary_plugin/dispatch.py
// (`plan`), whose choice torch.ops.ternary_serve.gemm's CUDA implementation (ternary_plugin/ops.py)
// launches through gemm_path below. Each kernel's own tile choices stay automatic in its launcher.
// pdl: the tensor-core kernel is launched with programmatic dependent launch on sm_90
// (csrc/ternary_mma.cu, pdl_wait): its first weight loads overlap the end of the kernel before
// it. Only for weights that the kernel just before the op does not write. Measured on the H200
// (bench_kernel, "Programmatic dependent launch"): back to back it gains up to 0.8 us a call
// (o and down lose up to 0.6), after a kernel launched plainly it loses ~0.2 us on every shape,
// so the plugin launches plainly; for graphs whose kernels trigger their dependents. The other
// kernels ignore it.
enum Path : int64_t { kGemv = 1, kMma = 2, kDequant = 3, kTiled = 4, kWgmma = 5 };

// Error messages as one string (csrc/ternary_check.h says why).
#define CHECK_ARG(cond, ...) TERNARY_CHECK_ARG("ternary_serve::gemm: ", cond, __VA_ARGS__)

void check_cuda_error(cudaError_t err, const char* what, int64_t m, int64_t n, int64_t k) {
  CHECK_ARG(err == cudaSuccess, what, " failed for m=", m, " n=", n, " k=", k, ": ", cudaGetErrorString(err));
}

torch::Tensor gemm_path(const torch::Tensor& x,       // [M, K] bf16/fp16
                        const torch::Tensor& packed,  // [N, ldp] uint8, ldp >= ceil(K/4)
                        const torch::Tensor& scale,   // [N, lds] fp16
                        const std::optional<torch::Tensor>& bias,  // [N] x.dtype
                        int64_t block_size, int64_t k_offset, int64_t path, int64_t rows_per_cta,
                        int64_t k_split, int64_t k_unit, int64_t tokens_per_cta, int64_t warps, bool pdl,
                        int64_t mma64_max_k) {
  CHECK_ARG(x.is_cuda() && packed.is_cuda() && scale.is_cuda(), "x, packed and scale must be CUDA tensors");
  CHECK_ARG(x.dim() == 2, "x must be 2-D [M, K], got ", x.sizes());
  CHECK_ARG(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf, "x must be bf16 or fp16, got ",
            x.scalar_type());
  CHECK_ARG(x.is_contiguous(), "x must be contiguous");
  CHECK_ARG(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
            "packed must be a contiguous 2-D uint8 tensor, got ", packed.scalar_type(), " ", packed.sizes());
  CHECK_ARG(scale.scalar_type() == at::kHalf && scale.dim() == 2 && scale.is_contiguous(),
            "scale must be a contiguous 2-D fp16 tensor, got ", scale.scalar_type(), " ", scale.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  const int64_t ldp = packed.size(1), lds = scale.size(1);
  // >= 32: a 32-weight chunk of the small-M kernel then spans at most two scale blocks.
  CHECK_ARG(block_size >= 32, "block_size must be >= 32, got ", block_size);
  CHECK_ARG(k_offset >= 0 && k_offset < block_size, "k_offset must be in [0, block_size), got ", k_offset);
  CHECK_ARG(scale.size(0) == N, "scale has ", scale.size(0), " rows, packed has ", N);
  CHECK_ARG(ldp >= (K + 3) / 4, "packed has ", ldp, " bytes per row, needs ceil(K/4) = ", (K + 3) / 4, " for K=", K);
  CHECK_ARG(lds >= (k_offset + K + block_size - 1) / block_size, "scale has ", lds, " blocks per row, needs ",
            (k_offset + K + block_size - 1) / block_size);
  CHECK_ARG(x.device() == packed.device() && x.device() == scale.device(), "x, packed, scale on different devices");
  if (bias) {
    CHECK_ARG(bias->is_cuda() && bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
              "bias must be [N] in x's dtype on x's device");
  }
  CHECK_ARG(path >= kGemv && path <= kWgmma,
            "path must be 1 (gemv), 2 (mma), 3 (dequant), 4 (tiled) or 5 (wgmma), got ", path,
            " (torch.ops.ternary_serve.gemm chooses one: ternary_plugin/dispatch.py)");
  CHECK_ARG(tokens_per_cta == 0 || path == kWgmma, "tokens_per_cta is the wgmma kernel's (path 5), got ",
            tokens_per_cta, " for path ", path);
  if (path == kWgmma) {
    CHECK_ARG((tokens_per_cta == 0 || tokens_per_cta == 128 || tokens_per_cta == 256) &&
                  (rows_per_cta == 0 || rows_per_cta == 128),
              "the wgmma kernel's tile (tokens_per_cta x rows_per_cta) is 128 or 256 x 128 (or 0 = auto), got ",
              tokens_per_cta, " x ", rows_per_cta);
    CHECK_ARG(k_unit == 0, "the wgmma kernel takes no k_unit, got ", k_unit);
    const int64_t steps = (K + ternary::kWgmmaStepK - 1) / ternary::kWgmmaStepK;
    CHECK_ARG((k_split == 0 || k_split == 1 || k_split == 2 || k_split == 4 || k_split == 8) && k_split <= steps,
              "k_split of the wgmma kernel must be 0 (auto), 1, 2, 4 or 8 CTAs a tile along K and at most its ",
              steps, " k-steps of ", ternary::kWgmmaStepK, " weights (K=", K, "), got ", k_split);
  } else if (path == kTiled) {
    CHECK_ARG(rows_per_cta == 0 || rows_per_cta == 64 || rows_per_cta == 128,
              "rows_per_cta of the tiled kernel must be 0 (auto), 64 or 128, got ", rows_per_cta);
    CHECK_ARG(k_split == 0 && k_unit == 0, "the tiled kernel takes no k_split or k_unit, got ", k_split, " and ",
              k_unit);
  } else {
    CHECK_ARG(rows_per_cta == 0 || rows_per_cta == 16 || rows_per_cta == 32 || rows_per_cta == 64,
              "rows_per_cta must be 0 (auto), 16, 32 or 64, got ", rows_per_cta);
  }
  CHECK_ARG(k_split >= 0 && k_split <= 8, "k_split must be 0 (auto) or 1..8 CTAs per tile along K, got ", k_split);
  const bool warps_ok = warps == 0 || warps == 8 || (warps == 16 && (rows_per_cta == 0 || rows_per_cta == 16));
  CHECK_ARG(warps_ok && (warps == 0 || path == kMma),
            "warps is the tensor-core kernel's (path 2): 0 (auto), 8, or 16 (with rows_per_cta 0 or 16), got ", warps,
            " with path ", path, " and rows_per_cta ", rows_per_cta);
  CHECK_ARG(k_unit == 0 || k_unit == 128 || (k_unit == 64 && (rows_per_cta == 0 || rows_per_cta == 16)),
            "k_unit must be 0 (auto), 128, or 64 (with rows_per_cta 0 or 16), got ", k_unit, " with rows_per_cta ",
            rows_per_cta);
  // Weights of K per unit of the tensor-core kernel. Auto: 64 where M fills two token tiles
  // (9-16) and K <= mma64_max_k (TERNARY_MMA64_MAX_K, ternary_plugin/dispatch.py, which says why).
  const bool unit64 = M > 8 && M <= 16 && K <= mma64_max_k && (rows_per_cta == 0 || rows_per_cta == 16);
  const int64_t unit = k_unit != 0 ? k_unit : unit64 ? 64 : 128;
  // The unit of the 16-warp tensor-core kernel where the launcher picks it (warps auto): 64
  // where K <= mma64_max_k and the blocks allow it, so K 1024 has a unit for each warp.
  const int64_t unit16 = k_unit != 0 ? k_unit
                         : K <= mma64_max_k && block_size % 64 == 0 && k_offset % 64 == 0 ? 64 : 128;
  // The fused kernels load 8 code bytes at a time: rows padded to 8 bytes, 8-byte aligned.
  const bool rows_padded = ldp % 8 == 0 && reinterpret_cast<uintptr_t>(packed.data_ptr()) % 8 == 0;
  const bool mma_ok = rows_padded && block_size % unit == 0 && k_offset % unit == 0;
  // activation rows that 16-byte copies can read (the tiled and wgmma kernels)
  const bool x_rows_16b = K % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  // the tiled kernel copies activations 16 bytes at a time and works in whole scale blocks
  const bool tiled_ok = rows_padded && block_size % 128 == 0 && k_offset % 128 == 0 && x_rows_16b;
  // the wgmma kernel: whole 64-weight k-steps inside a scale block, TMA copies (rows and bases
  // 16-byte aligned), a row's scale blocks in shared memory
  const bool wgmma_ok = ldp % 16 == 0 && reinterpret_cast<uintptr_t>(packed.data_ptr()) % 16 == 0 &&
                        block_size % 64 == 0 && k_offset % 64 == 0 && x_rows_16b &&
                        (k_offset + K - 1) / block_size - k_offset / block_size + 1 <= ternary::kWgmmaMaxScaleCols;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  CHECK_ARG(path == kDequant || rows_padded, "the fused kernels need rows padded to a multiple of 8 bytes (ldp=",
            ldp, ", K=", K, "): use ternary_plugin.ops.pad_packed_rows");
  CHECK_ARG(path != kMma || mma_ok, "the tensor-core kernel needs block_size and k_offset multiples of ", unit,
            ", got ", block_size, " and ", k_offset);
  CHECK_ARG(path != kTiled || tiled_ok, "the tiled kernel needs block_size and k_offset multiples of 128 (got ",
            block_size, " and ", k_offset, "), K a multiple of 8 (got ", K, ") and x 16-byte aligned");
  CHECK_ARG(path != kWgmma || wgmma_ok, "the wgmma kernel needs block_size and k_offset multiples of 64 (got ",
            block_size, " and ", k_offset, "), K a multiple of 8 (got ", K, "), x and packed 16-byte aligned, rows ",
            "padded to 16 bytes (ldp=", ldp, ") and at most ", ternary::kWgmmaMaxScaleCols, " scale blocks a row");
  CHECK_ARG(path != kWgmma || ternary::wgmma_supported(),
            "the wgmma kernel runs on sm_90 (Hopper) devices only; this device is not one");

  const at::cuda::OptionalCUDAGuard guard(x.device());
  auto y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const torch::Tensor b = bias ? bias->contiguous() : torch::Tensor();
  const void* bias_ptr = bias ? b.data_ptr() : nullptr;
  const auto* scale_ptr = reinterpret_cast<const __half*>(scale.data_ptr<at::Half>());

  if (path == kMma) {
    check_cuda_error(ternary::launch_mma(bf16, x.data_ptr(), packed.data_ptr<uint8_t>(), scale_ptr, bias_ptr,
                                         y.data_ptr(), M, N, K, ldp, lds, block_size, k_offset, rows_per_cta, k_split,
                                         unit, unit16, warps, pdl, stream),
                     "ternary_mma_kernel launch", M, N, K);
    return y;
  }
  if (path == kWgmma) {
    check_cuda_error(ternary::launch_wgmma(bf16, x.data_ptr(), packed.data_ptr<uint8_t>(), scale_ptr, bias_ptr,
                                           y.data_ptr(), M, N, K, ldp, lds, block_size, k_offset, tokens_per_cta,
                                           k_split, stream),
                     "ternary_wgmma_kernel launch", M, N, K);
    return y;
  }
  if (path == kTiled) {
    check_cuda_error(ternary::launch_tiled(bf16, x.data_ptr(), packed.data_ptr<uint8_t>(), scale_ptr, bias_ptr,
                                           y.data_ptr(), M, N, K, ldp, lds, block_size, k_offset, rows_per_cta,
                                           stream),
                     "ternary_tiled_kernel launch", M, N, K);
    return y;
  }
  if (path == kGemv) {
    check_cuda_error(ternary::launch_gemv(bf16, x.data_ptr(), packed.data_ptr<uint8_t>(), scale_ptr, bias_ptr,
                                          y.data_ptr(), M, N, K, ldp, lds, block_size, k_offset, stream),
                     "ternary_gemv_kernel launch", M, N, K);
    return y;
  }
  auto w = torch::empty({N, K}, x.options());  // transient, from the caching allocator
  check_cuda_error(ternary::launch_dequant(bf16, packed.data_ptr<uint8_t>(), scale_ptr, w.data_ptr(), N, K, ldp,
                                           lds, block_size, k_offset, stream),
                   "ternary_dequant_kernel launch", M, N, K);
  if (bias) {
    at::addmm_out(y, *bias, x, w.t());
  } else {
    at::mm_out(y, x, w.t());
  }
  return y;
}

// torch.ops.ternary_serve.gemm_w2a8_path: the int8-activation mode on the s8 wgmma kernel
// (csrc/ternary_wgmma_s8.cu). x is quantized per token inside the op into a transient int8 copy
// [M, round_up(K, 128)] (K permuted per 128-block as the kernel reads it) from the caching
// allocator; the plan (Humming's int8 layer or this) is ternary_plugin/dispatch.py's. fold: the
// kernel folds each row's block scales into its int8 weights (reference_linear_w2a8_folded);
// rows: W rows a tile, 128 or 256 (fold only, no split), 0 = the kernel's choice.
torch::Tensor gemm_w2a8_path(const torch::Tensor& x,       // [M, K] bf16/fp16
                             const torch::Tensor& packed,  // [N, ldp] uint8, ldp % 16 == 0
                             const torch::Tensor& scale,   // [N, lds] fp16
                             const std::optional<torch::Tensor>& bias,  // [N] x.dtype
                             int64_t block_size, int64_t k_offset, int64_t k_split, bool fold, int64_t rows) {
#define CHECK_W2A8(cond, ...) TERNARY_CHECK_ARG("ternary_serve::gemm_w2a8_path: ", cond, __VA_ARGS__)
  CHECK_W2A8(x.is_cuda() && packed.is_cuda() && scale.is_cuda(), "x, packed and scale must be CUDA tensors");
  CHECK_W2A8(x.device() == packed.device() && x.device() == scale.device(), "x, packed, scale on different devices");
  CHECK_W2A8(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
             "x must be a contiguous 2-D bf16 or fp16 tensor [M, K], got ", x.scalar_type(), " ", x.sizes());
  CHECK_W2A8(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
             "packed must be a contiguous 2-D uint8 tensor, got ", packed.scalar_type(), " ", packed.sizes());
  CHECK_W2A8(scale.scalar_type() == at::kHalf && scale.dim() == 2 && scale.is_contiguous(),
             "scale must be a contiguous 2-D fp16 tensor, got ", scale.scalar_type(), " ", scale.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), ldp = packed.size(1), lds = scale.size(1);
  CHECK_W2A8(block_size % ternary::kS8StepK == 0 && block_size > 0 && k_offset % ternary::kS8StepK == 0 &&
                 k_offset >= 0 && k_offset < block_size,
             "the s8 kernel needs block_size and k_offset multiples of ", ternary::kS8StepK,
             " with 0 <= k_offset < block_size, got ", block_size, " and ", k_offset);
  CHECK_W2A8(block_size <= ternary::kS8MaxBlockSize && k_offset + K <= ternary::kS8MaxKEnd,
             "the s8 kernel counts 128-weight steps in 16 bits: block_size <= ", ternary::kS8MaxBlockSize,
             " and k_offset + K <= ", ternary::kS8MaxKEnd, ", got block_size ", block_size, ", k_offset + K ",
             k_offset + K);
  CHECK_W2A8(scale.size(0) == N, "scale has ", scale.size(0), " rows, packed has ", N);
  CHECK_W2A8(ldp >= (K + 3) / 4, "packed has ", ldp, " bytes per row, needs ceil(K/4) = ", (K + 3) / 4, " for K=", K);
  CHECK_W2A8(ldp % 16 == 0 && reinterpret_cast<uintptr_t>(packed.data_ptr()) % 16 == 0,
             "packed rows must be padded to 16 bytes and 16-byte aligned (ldp=", ldp,
             "): use ternary_plugin.ops.pad_packed_rows");
  CHECK_W2A8(lds >= (k_offset + K + block_size - 1) / block_size, "scale has ", lds, " blocks per row, needs ",
             (k_offset + K + block_size - 1) / block_size);
  CHECK_W2A8((k_offset + K + block_size - 1) / block_size - k_offset / block_size <= ternary::kS8MaxScaleCols,
             "the s8 kernel holds at most ", ternary::kS8MaxScaleCols, " scale blocks a row in shared memory, K=", K,
             " needs ", (k_offset + K + block_size - 1) / block_size - k_offset / block_size);
  if (bias) {
    CHECK_W2A8(bias->is_cuda() && bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
               "bias must be [N] in x's dtype on x's device");
  }
  const int64_t Kp = (K + ternary::kS8StepK - 1) / ternary::kS8StepK * ternary::kS8StepK;
  CHECK_W2A8((k_split == 0 || k_split == 1 || k_split == 2 || k_split == 4 || k_split == 8) &&
                 k_split <= std::max<int64_t>(Kp / ternary::kS8StepK, 1),
             "k_split must be 0 (auto), 1, 2, 4 or 8 and at most the ", Kp / ternary::kS8StepK, " k-steps of ",
             ternary::kS8StepK, " weights, got ", k_split);
  CHECK_W2A8(rows == 0 || rows == 128 || (rows == 256 && fold && k_split <= 1),
             "rows must be 0 (auto), 128 or 256, and 256 needs fold=True and k_split 0 or 1, got rows=", rows,
             " fold=", fold, " k_split=", k_split);
  CHECK_W2A8(ternary::wgmma_supported(), "the s8 wgmma kernel runs on sm_90 (Hopper) devices only");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  if (K == 0 || M == 0 || N == 0) {
    auto y = torch::zeros({M, N}, x.options());
    return bias && M > 0 ? y + *bias : y;
  }
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  // a strided bias's copy is made before the quantize kernel: a kernel between it and the GEMM
  // would stand in the way of the GEMM's programmatic dependent launch
  const torch::Tensor b = bias ? bias->contiguous() : torch::Tensor();
  auto xq = torch::empty({M, Kp}, x.options().dtype(at::kChar));
  auto sx = torch::empty({M}, x.options().dtype(at::kFloat));
  check_cuda_error(ternary::launch_quantize_s8(bf16, x.data_ptr(), xq.data_ptr<int8_t>(), sx.data_ptr<float>(), M, K,
                                               Kp, true, stream),
                   "quantize_s8_kernel launch", M, N, K);
  auto y = torch::empty({M, N}, x.options());
  check_cuda_error(ternary::launch_wgmma_s8(bf16, xq.data_ptr<int8_t>(), sx.data_ptr<float>(),
                                            packed.data_ptr<uint8_t>(),
                                            reinterpret_cast<const __half*>(scale.data_ptr<at::Half>()),
                                            bias ? b.data_ptr() : nullptr, y.data_ptr(), M, N, Kp, ldp, lds,
                                            block_size, k_offset, k_split, fold, (int)rows, stream),
                   "ternary_wgmma_s8_kernel launch", M, N, K);
  return y;
#undef CHECK_W2A8
}

// torch.ops.ternary_serve.quantize_int8: the mode's activation quantization alone (natural column
// order), (xq int8 [M, K], sx float32 [M]): the input step of Humming's int2 x int8 GEMM
// (humming_backend.forward_w2a8), tested against activations.quantize_activations_int8. sx's
// storage holds round_up(M, 4) floats, as Humming allocates its token scales.
std::tuple<torch::Tensor, torch::Tensor> quantize_int8(const torch::Tensor& x) {
  TERNARY_CHECK_ARG("ternary_serve::quantize_int8: ", x.is_cuda() && x.dim() == 2 && x.is_contiguous() &&
                        (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
                    "x must be a contiguous 2-D bf16 or fp16 CUDA tensor, got ", x.scalar_type(), " ", x.sizes());
  const at::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t M = x.size(0), K = x.size(1);
  auto xq = torch::empty({M, K}, x.options().dtype(at::kChar));
  auto sx = torch::empty({(M + 3) / 4 * 4}, x.options().dtype(at::kFloat)).narrow(0, 0, M);
  check_cuda_error(ternary::launch_quantize_s8(x.scalar_type() == at::kBFloat16, x.data_ptr(), xq.data_ptr<int8_t>(),
                                               sx.data_ptr<float>(), M, K, K, false,
                                               at::cuda::getCurrentCUDAStream()),
                   "quantize_s8_kernel launch", M, 0, K);
  return {xq, sx};
}

// torch.ops.ternary_serve.humming_gemv: M <= 16 on a layer holding Humming's int2 group-128
// layout for float activations (csrc/ternary_humming_gemv.cu draws the layout and the kernel).
// k_split: CTAs along K, 0 = auto (enough CTAs to fill the GPU); > 1 sums in an fp32 workspace
// (a slice a split, added in split order: deterministic).
torch::Tensor humming_gemv(const torch::Tensor& x,       // [M, K] bf16/fp16
                           const torch::Tensor& weight,  // [K/16, N] int32, Humming's transformed codes
                           const torch::Tensor& scale,   // [K/128, N] x.dtype, Humming's transformed scales
                           const std::optional<torch::Tensor>& bias,  // [N] x.dtype, in W's row order
                           int64_t k_split) {
#define CHECK_HG(cond, ...) TERNARY_CHECK_ARG("ternary_serve::humming_gemv: ", cond, __VA_ARGS__)
  CHECK_HG(x.is_cuda() && weight.is_cuda() && scale.is_cuda(), "x, weight and weight_scale must be CUDA tensors");
  CHECK_HG(x.device() == weight.device() && x.device() == scale.device(), "x, weight, weight_scale on different devices");
  CHECK_HG(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
           "x must be a contiguous 2-D bf16 or fp16 tensor [M, K], got ", x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  CHECK_HG(M >= 1 && M <= 16, "x has M=", M, " rows: the kernel takes 1 to 16");
  CHECK_HG(K % 128 == 0 && K > 0, "K=", K, " must be a positive multiple of 128 (the layout's scale groups)");
  CHECK_HG(weight.scalar_type() == at::kInt && weight.dim() == 2 && weight.is_contiguous() && weight.size(0) == K / 16,
           "weight must be Humming's contiguous int32 [K/16=", K / 16, ", N], got ", weight.scalar_type(), " ",
           weight.sizes());
  const int64_t N = weight.size(1);
  CHECK_HG(N % 64 == 0 && N > 0, "N=", N, " must be a positive multiple of 64 (Humming's layout)");
  CHECK_HG(scale.scalar_type() == x.scalar_type() && scale.dim() == 2 && scale.is_contiguous() &&
               scale.size(0) == K / 128 && scale.size(1) == N,
           "weight_scale must be contiguous [K/128=", K / 128, ", N=", N, "] in x's dtype ", x.scalar_type(), ", got ",
           scale.scalar_type(), " ", scale.sizes());
  CHECK_HG(reinterpret_cast<uintptr_t>(x.data_ptr()) % 4 == 0 && reinterpret_cast<uintptr_t>(weight.data_ptr()) % 8 == 0 &&
               reinterpret_cast<uintptr_t>(scale.data_ptr()) % 16 == 0,
           "x must be 4-byte, weight 8-byte and weight_scale 16-byte aligned");
  if (bias) {
    CHECK_HG(bias->is_cuda() && bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
             "bias must be [N] in x's dtype on x's device");
  }
  CHECK_HG(k_split >= 0 && k_split <= K / 128, "k_split must be 0 (auto) or 1 to K/128=", K / 128, ", got ", k_split);
  const at::cuda::OptionalCUDAGuard guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int splits = k_split > 0 ? static_cast<int>(k_split) : ternary::humming_gemv_k_split(M, N, K, sms);
  auto y = torch::empty({M, N}, x.options());
  // k_split > 1: each split's fp32 sums [splits, M, N], and one counter a 64-row block, zeroed
  const torch::Tensor work = splits > 1 ? torch::empty({splits, M, N}, x.options().dtype(at::kFloat)) : torch::Tensor();
  const torch::Tensor counters = splits > 1 ? torch::zeros({N / 64}, x.options().dtype(at::kInt)) : torch::Tensor();
  const torch::Tensor b = bias ? bias->contiguous() : torch::Tensor();
  check_cuda_error(ternary::launch_humming_gemv(x.scalar_type() == at::kBFloat16, x.data_ptr(),
                                                reinterpret_cast<const uint32_t*>(weight.data_ptr<int32_t>()),
                                                scale.data_ptr(), bias ? b.data_ptr() : nullptr, y.data_ptr(),
                                                splits > 1 ? work.data_ptr<float>() : nullptr,
                                                splits > 1 ? reinterpret_cast<unsigned int*>(counters.data_ptr<int32_t>())
                                                           : nullptr,
                                                M, N, K, splits, stream),
                   "humming_gemv_kernel launch", M, N, K);
  return y;
#undef CHECK_HG
}

// W [N, K] in `dtype` (bf16/fp16): the large-M path's first half, exposed for benchmarks.
torch::Tensor dequantize(const torch::Tensor& packed, const torch::Tensor& scale, int64_t K, int64_t block_size,
                         int64_t k_offset, at::ScalarType dtype) {
  CHECK_ARG(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
            "packed must be a contiguous 2-D uint8 CUDA tensor");
  CHECK_ARG(scale.is_cuda() && scale.scalar_type() == at::kHalf && scale.dim() == 2 && scale.is_contiguous(),
            "scale must be a contiguous 2-D fp16 CUDA tensor");
  CHECK_ARG(dtype == at::kBFloat16 || dtype == at::kHalf, "dtype must be bf16 or fp16");
  CHECK_ARG(block_size >= 32 && k_offset >= 0 && k_offset < block_size, "bad block_size/k_offset");
  const int64_t N = packed.size(0);
  CHECK_ARG(packed.size(1) >= (K + 3) / 4 && scale.size(0) == N &&
                scale.size(1) >= (k_offset + K + block_size - 1) / block_size,
            "packed ", packed.sizes(), " / scale ", scale.sizes(), " too small for K=", K);
  const at::cuda::OptionalCUDAGuard guard(packed.device());
  auto w = torch::empty({N, K}, packed.options().dtype(dtype));
  if (N == 0 || K == 0) return w;
  check_cuda_error(ternary::launch_dequant(dtype == at::kBFloat16, packed.data_ptr<uint8_t>(),
                                           reinterpret_cast<const __half*>(scale.data_ptr<at::Half>()),
                                           w.data_ptr(), N, K, packed.size(1), scale.size(1), block_size, k_offset,
                                           at::cuda::getCurrentCUDAStream()),
                   "ternary_dequant_kernel launch", 0, N, K);
  return w;
}

}  // namespace

TORCH_LIBRARY_IMPL(ternary_serve, CUDA, m) {
  m.impl("gemm_path", &gemm_path);
  m.impl("dequantize", &dequantize);
  m.impl("gemm_w2a8_path", &gemm_w2a8_path);
  m.impl("quantize_int8", &quantize_int8);
  m.impl("humming_gemv", &humming_gemv);
}
