// torch.ops.ternary_serve.gemm: input checks, dispatch by M, launch on the current stream.
// Declared once in csrc/ternary_schema.cpp; the fake (meta) implementation is in ternary_plugin/ops.py.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "ternary_check.h"
#include "ternary_wgmma.h"

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
bool tiled_fits_one_wave(int M, int N);
bool mma_fits_one_wave(bool bf16, int M, int N);
}  // namespace ternary

namespace {

// Dispatch by M (measured on the H200, benchmarks/results/kernel-h200.md):
//   M <= TERNARY_MMA_MAX_M (default 32), or M <= TERNARY_MMA_NARROW_MAX_M (default 128) where N <=
//     TERNARY_MMA_NARROW_MAX_N (default 1536) and its tiles (16 W rows x 32 tokens, 8 warps) fit
//     in one wave (ternary::mma_fits_one_wave: 2 CTAs an SM on the H200, 264), and the layer's
//     blocks start on unit boundaries: the tensor-core kernel (csrc/ternary_mma.cu; 16 warps a
//     CTA where M <= 16 and its tiles fit in one wave, with units of 64 weights where K <=
//     TERNARY_MMA64_MAX_K, default 1024; else 8 warps, units of 64 weights at M 9-16 where K <=
//     that, else 128: launch_mma). At M = 64 on the narrow layers (N 1024-1536: 64-96 CTAs a
//     token tile) it beat the op's choice then (dequantize + cuBLAS, or tiled at N 1536) on all
//     six: o 6.65 vs 8.99 us, down 9.37 vs 12.05, qkv/tp4 4.05 vs 6.12, o/tp4 3.27 vs 4.90,
//     gate_up/tp4 5.79 vs 7.04, down/tp4 3.61 vs 5.58 (kernel-h200.md of abe05a0); at M 96 and
//     128 on N = 1024 (192 and 256 CTAs) it beat dequantize + cuBLAS on all five such layers
//     (kernel-h200-midm.md of 8a1431f: o 8.42 / 8.73 vs 9.20 / 9.28 us, down 10.97 / 11.28 vs
//     12.27 / 12.27, qkv/tp4 5.57 / 5.87 vs 6.27 / 6.90, o/tp4 4.05 / 4.22 vs 4.95 / 4.94,
//     down/tp4 5.12 / 5.13 vs 5.65 / 5.68), and lost past one wave (gate_up/tp4 M 96, 288 CTAs:
//     7.96 vs the tiled kernel's 7.35; N = 1024 at M 192, 384 CTAs: o 12.44 vs 9.53); at N >=
//     4096 the tiled kernel wins, and at M = 256 both others;
//   else M <= TERNARY_TILED_MAX_M (default 64), N >= TERNARY_TILED_MIN_N (default 1536) and the
//     tiled kernel's conditions hold (blocks on 128-weight boundaries, K % 8 == 0, x 16-byte
//     aligned): the tiled tensor-core kernel (csrc/ternary_tiled.cu). At M = 64 it beat
//     dequantize + cuBLAS on every measured shape with N >= 1536 (gate_up/tp4 1.06x, qkv
//     1.46x, gate_up 1.78x) and lost on the N = 1024 ones (its 16 CTAs leave most SMs idle);
//     from M = 256 up it wins only on the tp 4 shards at M = 256, by 2-10 % (kernel-h200.md,
//     "Tiled tensor-core kernel"); and up to TERNARY_TILED_WAVE_MAX_M (default 256) where its
//     auto tiles fit in one wave (ternary::tiled_fits_one_wave): at M 128 (kernel-h200-midm.md of
//     7f95483) qkv 7.62 us against the wgmma kernel's 9.40 (dequantize + cuBLAS 10.44),
//     gate_up/tp4 7.47 vs 7.75; at M 192 and 256 (8a1431f) gate_up/tp4 7.38 / 7.47 vs 7.93 /
//     8.05; where they did not fit it lost (gate_up, 192 CTAs: 13.6 vs 9.5; qkv M 192: 13.5 vs
//     the wgmma kernel's 9.5), as on N = 1024 (the rule's TILED_MIN_N);
//   else TERNARY_WGMMA_MIN_M (default 1024; 0 = off) <= M <= TERNARY_WGMMA_MAX_M (default
//     8192), an sm_90 device, the wgmma kernel's conditions (wgmma_ok below) and enough CTAs to
//     fill the GPU (ternary::wgmma_fills_gpu): the wgmma kernel (csrc/ternary_wgmma.cu; no bf16
//     copy of W). Measured on the H200: 4-29 % faster than dequantize + cuBLAS on the rows it
//     takes (qkv M 1024; all but gate_up/tp4 at M 4096); at M 16384 dequantize + cuBLAS won 6 of
//     8 rows by 3-12 % before the kernel was made persistent (+4-6 % since, on the probe), so
//     the MAX_M until the benchmark says otherwise; and, on layers with N >=
//     TERNARY_WGMMA_WIDE_MIN_N (default 4096), whose transient bf16 copy is the largest, at
//     TERNARY_WGMMA_WIDE_MIN_M (default 65; 0 = off) <= M <= TERNARY_WGMMA_WIDE_MAX_M (default
//     1023): its tiles (choose_wgmma_tiling: 128 tokens, split along K over a cluster where they
//     leave SMs idle) beat dequantize + cuBLAS there in the eleventh session's run
//     (kernel-h200.md, kernel-h200-midm.md): M 128 qkv 9.38 vs 10.40 us, gate_up 9.51 vs 12.17;
//     M 256 9.53 vs 11.20, 11.71 vs 14.38; M 512 11.95 vs 13.86, 16.13 vs 18.42 (M 65-127 run
//     M 128's tiles; qkv there takes the tiled kernel, above); they lost on every layer with N <=
//     1536 from M 256 (o 10.18 vs 9.66, gate_up/tp4 8.82 vs 7.96) and on gate_up at M 1024 (30.0
//     vs 27.0: 1.45 waves);
//   else M <= TERNARY_GEMV_MAX_M (default 1): the warp-per-row kernel (any k_offset);
//   else: dequantize + cuBLAS.
// pdl: the tensor-core kernel is launched with programmatic dependent launch on sm_90
// (csrc/ternary_mma.cu, pdl_wait): its first weight loads overlap the end of the kernel before
// it. Only for weights that the kernel just before the op does not write. Measured on the H200
// (bench_kernel, "Programmatic dependent launch"): back to back it gains up to 0.8 us a call
// (o and down lose up to 0.6), after a kernel launched plainly it loses ~0.2 us on every shape,
// so the plugin launches plainly; for graphs whose kernels trigger their dependents. The other
// kernels ignore it.
int64_t env_int(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoll(e) : fallback;
}
// The dispatch limits above, read once per process.
struct Limits {
  int64_t gemv_max_m, mma_max_m, mma_narrow_max_m, mma_narrow_max_n, mma64_max_k, tiled_max_m, tiled_min_n,
      tiled_wave_max_m, wgmma_min_m, wgmma_max_m, wgmma_wide_min_m, wgmma_wide_max_m, wgmma_wide_min_n;
};
const Limits& limits() {
  static const Limits v{env_int("TERNARY_GEMV_MAX_M", 1),    env_int("TERNARY_MMA_MAX_M", 32),
                        env_int("TERNARY_MMA_NARROW_MAX_M", 128), env_int("TERNARY_MMA_NARROW_MAX_N", 1536),
                        env_int("TERNARY_MMA64_MAX_K", 1024), env_int("TERNARY_TILED_MAX_M", 64),
                        env_int("TERNARY_TILED_MIN_N", 1536), env_int("TERNARY_TILED_WAVE_MAX_M", 256),
                        env_int("TERNARY_WGMMA_MIN_M", 1024),
                        env_int("TERNARY_WGMMA_MAX_M", 8192), env_int("TERNARY_WGMMA_WIDE_MIN_M", 65),
                        env_int("TERNARY_WGMMA_WIDE_MAX_M", 1023), env_int("TERNARY_WGMMA_WIDE_MIN_N", 4096)};
  return v;
}

enum Path : int64_t { kAuto = 0, kGemv = 1, kMma = 2, kDequant = 3, kTiled = 4, kWgmma = 5 };

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
                        int64_t k_split, int64_t k_unit, int64_t tokens_per_cta, int64_t warps, bool pdl) {
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
  CHECK_ARG(path >= kAuto && path <= kWgmma,
            "path must be 0 (auto), 1 (gemv), 2 (mma), 3 (dequant), 4 (tiled) or 5 (wgmma), got ", path);
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
  CHECK_ARG(warps_ok && (warps == 0 || path == kAuto || path == kMma),
            "warps is the tensor-core kernel's (path 2): 0 (auto), 8, or 16 (with rows_per_cta 0 or 16), got ", warps,
            " with path ", path, " and rows_per_cta ", rows_per_cta);
  CHECK_ARG(k_unit == 0 || k_unit == 128 || (k_unit == 64 && (rows_per_cta == 0 || rows_per_cta == 16)),
            "k_unit must be 0 (auto), 128, or 64 (with rows_per_cta 0 or 16), got ", k_unit, " with rows_per_cta ",
            rows_per_cta);
  // Weights of K per unit of the tensor-core kernel. Auto: 64 where M fills two token tiles
  // (9-16) and K <= TERNARY_MMA64_MAX_K (default 1024): measured on the H200 in two sessions,
  // M = 16: qkv -10 / -13 %, gate_up -7 / -12 %, o/tp4 -12 %, down/tp4 -5 % (qkv/tp4 +2 %);
  // at M <= 8 and on longer K, 128 (kernel-h200.md, "64-weight units").
  const bool unit64 = M > 8 && M <= 16 && K <= limits().mma64_max_k && (rows_per_cta == 0 || rows_per_cta == 16);
  const int64_t unit = k_unit != 0 ? k_unit : unit64 ? 64 : 128;
  // The unit of the 16-warp tensor-core kernel where the launcher picks it (warps auto): 64
  // where K <= TERNARY_MMA64_MAX_K and the blocks allow it, so K 1024 has a unit for each warp.
  const int64_t unit16 = k_unit != 0 ? k_unit
                         : K <= limits().mma64_max_k && block_size % 64 == 0 && k_offset % 64 == 0 ? 64 : 128;
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
  if (path == kAuto) {
    const Limits& l = limits();
    const bool mma_m = M <= l.mma_max_m || (M <= l.mma_narrow_max_m && N <= l.mma_narrow_max_n &&
                                            ternary::mma_fits_one_wave(bf16, M, N));
    const bool wgmma_m = M <= l.wgmma_max_m &&
                         ((l.wgmma_min_m > 0 && M >= l.wgmma_min_m && ternary::wgmma_fills_gpu(M, N)) ||
                          (l.wgmma_wide_min_m > 0 && M >= l.wgmma_wide_min_m && M <= l.wgmma_wide_max_m &&
                           N >= l.wgmma_wide_min_n));
    path = (mma_ok && mma_m)                                                ? kMma
           : (tiled_ok && N >= l.tiled_min_n &&
              (M <= l.tiled_max_m || (M <= l.tiled_wave_max_m && ternary::tiled_fits_one_wave(M, N)))) ? kTiled
           : (wgmma_ok && wgmma_m && ternary::wgmma_supported())            ? kWgmma
           : (rows_padded && M <= l.gemv_max_m)                            ? kGemv
                                                                            : kDequant;
  }
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

torch::Tensor gemm(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scale,
                   const std::optional<torch::Tensor>& bias, int64_t block_size, int64_t k_offset, bool pdl) {
  return gemm_path(x, packed, scale, bias, block_size, k_offset, kAuto, 0, 0, 0, 0, 0, pdl);
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
  m.impl("gemm", &gemm);
  m.impl("gemm_path", &gemm_path);
  m.impl("dequantize", &dequantize);
}
