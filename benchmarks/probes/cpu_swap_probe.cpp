// Probe (issue #23, 2026-12-05; driver: cpu_swap_probe.py, results: docs/kernel.md, CPU, AMX): the
// brgemm tile kernel with the roles swapped, the decoded W as oneDNN's A (row-major [rows, K] bf16,
// decoded contiguously: vpmultishiftqb + vpermw a 32 weights, the block's bf16 scale in the
// vpermw table) and x^T as B ([K/2, M, 2], made once per call), C^T = W x^T [rows, M] written back
// transposed into y (16 x 16 vpermt2d transposes), against the current tile (vnni_rows_bf16 + x
// as A), each split into decode and brgemm. Probe only: 1 thread, K % 128 == 0, k_offset 0,
// block_size 128, M % 16 == 0; outputs checked bit for bit against the op by the driver.
// ternary_cpu_kernels.cpp is compiled into this TU for its decoders and helpers.
#include <torch/extension.h>
#include <ATen/native/CPUBlas.h>
#include <chrono>
#include "../../csrc/cpu/ternary_cpu_kernels.cpp"

namespace ternary_cpu {
namespace {

// 16x16 dword transpose by 4 vpermt2d stages (stage s swaps bit s of zmm index and lane).
struct T16 {
  __m512i idx[4][2];
  TERNARY_AVX512 T16() {
    for (int s = 0; s < 4; ++s) {
      alignas(64) int32_t i0[16], i1[16];
      for (int l = 0; l < 16; ++l) {
        const int hi = ((l >> s) & 1) << 4;
        i0[l] = (l & ~(1 << s)) | hi;
        i1[l] = (l | (1 << s)) | hi;
      }
      idx[s][0] = _mm512_load_si512(i0);
      idx[s][1] = _mm512_load_si512(i1);
    }
  }
  TERNARY_AVX512 inline void run(__m512i* r) const {
    for (int s = 0; s < 4; ++s)
      for (int z = 0; z < 16; ++z)
        if (!(z & (1 << s))) {
          const __m512i lo = r[z], hi = r[z | (1 << s)];
          r[z] = _mm512_permutex2var_epi32(lo, idx[s][0], hi);
          r[z | (1 << s)] = _mm512_permutex2var_epi32(lo, idx[s][1], hi);
        }
  }
};

// x [M, kc] bf16 (dwords [M, kc/2]) -> xT [kc/2, M] dwords; M % 16 == 0.
TERNARY_AVX512 void transpose_x(const uint32_t* x, int64_t M, int64_t kp, uint32_t* xt, int64_t ldt) {
  static const T16 t;
  __m512i r[16];
  for (int64_t m = 0; m < M; m += 16)
    for (int64_t q = 0; q < kp; q += 16) {
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(x + (m + i) * kp + q);
      t.run(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(xt + (q + i) * ldt + m, r[i]);
    }
}

// C^T [R, M] fp32 (ldc) -> y[m, n0 + r] = bf16(c + bias); R, M multiples of 16.
TERNARY_AVX512 void store_t(const float* c, int64_t ldc, int64_t R, int64_t M, const float* bias, uint16_t* y,
                            int64_t ldy) {
  static const T16 t;
  __m512i r[16];
  for (int64_t n = 0; n < R; n += 16) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    for (int64_t m = 0; m < M; m += 16) {
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(c + (n + i) * ldc + m);
      t.run(r);
      for (int i = 0; i < 16; ++i)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m + i) * ldy + n),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_castsi512_ps(r[i]), b)));
    }
  }
}

// Rows [n0, n0 + R) x columns [k0, k0 + kw) of W (value * scale rounded to bf16) row-major into
// out [R, ldo]. Probe: block_size % 32 == 0, k_offset % 32 == 0, K % 32 == 0.
TERNARY_AVX512 void decode_rm(const Problem& p, int64_t bs, int64_t koff, int64_t n0, int64_t R, int64_t k0, int64_t kw,
                              uint16_t* out, int64_t ldo) {
  const __m512i ctrl = ctrl_w16();
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* prow = p.row(n0 + r);
    const uint16_t* srow = p.scale + (n0 + r) * p.lds;
    uint16_t* o = out + r * ldo;
    int64_t c = k0 / 32;
    const int64_t c1 = (k0 + kw) / 32;
    while (c < c1) {
      const int64_t b = (koff + 32 * c) / bs;
      const int64_t ce = std::min(c1, ((b + 1) * bs - koff) / 32);
      const uint16_t s = bf16_round(half_to_float(srow[b]));
      const __m512i table = table_w16(s, s | 0x8000);
      for (; c < ce; ++c) {
        uint64_t bits;
        std::memcpy(&bits, prow + 8 * c, 8);
        const __m512i idx = _mm512_maskz_multishift_epi64_epi8(kWordLowBytes, ctrl, _mm512_set1_epi64((long long)bits));
        _mm512_store_si512(o + 32 * (c - k0 / 32), _mm512_permutexvar_epi16(idx, table));
      }
    }
  }
}

}  // namespace
}  // namespace ternary_cpu

