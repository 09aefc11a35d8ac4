// torch.ops.ternary_serve.gemm on CPU: y[M, N] = x[M, K] @ W^T + bias, W[n, k] = code(n, k) *
// scale[n, (k_offset + k) / block_size], fp32 accumulation, y in x's dtype (the format:
// docs/quant_format.md; the reference: ternary_plugin.ops.reference_linear; the schema:
// csrc/ternary_schema.cpp). Here: the input checks, the choice of regime by M, the threads; the
// AVX-512 code and its tiling drawn out are in ternary_cpu_kernels.cpp, the AVX2 code (CPUs without
// AVX-512, or TERNARY_CPU_ISA=avx2) in ternary_cpu_avx2.cpp.
//
// Small M (M <= small_m_max()): the packed weights are streamed once, decoded in registers /
// L1 and multiplied against x held in cache (small_m_bf16 / small_m_f32), W row tiles spread
// over torch's intra-op threads.
//
// Past small M, bf16 x on AVX-512: a tile of W rows x all of K decoded once into the pair-major
// layout vdpbf16ps multiplies (pair_rows_bf16, <= kPairTileBytes a thread) and every x row run
// over it, a scale block at a time (ternary_cpu_kernels.cpp draws it).
//
// Past small M on AVX2 (any x dtype, in fp32): no decoded weights at all. Each x tile of 16 rows
// gets, per 32 columns of K, tables of its sums over every packed byte's 4 codes, and each W row
// adds the entries its bytes name (lut_rows_avx2): an add per 4 weights and 16 x rows, where the
// tile below multiplies each weight once per x row. x tiles spread over the threads (or W rows,
// where the tiles are fewer than the threads).
//
// Large M otherwise (fp32 / fp16 x on AVX-512, or bf16 x with scale blocks on odd columns; AVX2
// with TERNARY_CPU_AVX2_GEMM=dot|mm): a tile of
// W rows x all of K dequantized with its scales (dequantize_rows_*) into a buffer of <= kTileBytes
// a thread, multiplied by all of x with at::mm_out into y's columns (oneDNN's bf16 / MKL's fp32
// GEMM). Either way the tiles spread over the threads: never a whole-layer or cached copy of W.
//
//            x [M, K]                 W tile t [rows, K]^T        y [M, N]
//   +--------------------+        +----+----+----+          +----+----+----+
//   |                    |   @    | t0 | t1 | .. |    ->    | t0 | t1 | .. |   (columns of y)
//   +--------------------+        +----+----+----+          +----+----+----+
//
// The CPU without either instruction set (cpu_kernel_isa() == "") is told so by the op; the
// plugin (ternary_plugin/ops.py) asks first and takes the reference there.
//
// Below gemm: gemm_w2a8 and quantize_int8 on CPU, the int8-activation mode (their kernel and
// its tiling: ternary_cpu_w2a8.cpp; asked first through cpu_w2a8_isa()).

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/Utils.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>

#include "../ternary_check.h"
#include "ternary_cpu.h"

