// Probe for issue #23 (CPU, bf16 x, AMX, M 128-2048): the blocking of the brgemm tile kernel's GEMM
// loop (ternary_cpu.cpp brgemm_tiles) against torch's bf16 matmul. The decode is left out: a tile
// of pre-made VNNI B matrices is copied into the thread's tile buffer (memcpy, as the decode writes
// it), then x runs against it with at::native::cpublas::brgemm under one of these loop orders:
//   order 0 (today's): x block (<= xb rows) > 64-row group > call of mr x rows > K slices of ks
//   order 1: call of mr x rows > K slice of ks > group, C [mr, tile rows] kept across the K slices
//   order 2: x block (<= xb rows) > tile (copied again for every x block) > as order 1 within
// K slices accumulate into C (add_C) in K order. Flags added to the order, to split the time:
// 4 skips the tile copy, 8 skips the store of y, 16 stores every chunk into y's first rows (y stays
// in L2), 32 prefetchw's y's lines of the chunk a share before each call, 64 streams y (order 1 / 2
// for 16 and 32). peak(): one call repeated on the same buffers. Driven by cpu_brgemm_block_probe.py.
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int64_t kCols = 64;  // W rows a B matrix (a group)
bool stream_y = false;  // order bit 64: streaming stores into y

__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) void store(const float* c, int64_t ldc, int64_t rows,
                                                                            int64_t cols, uint16_t* y, int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; j += 16) {
      const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(c + i * ldc + j));
      if (stream_y && reinterpret_cast<uintptr_t>(y + i * ldy + j) % 32 == 0)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(y + i * ldy + j), v);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy + j), v);
    }
  if (stream_y) _mm_sfence();
}

}  // namespace