using namespace ternary_cpu;

static Problem make_problem(const torch::Tensor& packed, const torch::Tensor& scale, int64_t K, const Plan* plan,
                            const torch::Tensor& tailbuf) {
  const int64_t N = packed.size(0), ldp = packed.size(1);
  return Problem{0, N, K, packed.data_ptr<uint8_t>(), ldp, (const uint16_t*)scale.data_ptr<at::Half>(), scale.size(1),
                 nullptr, plan, tailbuf.data_ptr<uint8_t>(), N};  // tail_start N: no tail (probe: rows read in place)
}

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds for decoding all N rows, `iters` times: mode 0 the VNNI tile (512 KB tiles), mode 1 row-major
// into a 512 KB tile, mode 2 row-major slices of `slice` columns x 64 rows into a small buffer.
double bench_decode(torch::Tensor packed, torch::Tensor scale, int64_t K, int64_t mode, int64_t slice, int64_t iters) {
  const int64_t kc = (K + 31) / 32 * 32, N = packed.size(0);
  auto tailbuf = torch::zeros({8}, torch::kByte);
  Plan plan;
  const Problem p = make_problem(packed, scale, K, &plan, tailbuf);
  const VnniPlan vp = make_vnni_plan(K, kc, 128, 0);
  const int64_t rows = std::max<int64_t>(64, 512 * 1024 / (kc * 2) / 64 * 64);
  uint16_t* tile = (uint16_t*)std::aligned_alloc(64, rows * kc * 2 + 4096);
  double best = 1e9;
  for (int64_t it = 0; it < iters; ++it) {
    const double t0 = now();
    for (int64_t n0 = 0; n0 < N; n0 += rows) {
      const int64_t n1 = std::min(N, n0 + rows);
      if (mode == 0) vnni_rows_bf16(p, vp, kc, n0, n1, tile);
      else if (mode == 1) decode_rm(p, 128, 0, n0, n1 - n0, 0, kc, tile, kc);
      else
        for (int64_t g = n0; g < n1; g += 64)
          for (int64_t k0 = 0; k0 < kc; k0 += slice) decode_rm(p, 128, 0, g, std::min<int64_t>(64, n1 - g), k0, std::min(slice, kc - k0), tile, slice);
    }
    best = std::min(best, now() - t0);
  }
  std::free(tile);
  return best;
}

// The swapped op, 1 thread: y [M, N] bf16. R: W rows a brgemm call (A's M); slice: K columns a decode / call (kc: none).
torch::Tensor swapped(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, c10::optional<torch::Tensor> bias,
                      int64_t R, int64_t slice, int64_t flags) {
  // flags: 1 = C zeroed once and add_C always (one kernel), 2 = no decode (brgemm alone on a stale A), 4 = no brgemm
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), kc = (K + 31) / 32 * 32;
  TORCH_CHECK(M % 16 == 0 && N % R == 0 && K == kc && kc % slice == 0);
  auto tailbuf = torch::zeros({8}, torch::kByte);
  Plan plan;
  const Problem p = make_problem(packed, scale, K, &plan, tailbuf);
  auto y = torch::empty({M, N}, x.options());
  // 64-byte aligned (oneDNN's tile loads: a B row straddling lines ran up to 2x slower)
  uint32_t* xt = (uint32_t*)std::aligned_alloc(64, (kc / 2 * M * 4 + 63) / 64 * 64);
  transpose_x((const uint32_t*)x.data_ptr<at::BFloat16>(), M, kc / 2, xt, M);
  float* cbuf = (float*)std::aligned_alloc(64, (R * M * 4 + 63) / 64 * 64);
  uint16_t* a = (uint16_t*)std::aligned_alloc(64, R * slice * 2 + 64);
  std::vector<float> bf;
  if (bias) { auto b = bias->to(torch::kFloat); bf.assign(b.data_ptr<float>(), b.data_ptr<float>() + N); }
  for (int64_t n0 = 0; n0 < N; n0 += R) {
    if (flags & 1) std::memset(cbuf, 0, R * M * 4);
    for (int64_t k0 = 0; k0 < kc; k0 += slice) {
      if (!(flags & 2)) decode_rm(p, 128, 0, n0, R, k0, slice, a, slice);
      if (!(flags & 4)) at::native::cpublas::brgemm(R, M, slice, slice, M, M, (flags & 1) ? true : k0 > 0, (const at::BFloat16*)a,
                                  (const at::BFloat16*)(xt + k0 / 2 * M), cbuf, true);
    }
    store_t(cbuf, M, R, M, bias ? bf.data() + n0 : nullptr, (uint16_t*)y.data_ptr<at::BFloat16>() + n0, N);
  }
  at::native::cpublas::brgemm_release(true);
  std::free(a);
  std::free(xt);
  std::free(cbuf);
  return y;
}