namespace ternary_cpu {
namespace {

// Largest M of the small-M kernel; past it, bf16 x takes the pair-major tile kernel and fp32 x
// the tile + MKL GEMM. Measured on the 2-core AMD EPYC (Zen 4, avx512_bf16, no AMX; quiet, 1
// thread, warm weights, us, small-M kernel / pair-major kernel):
//   bf16 x  Qwen3-0.6B gate_up (K 1024, N 6144): M 2 357 / 474, M 3 573 / 621, M 4 667 / 548, M 6
//           880 / 656; down (K 3072, N 1024): M 2 177 / 231, M 3 293 / 297, M 4 328 / 275; MiniLM
//           up (384, 1536): M 2 52 / 52, M 3 77 / 68, M 4 84 / 60
//   fp32 x  (ms, small-M kernel / tile + GEMM) gate_up: M 32 5.90 / 8.11, M 64 13.2 / 13.2; down:
//           M 32 3.52 / 3.60, M 64 6.53 / 8.54; MiniLM up: M 32 0.59 / 0.67, M 64 1.31 / 1.12 (shared)
// bf16: the pair-major kernel wins from M 3-4 on; fp32 loses past 32 (MKL's fp32 GEMM is further
// from its peak). The AVX2 code (x in fp32 whatever its dtype) loses earlier: on the AVX2-only
// AMD EPYC Zen 3 (1 thread, min of repeated calls, ms small-M kernel / lookup kernel) Qwen3-0.6B
// gate_up M 3 1.00 / 0.95, M 4 1.30 / 0.95, M 8 1.85 / 0.97; o M 3 0.33 / 0.35, M 4 0.47 / 0.35;
// down M 3 0.49 / 0.52, M 4 0.69 / 0.52; MiniLM up M 3 0.106 / 0.100, M 4 0.132 / 0.101: the
// lookups' x tile is 8 rows wide from M 1, so they cost the same at M 1-8.
// TERNARY_CPU_SMALL_M_MAX (read once per process) overrides all three.
constexpr int64_t kSmallMMaxBf16 = 2;
constexpr int64_t kSmallMMaxF32 = 32;
constexpr int64_t kSmallMMaxAvx2 = 3;
// The pair-major tile's bytes a thread: half of Zen 4's 1 MB L2, x's block taking a quarter.
constexpr int64_t kPairTileBytes = 512 * 1024;
// The large-M tile's dequantized bytes a thread: about one L2 (1 MB a core on Zen 4), its rows
// a multiple of 64 (oneDNN's N blocking). Against 512 KB in multiples of 16 rows: even to 5 %
// better on the Qwen3-0.6B layers at M 128-512, bf16, 1 thread (Qwen3 down M 512: 16.0 vs 17.1 ms).
constexpr int64_t kTileBytes = 1024 * 1024;

// The brgemm tile kernel (bf16 x past small M where the CPU has AMX-BF16): its W rows a thread
// decodes at once (brgemm_tile_rows), the x rows of one brgemm call, and the columns of y one C
// buffer holds (brgemm_tiles: [kBrgemmRows, kBrgemmPanelCols], 128 KB fp32 / int32; C as wide as
// a 1 MB int8 tile, up to 1536 columns at MiniLM's K, made the W2A8 kernel 10-15 % slower at M 128).
constexpr int64_t kBrgemmTileBytes = 512 * 1024;
constexpr int64_t kBrgemmRows = 128;
constexpr int64_t kBrgemmPanelCols = 256;
// y of at least this many bytes is written with streaming stores (the W2A8 AMX kernel's y).
constexpr int64_t kStreamYBytes = 16 * 1024 * 1024;
// The same for the bf16 brgemm tile, whose stores are rows of up to kBrgemmPanelCols columns:
// streaming them is faster from 4 MB of y and slower below (docs/kernel.md, "AMX").
constexpr int64_t kBrgemmStreamYBytes = 4 * 1024 * 1024;
// Where AMX runs, the smallest M of bf16 x that takes the dequantized tile and oneDNN's GEMM
// rather than the brgemm tile (bf16_tile_kernel): from there the brgemm tile loses to oneDNN's
// GEMM, mostly on its stores of y, which oneDNN writes from inside its kernel (docs/kernel.md, "AMX").
constexpr int64_t kGemmMinMAmx = 1024;

int64_t env_int(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoll(e) : fallback;
}

// Env var `name` as one of `allowed` (unset or empty: the first, "auto"); any other value is an
// error that names it and the choices ("X=v: must be auto, a or b"). Each caller keeps the
// result in a static: read once per process.
std::string env_choice(const char* name, std::initializer_list<const char*> allowed) {
  const char* e = std::getenv(name);
  const std::string r(e && *e ? e : *allowed.begin());
  std::string choices;  // "auto, a or b"
  for (size_t i = 0; i < allowed.size(); ++i) {
    const char* a = allowed.begin()[i];
    if (r == a) return r;
    choices += std::string(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + a;
  }
  TORCH_CHECK(false, name, "=", r, ": must be ", choices);
}

// TERNARY_CPU_SMALL_M_MAX, read once per process, overrides every threshold. avx2: the AVX2 code runs.
int64_t small_m_max(bool bf16, bool avx2) {
  static const int64_t forced = env_int("TERNARY_CPU_SMALL_M_MAX", -1);
  return forced >= 0 ? forced : avx2 ? kSmallMMaxAvx2 : bf16 ? kSmallMMaxBf16 : kSmallMMaxF32;
}

// The AVX2 code past small M: "lut" (lut_rows_avx2: each W row's packed bytes index tables of x's
// sums, one add per 4 weights and 16 x rows, no decoded tile) by default; or, on each thread's
// decoded fp32 tile, "dot" (tile_gemm_f32_avx2: 3 x rows x 4 tile rows of 8-lane sums, no packing)
// or "mm" (at::mm_out: MKL, which packs the tile it was just given, and then runs nearer the FMA
// peak). The FMA GEMMs are bound by the FMA's rate; the lookups do a quarter of the adds. On the
// AVX2-only AMD EPYC Zen 3 (1 thread, min of repeated calls, ms lut / best of dot and mm): MiniLM
// up M 16 0.167 / 0.314, M 512 5.25 / 6.95; Qwen3-0.6B gate_up M 16 1.55 / 3.48, M 512 50.7 /
// 74.8; o M 512 18.3 / 26.4; down M 512 27.6 / 40.4 (the benchmark against torch:
// benchmarks/results/cpu-kernel-avx2-lut-zen3.md). TERNARY_CPU_AVX2_GEMM=auto|lut|dot|mm, read
// once per process, forces one (auto: lut).
std::string avx2_gemm() {
  static const std::string forced = env_choice("TERNARY_CPU_AVX2_GEMM", {"auto", "lut", "dot", "mm"});
  return forced == "auto" ? "lut" : forced;
}

// bf16 x past small M, on AVX-512 (ternary_cpu.cpp's regimes above): "pair" (the pair-major
// tile and our vdpbf16ps loop), "brgemm" (the VNNI tile and oneDNN's batch-reduce GEMM: AMX tiles
// where the CPU has AMX-BF16), "brgemm_kslice" (its K-slice variant: brgemm_kslice_tiles) or "gemm"
// (the dequantized tile and oneDNN's whole GEMM, which reorders it for AMX itself). Where AMX runs
// (at::cpu::init_amx: the CPU has it and Linux lets this process use it) and oneDNN is enabled,
// brgemm_kslice from M 3 to kKSliceMaxM, brgemm past it and gemm from kGemmMinMAmx, else pair;
// measured on the 2-core Xeon with AMX and the 2-core Zen 4 without: docs/kernel.md (CPU),
// benchmarks/results/cpu-kslice.md. TERNARY_CPU_BF16_TILE=auto|pair|brgemm|brgemm_kslice|gemm
// (read once per process) forces one.
//
// The largest M of the K-slice kernel where AMX runs: up to it 1.02-1.2x faster than the brgemm
// tile on the Qwen3-0.6B layers (1 and 2 threads, M 3-128, weights cold); at M 512 it lost on o
// (0.80-0.85x), qkv and gate_up (0.94-1.0x) and won only on down (1.02-1.04x); M 192-256 were
// about even to 1.1x with slices of 512 (benchmarks/results/cpu-kslice.md).
constexpr int64_t kKSliceMaxM = 128;
// cpu_force_bf16_tile (benchmarks, tests): a kernel forced for this process, over the env var; "" none.
std::string& forced_bf16_tile() {
  static std::string forced;
  return forced;
}
// The K-slice kernel's slice (columns, a multiple of 64), 0: its own rule (kslice_k); the brgemm tile's
// too, 0: brgemm_k_slice's. cpu_force_bf16_tile sets it.
int64_t& forced_k_slice() {
  static int64_t forced = 0;
  return forced;
}
// Whether the K-slice kernel prefetches the next group's codes (cpu_force_bf16_tile: to measure it).
bool& kslice_prefetch() {
  static bool on = true;
  return on;
}

std::string bf16_tile_kernel(int64_t M) {
  static const std::string req =
      env_choice("TERNARY_CPU_BF16_TILE", {"auto", "pair", "brgemm", "brgemm_kslice", "gemm"});
  static const bool amx = at::cpu::init_amx();
  if (!forced_bf16_tile().empty()) return forced_bf16_tile();
  if (req != "auto") return req;
  // brgemm's VNNI layout needs oneDNN (torch.backends.mkldnn.enabled = False turns it off)
  if (!amx || !at::globalContext().userEnabledMkldnn()) return "pair";
  return M >= kGemmMinMAmx ? "gemm" : M <= kKSliceMaxM ? "brgemm_kslice" : "brgemm";
}

// Error messages as one string (csrc/ternary_check.h says why).
constexpr const char* kGemmPrefix = "ternary_serve::gemm (CPU): ";
constexpr const char* kW8Prefix = "ternary_serve::gemm_w2a8 (CPU): ";

// The weight tensors' checks of both CPU ops (x's own checks are each op's): packed, scale, the
// block geometry and bias against x's K and dtype. `prefix` names the op in the message.
void check_weights(const char* prefix, const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scale,
                   const std::optional<torch::Tensor>& bias, int64_t block_size, int64_t k_offset) {
  const auto dt = x.scalar_type();
  TERNARY_CHECK_ARG(prefix, packed.dim() == 2 && packed.scalar_type() == at::kByte, "packed must be a 2-D uint8 tensor [N, ",
                    "ceil(K/4)], got ", packed.scalar_type(), " of shape ", packed.sizes());
  TERNARY_CHECK_ARG(prefix, scale.dim() == 2 && scale.scalar_type() == at::kHalf, "scale must be a 2-D float16 tensor [N, ",
                    "ceil((k_offset + K)/block_size)], got ", scale.scalar_type(), " of shape ", scale.sizes());
  TERNARY_CHECK_ARG(prefix, block_size > 0, "block_size must be positive, got ", block_size);
  TERNARY_CHECK_ARG(prefix, k_offset >= 0 && k_offset < block_size, "k_offset must be in [0, block_size=", block_size,
                    "), got ", k_offset);
  const int64_t K = x.size(1), N = packed.size(0);
  const int64_t need_p = (K + 3) / 4, need_s = (k_offset + K + block_size - 1) / block_size;
  TERNARY_CHECK_ARG(prefix, packed.size(1) >= need_p, "packed has shape ", packed.sizes(), ": ", packed.size(1),
                    " bytes a row, needs ceil(K/4) = ", need_p, " for K=", K, " (x has shape ", x.sizes(), ")");
  TERNARY_CHECK_ARG(prefix, scale.size(0) == N && scale.size(1) >= need_s, "scale has shape ", scale.sizes(),
                    ", needs [N=", N, ", >= ", need_s, "] for K=", K, ", block_size=", block_size, ", k_offset=",
                    k_offset);
  if (bias) {
    TERNARY_CHECK_ARG(prefix, bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == N &&
                                  bias->scalar_type() == dt,
                      "bias must be a CPU tensor [N=", N, "] in x's dtype ", dt, ", got ", bias->scalar_type(),
                      " of shape ", bias->sizes());
  }
}

#define CHECK_ARG(cond, ...) TERNARY_CHECK_ARG(kGemmPrefix, cond, __VA_ARGS__)

// TERNARY_CPU_ISA (read once per process): "auto" (or unset) takes the best this CPU has,
// "avx2" the AVX2 code on a CPU that also has AVX-512 (to test it, or to compare), "avx512_bf16"
// insists on AVX-512 ("" where the CPU lacks it). It caps both kernels alike (capped_isa).
std::string requested_isa() {
  static const std::string req = env_choice("TERNARY_CPU_ISA", {"auto", "avx512_bf16", "avx2"});
  return req;
}

// A kernel's code as TERNARY_CPU_ISA allows: its AVX-512 code (`wide_name`) where the CPU has
// what that needs (`wide`), else its AVX2 code where it has AVX2, "" where neither may run.
std::string capped_isa(bool wide, const char* wide_name) {
  static const bool avx2 = cpu_avx2_supported();
  const std::string req = requested_isa();
  if (wide && req != "avx2") return wide_name;
  if (avx2 && req != "avx512_bf16") return "avx2";
  return "";
}

// The instruction set the CPU kernel runs with on this machine, "" where it cannot run. Decided
// once (its inputs are read once per process): the op asks on every call.
const std::string& kernel_isa() {
  static const std::string isa = capped_isa(cpu_supported(), "avx512_bf16");
  return isa;
}

// The tile kernel bf16 x of M rows takes, "" where it takes none (M in the small-M regime, or the
// AVX2 code, which runs bf16 x as fp32): what gemm_cpu runs and cpu_bf16_tile_kernel reports.
std::string bf16_tile(int64_t M) {
  const std::string kernel = bf16_tile_kernel(M);  // checks TERNARY_CPU_BF16_TILE everywhere
  return kernel_isa() == "avx512_bf16" && M > small_m_max(true, false) ? kernel : std::string();
}

// x [M, K] as a zero-padded copy [M, kc] in `dtype` (K in whole chunks: the kernels read x a
// chunk at a time; fp16 x widened exactly to fp32).
torch::Tensor padded_x(const torch::Tensor& x, int64_t kc, at::ScalarType dtype) {
  const auto xin = torch::zeros({x.size(0), kc}, x.options().dtype(dtype));
  xin.narrow(1, 0, x.size(1)).copy_(x);
  return xin;
}

// TERNARY_CPU_POISON=1 (read once per process): the output buffers the kernels fill start as
// NaN, so a test sees any element they fail to write (tests/test_kernel_cpu*.py).
bool poison_outputs() {
  static const bool on = env_int("TERNARY_CPU_POISON", 0) != 0;
  return on;
}

// Rows a tile of the tile kernels (bf16 pair-major, W2A8) for N rows: at most `fit` (what fits
// the kernel's tile bytes), in
// multiples of `multiple` (the register block), >= one tile a thread, and as many tiles as fit
// rounded up to a multiple of the threads (at::parallel_for gives each thread a contiguous run:
// 3 tiles on 2 threads left one thread a third of the work).
int64_t balanced_tile_rows(int64_t N, int64_t fit, int64_t threads, int64_t multiple) {
  const int64_t want = ((N + fit - 1) / fit + threads - 1) / threads * threads;
  return ((N + want - 1) / want + multiple - 1) / multiple * multiple;
}

// Per-call overhead. In vLLM-CPU a MiniLM layer's GEMM at M 16-32 takes 15-70 us, and every
// ATen op the op ran around its kernel (torch::zeros for the tail copy and a padded x,
// bias.to(float), narrow + copy_, torch::empty for each thread's tile) cost ~1-2 us through the
// dispatcher and allocator: ~8 us a call until 2026-12-05 (a 64 x 128 call at M 16: 13.2 us,
// now 5.1; 24 calls a MiniLM forward; docs/kernel.md, CPU, "Per-call overhead"). So the small
// buffers below live in per-thread scratch that is reused across calls, x is read in place where
// it needs no padding, and the weights' tail copy and an fp32 bias are plain memory.

// Scratch buffers of a thread, one per use (a slot), each kept for its next call: grown to the
// largest request and never shrunk, so a thread holds at most its largest tile, C block, bias
// and tail (each bounded by the tile constants above or by N / ldp) and, below kScratchMaxBytes
// each, the W2A8 op's x buffers (call_buffer); never y.
enum ScratchSlot {
  // a worker's: its decoded tile, the tile's scales, a brgemm call's C (the AVX2 lookups: their
  // tables, the x tile, the rows' sums)
  kSlotTile, kSlotTileScales, kSlotC,
  kSlotBias, kSlotTail,                // the caller's: bias in fp32, the packed rows' tail copy
  kSlotX, kSlotXScales, kSlotXSums,    // the caller's, W2A8: x quantized (or by entries), sx, negsum
  kSlotRowData,                        // the caller's, W2A8 on AMX: each W row's correction and scale
  kSlotCount
};

// `bytes` of 64-byte aligned memory, this thread's slot `slot`: valid until this thread asks for
// the same slot again. A call's worker threads each use their own; the calling thread is one of
// them, hence the separate slots for what the caller fills (bias, tail) and what workers do.
void* scratch(ScratchSlot slot, int64_t bytes) {
  struct Buffer {
    void* p = nullptr;
    int64_t n = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buffers[kSlotCount];
  Buffer& b = buffers[slot];
  if (b.n < bytes) {
    std::free(b.p);
    b.n = (std::max<int64_t>(bytes, 64) + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
    b.p = std::aligned_alloc(64, static_cast<size_t>(b.n));
    TORCH_CHECK(b.p != nullptr, "ternary_serve (CPU): cannot allocate ", b.n, " bytes of scratch");
  }
  return b.p;
}
template <typename T>
T* scratch(ScratchSlot slot, int64_t count) {
  return static_cast<T*>(scratch(slot, count * static_cast<int64_t>(sizeof(T))));
}

// `count` T of 64-byte aligned memory for one call, sized by M (x's copies): this thread's slot
// where that is at most kScratchMaxBytes, else a fresh tensor that `hold` keeps alive (no
// thread keeps a large M's buffers).
constexpr int64_t kScratchMaxBytes = 1024 * 1024;
template <typename T>
T* call_buffer(ScratchSlot slot, int64_t count, torch::Tensor& hold) {
  const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
  if (bytes <= kScratchMaxBytes) return scratch<T>(slot, count);
  hold = torch::empty({bytes}, torch::kByte);  // torch's CPU allocator aligns to 64 bytes
  return reinterpret_cast<T*>(hold.data_ptr<uint8_t>());
}

// bias ([N] in x's dtype, contiguous or not) as fp32, exactly (bf16 and fp16 widen exactly):
// its own storage where it is fp32 and contiguous, else this thread's kSlotBias. nullptr: none.
const float* bias_f32(const std::optional<torch::Tensor>& bias) {
  if (!bias) return nullptr;
  const torch::Tensor& b = *bias;
  if (b.scalar_type() == at::kFloat && b.is_contiguous()) return b.data_ptr<float>();
  const int64_t n = b.size(0), stride = b.stride(0);
  float* out = scratch<float>(kSlotBias, n);
  if (b.scalar_type() == at::kBFloat16) {
    const auto* v = b.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i * stride]);
  } else if (b.scalar_type() == at::kHalf) {
    const auto* v = b.data_ptr<at::Half>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i * stride]);
  } else {
    const auto* v = b.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) out[i] = v[i * stride];
  }
  return out;
}