// x [M, K] bf16 contiguous, w [N / 64, K / 2, 64, 2] bf16 (VNNI B matrices), y [M, N] bf16.
// Returns seconds of one call (the whole layer, 1 thread).
double run(torch::Tensor x, torch::Tensor w, torch::Tensor y, int64_t tile_rows, int64_t xb, int64_t mr, int64_t ks,
           int64_t order) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  const auto* a = x.data_ptr<at::BFloat16>();
  const auto* wsrc = w.data_ptr<at::BFloat16>();
  auto* yb = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  static at::BFloat16* tile = nullptr;
  static float* c = nullptr;
  static int64_t tile_n = 0, c_n = 0;
  if (tile_n < tile_rows * K) {
    std::free(tile);
    tile_n = tile_rows * K;
    tile = static_cast<at::BFloat16*>(std::aligned_alloc(64, tile_n * 2));
  }
  const int64_t cn = std::max<int64_t>(mr * tile_rows, 1) + 64;
  if (c_n < cn) {
    std::free(c);
    c_n = cn;
    c = static_cast<float*>(std::aligned_alloc(64, (c_n * 4 + 63) / 64 * 64));
  }
  const bool copy = !(order & 4), keep = !(order & 8);  // order bits 4 / 8: skip the copy / the store
  const bool ysmall = order & 16;  // order bit 16: every store into y's first rows (y stays in L2)
  stream_y = order & 64;
  const bool pfw = order & 32;     // order bit 32 (order 1): prefetchw y's lines of the chunk, a share before each call
  order &= 3;
  const auto t0 = std::chrono::steady_clock::now();
  if (order == 2) {
    for (int64_t mx = 0; mx < M; mx += xb)
      for (int64_t n0 = 0; n0 < N; n0 += tile_rows) {
        const int64_t n1 = std::min(N, n0 + tile_rows), cols = n1 - n0;
        if (copy) std::memcpy(tile, wsrc + n0 * K, (n1 - n0) * K * 2);
        for (int64_t m0 = mx; m0 < std::min(M, mx + xb); m0 += mr) {
          const int64_t mt = std::min(mr, M - m0);
          for (int64_t k0 = 0; k0 < K; k0 += ks)
            for (int64_t n = n0; n < n1; n += kCols)
              at::native::cpublas::brgemm(mt, kCols, std::min(ks, K - k0), K, kCols, cols, k0 > 0, a + m0 * K + k0,
                                          tile + (n - n0) * K + k0 * kCols, c + (n - n0), true);
          if (keep) store(c, cols, mt, cols, yb + (ysmall ? 0 : m0) * N + n0, N);
        }
      }
  }
  for (int64_t n0 = 0; n0 < N && order != 2; n0 += tile_rows) {
    const int64_t n1 = std::min(N, n0 + tile_rows);
    if (copy) std::memcpy(tile, wsrc + n0 * K, (n1 - n0) * K * 2);
    if (order == 0) {
      for (int64_t mx = 0; mx < M; mx += xb)
        for (int64_t n = n0; n < n1; n += kCols)
          for (int64_t m0 = mx; m0 < std::min(M, mx + xb); m0 += mr) {
            const int64_t mt = std::min(mr, M - m0);
            for (int64_t k0 = 0; k0 < K; k0 += ks)
              at::native::cpublas::brgemm(mt, kCols, std::min(ks, K - k0), K, kCols, kCols, k0 > 0, a + m0 * K + k0,
                                          tile + (n - n0) * K + k0 * kCols, c, true);
            if (keep) store(c, kCols, mt, kCols, yb + m0 * N + n, N);
          }
    } else {
      const int64_t cols = n1 - n0;
      const int64_t lines_row = (cols * 2 + 63) / 64, calls = ((K + ks - 1) / ks) * ((cols + kCols - 1) / kCols);
      for (int64_t m0 = 0; m0 < M; m0 += mr) {
        const int64_t mt = std::min(mr, M - m0);
        const int64_t lines = mt * lines_row;
        int64_t ci = 0;
        for (int64_t k0 = 0; k0 < K; k0 += ks)
          for (int64_t n = n0; n < n1; n += kCols, ++ci) {
            if (pfw)
              for (int64_t l = ci * lines / calls; l < (ci + 1) * lines / calls; ++l) {
                const char* line = reinterpret_cast<const char*>(yb + (m0 + l / lines_row) * N + n0) + (l % lines_row) * 64;
                asm volatile("prefetchw %0" : : "m"(*line));
              }
            at::native::cpublas::brgemm(mt, kCols, std::min(ks, K - k0), K, kCols, cols, k0 > 0, a + m0 * K + k0,
                                        tile + (n - n0) * K + k0 * kCols, c + (n - n0), true);
          }
        if (keep) store(c, cols, mt, cols, yb + (ysmall ? 0 : m0) * N + n0, N);
      }
    }
  }
  at::native::cpublas::brgemm_release(true);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GFLOP/s of one brgemm call (mt x 64 x ks, lda lda, add_C) repeated `reps` times on the same
// buffers (warm: the peak a call reaches with its A and B in L1 / L2).
double peak(int64_t mt, int64_t ks, int64_t lda, int64_t reps) {
  auto* a = static_cast<at::BFloat16*>(std::aligned_alloc(64, mt * lda * 2));
  auto* b = static_cast<at::BFloat16*>(std::aligned_alloc(64, ks * kCols * 2));
  auto* c = static_cast<float*>(std::aligned_alloc(64, mt * kCols * 4));
  std::memset(a, 0, mt * lda * 2);
  std::memset(b, 0, ks * kCols * 2);
  at::native::cpublas::brgemm(mt, kCols, ks, lda, kCols, kCols, false, a, b, c, true);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r) at::native::cpublas::brgemm(mt, kCols, ks, lda, kCols, kCols, true, a, b, c, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  at::native::cpublas::brgemm_release(true);
  std::free(a);
  std::free(b);
  std::free(c);
  return 2.0 * mt * kCols * ks * reps / s / 1e9;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
  m.def("peak", &peak);
}