// The current brgemm tile (vnni_rows_bf16 + brgemm with x as A), 1 thread, tiles of tile_bytes; flags 2: no
// decode, 4: no brgemm, 8: one tiny brgemm a tile instead (the decode with AMX active), 16: the tile state
// released (brgemm_release) after each tile's brgemm calls.
torch::Tensor current(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t flags,
                      int64_t tile_bytes = 512 * 1024) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), kc = (K + 31) / 32 * 32;
  auto tailbuf = torch::zeros({8}, torch::kByte);
  Plan plan;
  const Problem p = make_problem(packed, scale, K, &plan, tailbuf);
  const VnniPlan vp = make_vnni_plan(K, kc, 128, 0);
  auto y = torch::empty({M, N}, x.options());
  const int64_t rows = std::max<int64_t>(64, tile_bytes / (kc * 2) / 64 * 64);
  static thread_local std::vector<uint16_t> tilev; tilev.resize(rows * kc + 64);
  uint16_t* tile = (uint16_t*)(((uintptr_t)tilev.data() + 63) / 64 * 64);
  std::vector<float> c(128 * 64);
  const at::BFloat16* xa = x.data_ptr<at::BFloat16>();
  uint16_t* yb = (uint16_t*)y.data_ptr<at::BFloat16>();
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n1 = std::min(N, n0 + rows);
    if (!(flags & 2)) vnni_rows_bf16(p, vp, kc, n0, n1, tile);
    if (flags & 8) {  // one tiny brgemm a tile: does AMX activity slow the AVX-512 decode?
      at::native::cpublas::brgemm(16, 64, 32, kc, 64, 64, false, xa, (const at::BFloat16*)tile, c.data(), true);
      if (flags & 16) at::native::cpublas::brgemm_release(true);  // AMX tile state released before the next decode
      continue;
    }
    if (flags & 4) continue;
    for (int64_t n = n0; n < n1; n += 64)
      for (int64_t m0 = 0; m0 < M; m0 += 128) {
        const int64_t mt = std::min<int64_t>(128, M - m0);
        at::native::cpublas::brgemm(mt, 64, kc, kc, 64, 64, false, xa + m0 * kc, (const at::BFloat16*)tile + (n - n0) * kc, c.data(), true);
        store_rows_bf16(c.data(), 64, mt, std::min<int64_t>(64, N - n), nullptr, yb + m0 * N + n, N, false);
      }
    if (flags & 16) at::native::cpublas::brgemm_release(true);
  }
  at::native::cpublas::brgemm_release(true);
  return y;
}

double tiny(int64_t iters, int64_t K) {
  std::vector<at::BFloat16> a(16 * K), b(K * 64);
  std::vector<float> c(16 * 64);
  const double t0 = now();
  for (int64_t i = 0; i < iters; ++i) at::native::cpublas::brgemm(16, 64, 32, K, 64, 64, false, a.data(), b.data(), c.data(), true);
  const double t = now() - t0;
  at::native::cpublas::brgemm_release(true);
  return t / iters;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bench_decode", &bench_decode);
  m.def("swapped", &swapped);
  m.def("current", &current, py::arg("x"), py::arg("packed"), py::arg("scale"), py::arg("flags"), py::arg("tile_bytes") = 512 * 1024);
  m.def("tiny", &tiny);
}