// make_vnni_plan(K, kc, block_size, k_offset), built once per thread and shape: a model has a few
// layer shapes, and building its two vectors of kc / 2 was ~5 % of a small call. A bounded cache
// (cleared past 64 shapes); the reference is valid until this thread's next lookup.
const VnniPlan& vnni_plan(int64_t K, int64_t kc, int64_t block_size, int64_t k_offset) {
  thread_local std::map<std::array<int64_t, 4>, VnniPlan> plans;
  const std::array<int64_t, 4> key{K, kc, block_size, k_offset};
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= 64) plans.clear();
    it = plans.emplace(key, make_vnni_plan(K, kc, block_size, k_offset)).first;
  }
  return it->second;
}

// x itself where the kernels can read it in place ([M, kc] in `dtype`: contiguous, of that dtype,
// K already whole chunks), else the zero-padded copy padded_x makes.
torch::Tensor x_as(const torch::Tensor& x, int64_t kc, at::ScalarType dtype) {
  return x.scalar_type() == dtype && x.size(1) == kc && x.is_contiguous() ? x : padded_x(x, kc, dtype);
}

#ifdef TERNARY_CPU_KERNELS
// W rows a brgemm tile holds (a multiple of kVnniCols, before balanced_tile_rows evens them out):
// those of tile_bytes, but at least kBrgemmMinTileRows within twice tile_bytes: every tile streams
// all of x past its rows, so at large K (Qwen3-0.6B down, K 3072) 64-row tiles read x from L3 twice
// as often as 128-row ones (docs/kernel.md, "AMX").
constexpr int64_t kBrgemmMinTileRows = 128;
int64_t brgemm_tile_rows(int64_t row_bytes, int64_t tile_bytes) {
  const int64_t rows = std::max(tile_bytes / row_bytes, std::min(kBrgemmMinTileRows, 2 * tile_bytes / row_bytes));
  return std::max(kVnniCols, rows / kVnniCols * kVnniCols);
}

// The K of one brgemm call (brgemm_tiles), a multiple of 64: K in near-equal slices of about
// kBrgemmKSliceBytes of A a row (256 bf16), or all of K where it is at most twice that (K <= 512
// bf16: MiniLM's 384 ran faster in one call than in two).
constexpr int64_t kBrgemmKSliceBytes = 512;
int64_t brgemm_k_slice(int64_t kc, int64_t elem_bytes) {
  const int64_t slice = kBrgemmKSliceBytes / elem_bytes;
  if (kc * elem_bytes <= 2 * kBrgemmKSliceBytes) return kc;
  const int64_t slices = (kc + slice - 1) / slice;
  return (kc / slices + 63) / 64 * 64;
}

// The tile driver of both kernels on oneDNN's batch-reduce GEMM (at::native::cpublas::brgemm:
// AMX tiles where the CPU has them): gemm_cpu's brgemm tile (bf16 x: A bf16, B bf16, C fp32) and
// gemm_w2a8_cpu's AMX kernel (A u8, B s8, C int32). W rows in tiles a thread decodes at once
// (brgemm_tile_rows): decode(n0, n1, tile) writes rows [n0, n1) as the VNNI B matrices, kVnniCols
// rows each (a group). Then x (a: [M, kc], lda kc) kBrgemmRows rows at a time (a chunk); per chunk
// the tile's groups kBrgemmPanelCols columns at a time (a panel); per panel K in slices
// (brgemm_k_slice), and per slice every group of the panel in one brgemm call (mt x kVnniCols x
// slice) into the panel's C [mt, ldc], add_C past the first slice; then store(c, ldc, mt, m0, p0,
// cols) takes the panel's C to y rows [m0, m0 + mt), columns [p0, p0 + cols).
//
//   for chunk (128 x rows): for panel (<= 4 groups): for slice (~256 of K): for group in panel:
//       C[:, group] (+)= x[chunk, slice] . B[group][slice]
//   store(C)
//
// A C element's sums run in K order either way (add_C reloads the fp32 / int32 sums into the
// tiles): the outputs are bit for bit those of one call over all of K (checked on the test shapes,
// bf16 and W2A8, by benchmarks/probes/cpu_brgemm_outputs.py). Slices, because a call over all of K
// holds more than L1 (B is K x 64, 128 KB at K 1024) and AMX then waits on L2; a 256-wide slice
// keeps a call's B (32 KB) near L1 and the chunk's slice of A in L1 / L2 across the panel
// (docs/kernel.md, "AMX", has the measurements and what else was tried).
template <typename B, typename C, typename A, typename Decode, typename Store>
void brgemm_tiles(int64_t M, int64_t N, int64_t kc, const A* a, int64_t tile_bytes, Decode decode, Store store,
                  int64_t k_slice = 0) {
  const int64_t threads = at::get_num_threads();
  const int64_t rows = balanced_tile_rows(N, brgemm_tile_rows(kc * static_cast<int64_t>(sizeof(B)), tile_bytes),
                                          threads, kVnniCols);
  const int64_t tiles = (N + rows - 1) / rows;
  const int64_t ks = k_slice > 0 ? k_slice : brgemm_k_slice(kc, sizeof(A));  // k_slice: cpu_force_bf16_tile's
  const int64_t panel = std::min(rows, kBrgemmPanelCols);
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    // this thread's B matrices: [rows / kVnniCols, kc / v, kVnniCols, v], v = 4 / sizeof(B) (VNNI:
    // a dword of each row a column group); scratch, 64-byte aligned as oneDNN's loads like it
    B* tile = scratch<B>(kSlotTile, rows * kc);
    C* c = scratch<C>(kSlotC, kBrgemmRows * panel);  // a panel's C [kBrgemmRows, ldc <= panel]
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * rows, n1 = std::min(N, n0 + rows);
      decode(n0, n1, tile);
      for (int64_t m0 = 0; m0 < M; m0 += kBrgemmRows) {
        const int64_t mt = std::min(kBrgemmRows, M - m0);
        for (int64_t p0 = n0; p0 < n1; p0 += panel) {
          const int64_t p1 = std::min(n1, p0 + panel);
          const int64_t ldc = (p1 - p0 + kVnniCols - 1) / kVnniCols * kVnniCols;  // the panel's groups
          for (int64_t k0 = 0; k0 < kc; k0 += ks)
            for (int64_t n = p0; n < p1; n += kVnniCols)  // B of group n, K from k0: [K/v, kVnniCols, v] at k0 / v
              at::native::cpublas::brgemm(mt, kVnniCols, std::min(ks, kc - k0), kc, kVnniCols, ldc, k0 > 0,
                                          a + m0 * kc + k0, tile + (n - n0) * kc + k0 * kVnniCols, c + (n - p0), true);
          store(c, ldc, mt, m0, p0, p1 - p0);
        }
      }
    }
    at::native::cpublas::brgemm_release(true);
  });
}

// The K-slice kernel's slice for M rows of x: the slice of A all of M reads (M x slice bf16)
// about kKSliceABytes, at least kKSliceMin and at most kKSliceMax columns, K in near-equal slices
// of a multiple of 64. Small M wants long slices: a brgemm call and a decode call each have a
// fixed cost, and at M 16-32 slices of 256 (the 32 KB a group that L1 holds) ran 0.86-0.98x the
// brgemm tile, those of 1024-2048 1.08-1.22x; at M 128, 512 beat 1024 by 2-5 % (Qwen3-0.6B layers,
// benchmarks/results/cpu-kslice.md).
constexpr int64_t kKSliceABytes = 128 * 1024, kKSliceMin = 256, kKSliceMax = 2048;
int64_t kslice_k(int64_t M, int64_t kc) {
  const int64_t want = std::clamp<int64_t>(kKSliceABytes / (2 * M) / 64 * 64, kKSliceMin, kKSliceMax);
  if (kc <= want) return kc;
  const int64_t slices = (kc + want - 1) / want;
  return (kc / slices + 63) / 64 * 64;
}

// The K-slice variant of brgemm_tiles (bf16 x; TERNARY_CPU_BF16_TILE=brgemm_kslice): instead of a
// tile of W rows x all of K decoded at once and then multiplied, one group (kVnniCols rows) x one
// K slice (kslice_k) at a time is decoded into a small buffer and multiplied at once by every x
// row, add_C into the panel's fp32 C [M, ldc], which holds all of M; the next group's codes are
// prefetched while the brgemm runs:
//
//   for panel (<= kBrgemmPanelCols rows): for slice: for group in panel:
//       decode B[group][slice]; prefetch the next; for chunk (128 x rows): C[chunk, group] (+)= x[chunk, slice] . B
//   store(C)
//
// Every W element decoded once, as the tile's; the bf16 W values and each C element's K order
// are the tile kernel's (slices of the same K; add_C reloads the fp32 sums), so the outputs are
// bit for bit the tile's (tests/test_kernel_cpu.py checks). Issue #23 proposed it to keep the
// decoded W in L1 (slices of 256: 32 KB a group); measured, that alone did not win (0.86-0.98x the
// tile at M 16-32, 0.95-1.07x at M 64-128, 0.80-1.04x at 512): what wins at small M is the long
// slices kslice_k gives there, fewer brgemm and decode calls, and the prefetch
// (benchmarks/results/cpu-kslice.md).
template <typename Decode, typename Prefetch, typename Store>
void brgemm_kslice_tiles(int64_t M, int64_t N, int64_t kc, const at::BFloat16* a, Decode decode, Prefetch prefetch,
                         Store store) {
  const int64_t threads = at::get_num_threads();
  const int64_t rows = balanced_tile_rows(N, kBrgemmPanelCols, threads, kVnniCols);
  const int64_t tiles = (N + rows - 1) / rows;
  const int64_t ks = forced_k_slice() > 0 ? forced_k_slice() : kslice_k(M, kc);
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    at::BFloat16* buf = scratch<at::BFloat16>(kSlotTile, kVnniCols * ks);  // [ks / 2, kVnniCols, 2]
    float* c = scratch<float>(kSlotC, M * rows);                             // [M, ldc <= rows]
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * rows, n1 = std::min(N, n0 + rows);
      const int64_t ldc = (n1 - n0 + kVnniCols - 1) / kVnniCols * kVnniCols;
      for (int64_t k0 = 0; k0 < kc; k0 += ks) {
        const int64_t kk = std::min(ks, kc - k0);
        for (int64_t n = n0; n < n1; n += kVnniCols) {
          decode(n, std::min(n1, n + kVnniCols), k0, k0 + kk, buf);
          // the next group's codes of this slice (or the first group's of the next) into L1 while
          // the brgemm runs: the decode's gathers wait on them otherwise
          if (n + kVnniCols < n1) prefetch(n + kVnniCols, std::min(n1, n + 2 * kVnniCols), k0, k0 + kk);
          else if (k0 + ks < kc) prefetch(n0, std::min(n1, n0 + kVnniCols), k0 + ks, std::min(kc, k0 + 2 * ks));
          for (int64_t m0 = 0; m0 < M; m0 += kBrgemmRows)
            at::native::cpublas::brgemm(std::min(kBrgemmRows, M - m0), kVnniCols, kk, kc, kVnniCols, ldc, k0 > 0,
                                        a + m0 * kc + k0, buf, c + m0 * ldc + (n - n0), true);
        }
      }
      for (int64_t m0 = 0; m0 < M; m0 += kBrgemmRows)
        store(c + m0 * ldc, ldc, std::min(kBrgemmRows, M - m0), m0, n0, n1 - n0);
    }
    at::native::cpublas::brgemm_release(true);
  });
}
#endif

torch::Tensor gemm_cpu(const torch::Tensor& x,                  // [M, K] fp32 / bf16 / fp16
                       const torch::Tensor& packed_in,          // [N, ldp] uint8, ldp >= ceil(K/4)
                       const torch::Tensor& scale_in,           // [N, lds] fp16
                       const std::optional<torch::Tensor>& bias,  // [N] x.dtype, or None
                       int64_t block_size, int64_t k_offset, bool /*pdl: a CUDA launch option*/) {
  const std::string& isa = kernel_isa();
  CHECK_ARG(!isa.empty(), "this CPU lacks both the AVX-512 (f, bw, vl, dq, vbmi, bf16) and the AVX2 (with fma, f16c) ",
            "the kernel needs (or is not x86-64; TERNARY_CPU_ISA=", requested_isa(), "); ",
            "use ternary_plugin.ops.ternary_linear, which takes the reference path here");
  CHECK_ARG(x.device().is_cpu() && packed_in.device().is_cpu() && scale_in.device().is_cpu(),
            "x, packed and scale must be CPU tensors");
  CHECK_ARG(x.dim() == 2, "x must be 2-D [M, K], got shape ", x.sizes());
  const auto dt = x.scalar_type();
  CHECK_ARG(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, "x must be float32, bfloat16 or float16, got ",
            dt);
  check_weights(kGemmPrefix, x, packed_in, scale_in, bias, block_size, k_offset);
  const int64_t M = x.size(0), K = x.size(1), N = packed_in.size(0);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return bias ? y.copy_(bias->unsqueeze(0).expand({M, N})) : y.zero_();
  if (poison_outputs()) y.fill_(std::numeric_limits<float>::quiet_NaN());
#ifdef TERNARY_CPU_KERNELS
  const torch::Tensor packed = packed_in.contiguous(), scale = scale_in.contiguous();
  const int64_t ldp = packed.size(1);
  // The last rows, zero-padded by 8 bytes: a chunk may read 7 bytes past a row (Problem::row),
  // which for rows of fewer than 8 bytes (K <= 28) reaches past the next row too: every row whose
  // reads could end past the tensor, 1 + 7 / ldp of them, is read from this copy
  const int64_t tail_rows = std::min<int64_t>(N, 1 + 7 / std::max<int64_t>(ldp, 1));
  uint8_t* tail = scratch<uint8_t>(kSlotTail, tail_rows * ldp + 8);  // [tail_rows * ldp + 8]
  std::memcpy(tail, packed.data_ptr<uint8_t>() + (N - tail_rows) * ldp, tail_rows * ldp);
  std::memset(tail + tail_rows * ldp, 0, 8);
  // On AVX2, x runs in fp32 in both regimes (no bf16 dot product there): bf16 takes fp32's rules
  const bool avx2 = isa == "avx2", bf16 = dt == at::kBFloat16 && !avx2;
  const int64_t kc = (K + kChunk - 1) / kChunk * kChunk;  // K in whole chunks: the padded buffers' rows
  const bool small = M <= small_m_max(bf16, avx2);
  const std::string tile_kernel = bf16 && !small ? bf16_tile(M) : std::string();
  // the segmentation of K: what the small-M kernels and the dequantizing tiles read (the VNNI and
  // pair-major tiles and the AVX2 lookups have their own plans)
  const bool pair = tile_kernel == "pair" && k_offset % 2 == 0 && block_size % 2 == 0;
  const bool vnni = tile_kernel == "brgemm" || tile_kernel == "brgemm_kslice";
  const bool lut = avx2 && !small && avx2_gemm() == "lut";
  const Plan plan = small || (!vnni && !pair && !lut) ? make_plan(K, block_size, k_offset) : Plan();
  const Problem p{M,
                  N,
                  K,
                  packed.data_ptr<uint8_t>(),
                  ldp,
                  reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>()),
                  scale.size(1),
                  bias_f32(bias),
                  &plan,
                  tail,
                  N - tail_rows};

  if (small) {
    const auto xin = x_as(x, kc, bf16 ? at::kBFloat16 : at::kFloat);  // [M, kc] bf16 / fp32
    const auto yf = dt == at::kFloat ? y : torch::empty({M, N}, x.options().dtype(at::kFloat));  // [M, N] fp32
    at::parallel_for(0, (N + kRows - 1) / kRows, 1, [&](int64_t t0, int64_t t1) {
      if (avx2) {
        small_m_avx2(p, xin.data_ptr<float>(), kc, yf.data_ptr<float>(), t0, t1);
      } else if (bf16) {
        small_m_bf16(p, reinterpret_cast<const uint16_t*>(xin.data_ptr<at::BFloat16>()), kc, yf.data_ptr<float>(), t0,
                     t1);
      } else {
        small_m_f32(p, xin.data_ptr<float>(), kc, yf.data_ptr<float>(), t0, t1);
      }
    });
    if (dt != at::kFloat) y.copy_(yf);
    return y;
  }

  if (vnni) {  // brgemm's VNNI tiles: the whole tile at once, or its K-slice variant
    const auto xin = x_as(x, kc, at::kBFloat16);  // [M, kc]: the brgemm's A (lda kc)
    const VnniPlan& vplan = vnni_plan(K, kc, block_size, k_offset);
    auto* yb = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
    // y past the caches is written with streaming stores (kBrgemmStreamYBytes)
    const bool stream = M * N * 2 >= kBrgemmStreamYBytes;
    const auto store = [&](const float* c, int64_t ldc, int64_t mt, int64_t m0, int64_t n, int64_t cols) {
      store_rows_bf16(c, ldc, mt, cols, p.bias ? p.bias + n : nullptr, yb + m0 * N + n, N, stream);
    };
    if (tile_kernel == "brgemm_kslice") {
      brgemm_kslice_tiles(
          M, N, kc, xin.data_ptr<at::BFloat16>(),
          [&](int64_t n0, int64_t n1, int64_t k0, int64_t k1, at::BFloat16* buf) {
            vnni_rows_bf16(p, vplan, kc, n0, n1, reinterpret_cast<uint16_t*>(buf), k0, k1);
          },
          [&](int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
            if (!kslice_prefetch()) return;
            const int64_t b0 = k0 / 4, b1 = std::min(ldp, (k1 + 3) / 4);  // the rows' bytes [b0, b1)
            for (int64_t n = n0; n < n1; ++n) {
              const char* row = reinterpret_cast<const char*>(p.row(n));
              for (int64_t b = b0 & ~int64_t{63}; b < b1; b += 64) asm volatile("prefetcht0 %0" : : "m"(row[b]));
            }
          },
          store);
    } else {
      brgemm_tiles<at::BFloat16, float>(
          M, N, kc, xin.data_ptr<at::BFloat16>(), kBrgemmTileBytes,
          [&](int64_t n0, int64_t n1, at::BFloat16* tile) {
            vnni_rows_bf16(p, vplan, kc, n0, n1, reinterpret_cast<uint16_t*>(tile));
          },
          store, forced_k_slice());
    }
    return y;
  }

  if (pair) {  // pair-major: no scale block cuts a pair
    const auto xin = x_as(x, kc, at::kBFloat16);  // [M, kc]
    const PairPlan pplan = make_pair_plan(K, block_size, k_offset);
    const int64_t S = static_cast<int64_t>(pplan.segments.size());
    const auto* xb = reinterpret_cast<const uint16_t*>(xin.data_ptr<at::BFloat16>());
    auto* yb = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
    const int64_t threads = at::get_num_threads();
    const int64_t rows = balanced_tile_rows(N, std::max<int64_t>(32, kPairTileBytes / (kc * 2) / 32 * 32), threads, 32);
    const int64_t tiles = (N + rows - 1) / rows;
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      // 64-byte aligned (zmm stores of the pair vectors): scratch is
      uint16_t* tile = scratch<uint16_t>(kSlotTile, rows * kc);         // [rows / 16, kc / 2, 16, 2] bf16
      float* ws = scratch<float>(kSlotTileScales, rows / 16 * S * 16);  // [rows / 16, S, 16]: the tile's scales
      for (int64_t t = t0; t < t1; ++t)
        pair_rows_bf16(p, pplan, xb, kc, t * rows, std::min(N, (t + 1) * rows), tile, ws, yb);
    });
    return y;
  }

  if (lut) {
    const W8Plan lplan = make_w8_plan(K, block_size, k_offset, kLutWidth);
    const int64_t tiles = (M + 15) / 16;
    const auto xf = x.to(at::kFloat).contiguous();  // [M, K]
    const auto yf = dt == at::kFloat ? y : torch::empty({M, N}, x.options().dtype(at::kFloat));  // [M, N] fp32
    // A work item: one x tile over W rows [n0, n0 + span). N is split only where the tiles are
    // fewer than the threads: each item builds its tables once per entry, for all its rows.
    const int64_t threads = at::get_num_threads();
    const int64_t splits = std::min<int64_t>((threads + tiles - 1) / tiles, (N + 15) / 16);
    const int64_t span = (N + splits - 1) / splits;
    at::parallel_for(0, tiles * splits, 1, [&](int64_t i0, int64_t i1) {
      float* tab = scratch<float>(kSlotTile, lut_table_floats());  // this thread's tables
      float* acc = scratch<float>(kSlotC, span * 16);              // [span, 16] its rows' sums
      float* xt = scratch<float>(kSlotTileScales, kc * 16);        // [kc, 16] its x tile, transposed
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / splits, n0 = i % splits * span, n1 = std::min(N, n0 + span);
        if (n0 < n1)
          lut_rows_avx2(p, lplan, xf.data_ptr<float>() + 16 * t * K, K, std::min<int64_t>(16, M - 16 * t), n0, n1, xt,
                        tab, acc, yf.data_ptr<float>() + 16 * t * N);
      }
    });
    if (dt != at::kFloat) y.copy_(yf);
    return y;
  }

  // fp16 x multiplies in fp32: oneDNN's fp16 GEMM wants AVX512-FP16, and bf16 would round x.
  // So does bf16 x on AVX2. `widen`: x, y and bias in fp32 around the GEMM.
  const auto cdt = bf16 ? at::kBFloat16 : at::kFloat;
  const bool widen = dt != at::kFloat && cdt == at::kFloat;
  // The AVX2 code's own GEMM (`dot`) reads x zero-padded to kc columns in fp32 (xd), the whole
  // tile row and p.bias; at::mm_out reads x in the GEMM's dtype (xc), the tile's first K columns
  // and bias as a tensor (bc).
  const bool dot = avx2 && avx2_gemm() == "dot";
  const torch::Tensor xd = dot ? x_as(x, kc, at::kFloat) : torch::Tensor();                   // [M, kc]
  const torch::Tensor xc = dot ? torch::Tensor() : x.to(cdt);                                  // [M, K]
  const torch::Tensor yc = widen ? torch::empty({M, N}, x.options().dtype(at::kFloat)) : y;     // [M, N]
  const torch::Tensor bc = bias && !dot ? (widen ? bias->to(at::kFloat) : *bias) : torch::Tensor();  // [N]
  // Tiles spread over the threads, each thread dequantizing its own tile and running its GEMM
  // single-threaded (OpenMP does not nest): one dequantize + GEMM pair a tile, no barrier
  // between them. Threading each GEMM instead, tile after tile, made 2 threads slower than 1
  // (MiniLM up M 64 bf16: 0.77 vs 0.47 ms; Qwen3 down M 64: 4.0 vs 3.0 ms).
  const int64_t threads = at::get_num_threads();
  const int64_t esize = bf16 ? 2 : 4;  // bytes of a tile element (cdt)
  const int64_t fit = std::max<int64_t>(64, kTileBytes / (kc * esize) / 64 * 64);
  const int64_t rows = std::min(fit, ((N + threads - 1) / threads + 15) / 16 * 16);  // >= `threads` tiles
  const int64_t tiles = (N + rows - 1) / rows;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    // the worker threads start with fresh dispatch state: this is inference below autograd
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    void* buf = scratch(kSlotTile, rows * kc * esize);
    const auto tile = torch::from_blob(buf, {rows, kc}, x.options().dtype(cdt));  // [rows, kc], this thread's
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * rows, nt = std::min(rows, N - n0);
      if (avx2) {
        dequantize_rows_f32_avx2(p, n0, nt, static_cast<float*>(buf), kc);
      } else if (bf16) {
        dequantize_rows_bf16(p, n0, nt, static_cast<uint16_t*>(buf), kc);
      } else {
        dequantize_rows_f32(p, n0, nt, static_cast<float*>(buf), kc);
      }
      if (dot) {
        float* tf = static_cast<float*>(buf);
        if (K < kc)  // the decode writes columns < K only; x is zero past K, the tile must not be NaN there
          for (int64_t r = 0; r < nt; ++r) std::memset(tf + r * kc + K, 0, (kc - K) * sizeof(float));
        tile_gemm_f32_avx2(xd.data_ptr<float>(), kc, M, tf, kc, nt, kc, p.bias ? p.bias + n0 : nullptr,
                           yc.data_ptr<float>() + n0, N);
        continue;
      }
      const torch::Tensor w = tile.narrow(0, 0, nt).narrow(1, 0, K);  // [nt, K], row stride kc
      auto out = yc.narrow(1, n0, nt);                                 // [M, nt], row stride N
      if (bias) at::addmm_out(out, bc.narrow(0, n0, nt), xc, w.t());
      else at::mm_out(out, xc, w.t());
    }
  });
  if (widen) y.copy_(yc);
  return y;
#else
  CHECK_ARG(false, "the CPU kernel is built for x86-64 only");
  return y;
#endif
}

// ---- gemm_w2a8 and quantize_int8 (the W2A8 mode; kernel: ternary_cpu_w2a8.cpp) --------------

#define CHECK_W8(cond, ...) TERNARY_CHECK_ARG(kW8Prefix, cond, __VA_ARGS__)

// "avx512_vnni" or "avx2": the W2A8 kernel's code this CPU runs (TERNARY_CPU_ISA caps it as it
// caps the bf16 kernel's: "avx2" runs the AVX2 code on a VNNI CPU too), "" where it runs none.
const std::string& w2a8_isa() {
  static const std::string isa = capped_isa(cpu_w2a8_supported(), "avx512_vnni");
  return isa;
}

// Largest M of the W2A8 small-M regime (codes decoded in registers, once per 2 x rows); past
// it the tile regime (decoded once into a u8 tile, every x row run over it). Measured on the
// 2-core AMD EPYC (Zen 4, shared, 1 thread; see docs/kernel.md "W2A8 on CPU"), Qwen3-0.6B
// gate_up / down and MiniLM up, ms, decode / tile: M 1 0.32 / 0.39, 0.16 / 0.18, 0.05 / 0.03; M 2
// 0.28 / 0.37, 0.15 / 0.15, 0.06 / 0.03; M 3 0.49 / 0.30, 0.29 / 0.21, 0.08 / 0.04 (noisy).
// The AVX2 code on Zen 3 (its 16-row k-step tile, 1 thread), the same layers: M 1 0.21 / 0.32,
// 0.11 / 0.17, 0.030 / 0.036; M 2 0.37 / 0.37, 0.20 / 0.20, 0.049 / 0.041; M 3 0.40-0.43 / 0.40.
// TERNARY_CPU_W2A8_SMALL_M_MAX (read once per process) overrides it.
constexpr int64_t kW8SmallMMax = 2;
// The u8 tile a thread decodes: about a quarter of Zen 4's 1 MB L2, leaving room for x's rows.
constexpr int64_t kW8TileBytes = 256 * 1024;

// The AMX kernel (w2a8_kernel): its smallest M. Below it the exact kernel is faster: it decodes
// in registers (M <= 2) or into its u8 tile without folding, where the AMX kernel's decode
// (~0.4 ms for Qwen3-0.6B gate_up) is most of its time. Measured on the 2-core Xeon with AMX,
// 1 thread, ms exact / AMX, M 4 / 8 / 12: gate_up 0.35 / 0.41, 0.48 / 0.41, 0.56 / 0.41; qkv
// 0.22 / 0.30, 0.31 / 0.31, 0.36 / 0.34; o 0.11 / 0.18, 0.16 / 0.14, 0.21 / 0.14; down 0.18 /
// 0.23, 0.23 / 0.21, 0.30 / 0.21; MiniLM down 0.036 / 0.058, 0.052 / 0.053, 0.065 / 0.057.
constexpr int64_t kW8AmxMinM = 8;
// The int8 W rows a thread decodes at once, in bytes: 1 MB beat 512 KB by ~5 % at M 2048 on
// Qwen3-0.6B down and gate_up (1 thread), measured before brgemm_tiles' K slices, not since.
constexpr int64_t kW8AmxTileBytes = 1024 * 1024;

int64_t w8_small_m_max() {
  static const int64_t forced = env_int("TERNARY_CPU_W2A8_SMALL_M_MAX", -1);
  return forced >= 0 ? forced : kW8SmallMMax;
}

// The W2A8 kernel for M rows of x: "amx" (AMX-INT8 through oneDNN's u8 x s8 brgemm, block scales
// folded into the int8 weights: gemm_w2a8_cpu) where the CPU has AMX-INT8, Linux lets this
// process use it and oneDNN is enabled, from kW8AmxMinM rows; else w2a8_isa()'s kernel (block
// scales exact: codes decoded in registers up to w8_small_m_max, then the u8 tile), "" none.
// TERNARY_CPU_W2A8_KERNEL=auto|exact|amx (read once per process) forces one; amx where the CPU
// cannot run it is an error that says so.
std::string w2a8_kernel(int64_t M) {
  static const std::string req = env_choice("TERNARY_CPU_W2A8_KERNEL", {"auto", "exact", "amx"});
  const std::string& isa = w2a8_isa();
  static const bool amx = isa == "avx512_vnni" && cpu_amx_int8_supported() && at::cpu::init_amx();
  if (isa.empty() || req == "exact") return isa;
  if (req == "amx") {
    TORCH_CHECK(amx, "TERNARY_CPU_W2A8_KERNEL=amx: this CPU (or TERNARY_CPU_ISA=", requested_isa(),
                ") cannot run the AMX kernel: it needs AMX-TILE, AMX-INT8 and AVX512-VNNI, and Linux's "
                "permission for AMX (at::cpu::init_amx)");
    return "amx";
  }
  return amx && at::globalContext().userEnabledMkldnn() && M >= kW8AmxMinM ? "amx" : isa;
}

void check_w8_x(const torch::Tensor& x, const char* op) {
  CHECK_W8(x.device().is_cpu(), op, ": x must be a CPU tensor");
  CHECK_W8(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", x.sizes());
  const auto dt = x.scalar_type();
  CHECK_W8(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op, ": x must be float32, bfloat16 or ",
           "float16, got ", dt);
}

#ifdef TERNARY_CPU_KERNELS
// x [M, K] (contiguous, fp32 / bf16 / fp16) -> sx [M] fp32 and either xq [M, K] int8 (q) or,
// with a plan, xq by entries (xe [M, E, width], negsum [M, S]): one parallel region, each row
// widened and quantized in this thread's scratch. One region, not a chain of ATen ops (x.to,
// zeros, ...) each its own: on the shared 2-core machine every region waits whenever another
// process holds a core, and the chain made 2-thread calls 3-6x slower than torch's matmul.
//   vnni: the AVX512-VNNI code's row functions, else the AVX2 code's
void quantize_rows(const torch::Tensor& x, bool vnni, float* sx, int8_t* q, const W8Plan* plan, int8_t* xe,
                   int32_t* negsum) {
  const auto widen = vnni ? w8_widen_row : w8_widen_row_avx2;
  const auto quantize = vnni ? w8_quantize_row : w8_quantize_row_avx2;
  const auto entries = vnni ? w8_entries_row : w8_entries_row_avx2;
  const int64_t M = x.size(0), K = x.size(1), esz = x.element_size();
  const int kind = x.scalar_type() == at::kFloat ? 0 : x.scalar_type() == at::kBFloat16 ? 1 : 2;
  const char* xp = static_cast<const char*>(x.data_ptr());
  const int64_t ldq = (K + kW8Chunk - 1) / kW8Chunk * kW8Chunk;  // w8_entries_row reads whole chunks
  // threads only past ~256K elements (~0.2 ms on one Zen 4 core): below that a region's wake-up
  // and its wait for a shared core cost more than the work
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 18) / std::max<int64_t>(K, 1));
  at::parallel_for(0, M, grain, [&](int64_t m0, int64_t m1) {
    std::vector<float> xf(K);
    std::vector<int8_t> qrow(plan ? ldq : 0, 0);  // zero past K: w8_quantize_row writes [0, K)
    for (int64_t m = m0; m < m1; ++m) {
      widen(xp + m * K * esz, kind, K, xf.data());
      int8_t* qm = plan ? qrow.data() : q + m * K;
      sx[m] = quantize(xf.data(), K, qm);
      if (plan) entries(*plan, qm, xe + m * plan->entry_chunk.size() * plan->width, negsum + m * plan->segments.size());
    }
  });
}

// x [M, K] (contiguous, fp32 / bf16 / fp16) -> sx [M] fp32 and a [M, lda] u8 = xq + 128 (xq as
// quantize_rows's; 128, i.e. xq 0, past K): the u8 side of the AMX kernel's brgemm.
void quantize_rows_u8(const torch::Tensor& x, float* sx, uint8_t* a, int64_t lda) {
  const int64_t M = x.size(0), K = x.size(1), esz = x.element_size();
  const int kind = x.scalar_type() == at::kFloat ? 0 : x.scalar_type() == at::kBFloat16 ? 1 : 2;
  const char* xp = static_cast<const char*>(x.data_ptr());
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 18) / std::max<int64_t>(K, 1));
  at::parallel_for(0, M, grain, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) sx[m] = w8_quantize_row_u8(xp + m * K * esz, kind, K, a + m * lda, lda);
  });
}
#endif

std::tuple<torch::Tensor, torch::Tensor> quantize_int8_cpu(const torch::Tensor& x) {  // x [M, K] float
  const std::string& isa = w2a8_isa();
  CHECK_W8(!isa.empty(), "quantize_int8: this CPU lacks both AVX512-VNNI (f, bw, vl, dq, vbmi, vnni) and ",
           "AVX2 (+ FMA, F16C), one of which the kernel needs; use ",
           "ternary_plugin.activations.quantize_activations_int8");
  check_w8_x(x, "quantize_int8");
  const int64_t M = x.size(0), K = x.size(1);
  auto xq = torch::empty({M, K}, x.options().dtype(at::kChar));  // [M, K] int8
  auto sx = torch::empty({M}, x.options().dtype(at::kFloat));     // [M] fp32
  if (poison_outputs()) {
    xq.fill_(-128);  // a value the quantizer never writes (symmetric: +-127)
    sx.fill_(std::numeric_limits<float>::quiet_NaN());
  }
#ifdef TERNARY_CPU_KERNELS
  if (M > 0)
    quantize_rows(x.contiguous(), isa == "avx512_vnni", sx.data_ptr<float>(), xq.data_ptr<int8_t>(), nullptr, nullptr,
                  nullptr);
#endif
  return {xq, sx};
}

torch::Tensor gemm_w2a8_cpu(const torch::Tensor& x,                   // [M, K] fp32 / bf16 / fp16
                            const torch::Tensor& packed_in,           // [N, ldp] uint8, ldp >= ceil(K/4)
                            const torch::Tensor& scale_in,            // [N, lds] fp16
                            const std::optional<torch::Tensor>& bias,  // [N] x.dtype, or None
                            int64_t block_size, int64_t k_offset) {
  const std::string& isa = w2a8_isa();
  CHECK_W8(!isa.empty(), "this CPU lacks both AVX512-VNNI (f, bw, vl, dq, vbmi, vnni) and AVX2 (+ FMA, ",
           "F16C), one of which the kernel needs (or is not x86-64); use ",
           "ternary_plugin.activations.ternary_linear_w2a8, which takes the reference path here");
  check_w8_x(x, "gemm_w2a8");
  const auto dt = x.scalar_type();
  CHECK_W8(packed_in.device().is_cpu() && scale_in.device().is_cpu(), "packed and scale must be CPU tensors");
  check_weights(kW8Prefix, x, packed_in, scale_in, bias, block_size, k_offset);
  const int64_t M = x.size(0), K = x.size(1), N = packed_in.size(0);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return bias ? y.copy_(bias->unsqueeze(0).expand({M, N})) : y.zero_();
#ifdef TERNARY_CPU_KERNELS
  const torch::Tensor packed = packed_in.contiguous(), scale = scale_in.contiguous();
  const float* bias_f = bias_f32(bias);  // [N] fp32, or nullptr
  const int64_t ldp = packed.size(1), row_bytes = 16 * ((K + kW8Chunk - 1) / kW8Chunk);  // what a row's chunks read
  // Rows whose last chunk would read past the tensor, copied zero-padded (the others read into
  // the next row, whose codes meet x's zeros past K)
  const int64_t tail_from = std::clamp<int64_t>(N - (row_bytes + ldp - 1) / ldp + 1, 0, N);
  uint8_t* tail = scratch<uint8_t>(kSlotTail, std::max<int64_t>(N - tail_from, 1) * row_bytes);  // [rows, row_bytes]
  for (int64_t n = tail_from; n < N; ++n) {
    uint8_t* dst = tail + (n - tail_from) * row_bytes;
    const int64_t copied = std::min(ldp, row_bytes);
    std::memcpy(dst, packed.data_ptr<uint8_t>() + n * ldp, copied);
    std::memset(dst + copied, 0, row_bytes - copied);
  }
  torch::Tensor held_x, held_sx, held_sums;  // x's buffers where they are too large for scratch
  const int y_kind = dt == at::kFloat ? 0 : dt == at::kBFloat16 ? 1 : 2;  // y's dtype, as store_y / store_rows_w8 take it

  if (w2a8_kernel(M) == "amx") {
    // The AMX kernel: y = sx * (S / 127) * (xq . w) + bias, w = code * q the row's folded block
    // scales (vnni_rows_s8), one int32 dot over all of K: oneDNN's u8 x s8 brgemm on AMX tiles,
    // the u8 side xq + 128 and 128 * sum(w) subtracted. The mode's exact per-block weighing
    // (the other kernels) pays a convert-and-scale per 128 columns, which on AMX tiles cost as
    // much as the dots (docs/kernel.md, CPU, W2A8 on AMX); the fold's error, against the exact
    // mode's and the activations' own, is measured there too. Tiles, x chunks, K slices and brgemm
    // calls: brgemm_tiles, as the bf16 brgemm tile kernel's (gemm_cpu).
    const int64_t kc = (K + kChunk - 1) / kChunk * kChunk;
    uint8_t* xa = call_buffer<uint8_t>(kSlotX, M * kc, held_x);  // [M, kc] u8: the brgemm's A
    float* sx = call_buffer<float>(kSlotXScales, M, held_sx);     // [M] fp32
    quantize_rows_u8(x.contiguous(), sx, xa, kc);
    if (poison_outputs()) y.fill_(std::numeric_limits<float>::quiet_NaN());
    const W8Problem p{M,     N,       packed.data_ptr<uint8_t>(), ldp, tail, tail_from,
                      row_bytes, reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>()), scale.size(1),
                      nullptr, nullptr, nullptr, 0, 0, sx, bias_f};
    const VnniPlan& vplan = vnni_plan(K, kc, block_size, k_offset);
    // every W row's folded scale and correction, written by the thread that decodes the row:
    // [N] int32, then [N] fp32
    int32_t* cp = scratch<int32_t>(kSlotRowData, 2 * N);
    float* wp = reinterpret_cast<float*>(cp + N);
    const bool stream = M * N * x.element_size() >= kStreamYBytes;
    char* yp = static_cast<char*>(y.data_ptr());
    const int64_t esz = y.element_size();
    brgemm_tiles<int8_t, int32_t>(
        M, N, kc, xa, kW8AmxTileBytes,
        [&](int64_t n0, int64_t n1, int8_t* tile) { vnni_rows_s8(p, vplan, kc, n0, n1, tile, cp + n0, wp + n0); },
        [&](const int32_t* c, int64_t ldc, int64_t mt, int64_t m0, int64_t n, int64_t cols) {
          store_rows_w8(c, ldc, mt, cols, p.sx + m0, cp + n, wp + n, p.bias ? p.bias + n : nullptr,
                        yp + (m0 * N + n) * esz, N, y_kind, stream);
        });
    return y;
  }

  const bool small = M <= w8_small_m_max(), avx2 = isa == "avx2";
  // small M: chunks of 64 columns, x permuted as the register decoder's; tile: groups of 4 (the
  // AVX2 tile keeps the decoder's entries: 64)
  const W8Plan plan = make_w8_plan(K, block_size, k_offset, small || avx2 ? kW8Chunk : 4);
  const int64_t E = static_cast<int64_t>(plan.entry_chunk.size()), S = static_cast<int64_t>(plan.segments.size());

  // x quantized by entries
  float* sx = call_buffer<float>(kSlotXScales, M, held_sx);                    // [M] fp32
  int8_t* xe = call_buffer<int8_t>(kSlotX, M * E * plan.width, held_x);         // [M, E, width] int8
  int32_t* negsum = call_buffer<int32_t>(kSlotXSums, M * S, held_sums);         // [M, S] int32
  quantize_rows(x.contiguous(), !avx2, sx, nullptr, &plan, xe, negsum);
  const W8Problem p{M, N, packed.data_ptr<uint8_t>(), ldp, tail, tail_from, row_bytes,
                    reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>()), scale.size(1), &plan, xe, negsum,
                    E, S, sx, bias_f};
  // The AVX-512 tile writes y in x's dtype itself; the other paths write fp32 y, and each thread
  // converts its columns (at M 2048, N 6144 the fp32 copy and its conversion were a quarter of
  // the op's time: 50 MB more written and read than y)
  const bool direct = !small && !avx2;
  const auto yf = dt == at::kFloat || direct ? y : torch::empty({M, N}, x.options().dtype(at::kFloat));  // [M, N]
  if (poison_outputs()) {
    y.fill_(std::numeric_limits<float>::quiet_NaN());
    if (!yf.is_same(y)) yf.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  const int yf_kind = direct ? y_kind : 0;  // yf's: w8_rows_tile
  float* yp = yf_kind == 0 ? yf.data_ptr<float>() : nullptr;
  const int64_t threads = at::get_num_threads();
  // y's columns [n0, n1) in x's dtype, by the thread that computed them (no region of its own)
  auto finish = [&](int64_t n0, int64_t n1) {
    if (dt == at::kFloat || direct) return;
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // worker threads: fresh dispatch state
    y.narrow(1, n0, n1 - n0).copy_(yf.narrow(1, n0, n1 - n0));
  };
  if (small) {
    at::parallel_for(0, (N + 3) / 4, 1, [&](int64_t t0, int64_t t1) {
      if (avx2) w8_rows_decode_avx2(p, 4 * t0, std::min(N, 4 * t1), yp);
      else w8_rows_decode(p, 4 * t0, std::min(N, 4 * t1), yp);
      finish(4 * t0, std::min(N, 4 * t1));
    });
  } else if (avx2) {
    // tiles of <= kW8TileBytes in multiples of 16 rows (the register block)
    const int64_t rows = balanced_tile_rows(N, w8_tile_rows_avx2(E, kW8TileBytes), threads, 16);
    const int64_t tiles = (N + rows - 1) / rows;
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      uint8_t* tile = scratch<uint8_t>(kSlotTile, rows * E * kW8Chunk);       // [rows / 16, E, 16, 16, 4] u8
      float* ws_tile = scratch<float>(kSlotTileScales, rows / 16 * S * 16);   // [rows / 16, S, 16] fp32 scales
      for (int64_t t = t0; t < t1; ++t)
        w8_rows_tile_avx2(p, t * rows, std::min(N, (t + 1) * rows), tile, ws_tile, yp);
      finish(t0 * rows, std::min(N, t1 * rows));
    });
  } else {
    // tiles of <= kW8TileBytes in multiples of 32 rows (the register block)
    const int64_t rows = balanced_tile_rows(N, w8_tile_rows(K, kW8TileBytes), threads, 32);
    const int64_t tiles = (N + rows - 1) / rows;
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      // 64-byte aligned (zmm loads; the tile's rows are multiples of 64 bytes): scratch is
      uint8_t* tile = scratch<uint8_t>(kSlotTile, rows * 4 * row_bytes);       // [rows/16, .., 16, 4] u8
      float* ws_tile = scratch<float>(kSlotTileScales, rows / 16 * S * 16);    // [rows / 16, S, 16] fp32 scales
      for (int64_t t = t0; t < t1; ++t)
        w8_rows_tile(p, t * rows, std::min(N, (t + 1) * rows), tile, ws_tile, yf.data_ptr(), yf_kind);
    });
  }
  return y;
#else
  CHECK_W8(false, "the CPU kernel is built for x86-64 only");
  return y;
#endif
}

}  // namespace
}  // namespace ternary_cpu

TORCH_LIBRARY_FRAGMENT(ternary_serve, m) {
  // "avx512_bf16" where this CPU runs the kernel, "" where it cannot (ternary_plugin.ops asks
  // once, before taking the kernel)
  m.def("cpu_kernel_isa() -> str", [] { return ternary_cpu::kernel_isa(); });
  // "avx512_vnni" or "avx2": the code of the W2A8 kernel (gemm_w2a8, quantize_int8) this CPU runs, "" none
  m.def("cpu_w2a8_isa() -> str", [] { return ternary_cpu::w2a8_isa(); });
  // The tile kernel bf16 x of M rows takes: "pair", "brgemm", "brgemm_kslice" or "gemm"; "" where none (bf16_tile)
  m.def("cpu_bf16_tile_kernel(int M) -> str", [](int64_t M) { return ternary_cpu::bf16_tile(M); });
  // Benchmarks and tests: force a bf16 tile kernel for this process over TERNARY_CPU_BF16_TILE
  // ("" undoes it), and the K-slice kernel's slice (columns, a multiple of 64; 0 its default)
  m.def("cpu_force_bf16_tile(str kernel, int k_slice=0, bool prefetch=True) -> ()",
        [](const std::string& kernel, int64_t k_slice, bool prefetch) {
    TORCH_CHECK(kernel.empty() || kernel == "pair" || kernel == "brgemm" || kernel == "brgemm_kslice" ||
                    kernel == "gemm",
                "cpu_force_bf16_tile: ", kernel, ": must be \"\", pair, brgemm, brgemm_kslice or gemm");
    TORCH_CHECK(k_slice >= 0 && k_slice % 64 == 0, "cpu_force_bf16_tile: k_slice must be a multiple of 64");
    ternary_cpu::forced_bf16_tile() = kernel;
    ternary_cpu::forced_k_slice() = k_slice;
    ternary_cpu::kslice_prefetch() = prefetch;
  });
  // The W2A8 kernel x of M rows takes: "amx" (block scales folded), "avx512_vnni" or "avx2" (exact);
  // "" none (w2a8_kernel)
  m.def("cpu_w2a8_kernel(int M) -> str", [](int64_t M) { return ternary_cpu::w2a8_kernel(M); });
}

TORCH_LIBRARY_IMPL(ternary_serve, CPU, m) {
  m.impl("gemm", &ternary_cpu::gemm_cpu);
  m.impl("gemm_w2a8", &ternary_cpu::gemm_w2a8_cpu);
  m.impl("quantize_int8", &ternary_cpu::quantize_int8_cpu);
}
