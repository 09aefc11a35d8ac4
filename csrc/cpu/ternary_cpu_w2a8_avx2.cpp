// The W2A8 CPU kernel's AVX2 code (AVX2 + FMA + F16C: x86-64 CPUs without AVX512-VNNI, such as
// AMD Zen 1-3 and Intel client cores), for torch.ops.ternary_serve.gemm_w2a8 (the op, its checks
// and threads: ternary_cpu.cpp; the numerics: ternary_plugin/activations.py). The same formula and
// the same layouts as the AVX512-VNNI code (ternary_cpu_w2a8.cpp, whose header says why): codes
// as u = w + 1 in {0, 1, 2}, x by entries of 64 (byte 16q + j = column 4j + q), negsum in lane 0
// of each segment's int32 accumulator, one fp32 product per (lanes, segment). Every block dot is
// exact in int32, as the mode owes, so the two ISAs give the same y bit for bit up to the order
// of the fp32 sums.
//
// AVX2 has no vpdpbusd: an entry's 64 products are two vpmaddubsw (u8 x s8 -> pairs summed in
// int16: |2 * 2 * 127| fits), their vpaddw, and one vpmaddwd by ones (-> int32 lanes): 4 instead
// of 1 instruction. Decoding an entry (16 packed bytes) to u: the bytes broadcast to both 128-bit
// lanes, dword shifts (0, 2) and (4, 6) by lane (vpsrlvd; the bits a dword shift brings in from
// the next byte are masked off), the 2-bit mask, vpshufb's table {1, 2, 0, 1}: 7 instructions
// for 64 weights.
//
//   small M (w8_rows_decode_avx2): 4 W rows a block, the codes decoded in registers for each x row
//   large M (w8_rows_tile_avx2): W rows decoded once into a u8 tile in the entry layout
//     ([rows, E, 64]: the codes as the decoder would leave them), then blocks of x rows (L2)
//     times blocks of 4 tile rows, x rows 2 at a time: the tile is read, not decoded, per x row.
// The scalar parts (widening, quantizing and permuting a row of x) are O(M K) against the
// kernels' O(M N K) and bit for bit what the VNNI code computes.

#include "ternary_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#ifdef TERNARY_CPU_KERNELS
#include <immintrin.h>
#define TERNARY_W8_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace ternary_cpu {

#ifdef TERNARY_CPU_KERNELS

float w8_quantize_row_scalar(const float* x, int64_t K, int8_t* q) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  // as torch: fp32 absmax / 127 (IEEE division), 1 where that is 0
  float sx = amax / 127.0f;
  if (!(sx > 0.f)) sx = 1.f;
  for (int64_t k = 0; k < K; ++k) {
    // x / sx by division, rounded half to even (the default rounding mode) like torch.round
    const float r = std::nearbyint(x[k] / sx);
    q[k] = r == r ? static_cast<int8_t>(std::clamp(r, -127.f, 127.f)) : -127;  // NaN: as vcvtps2dq's INT_MIN, clamped
  }
  return sx;
}

TERNARY_W8_AVX2 void w8_widen_row_scalar(const void* x, int kind, int64_t K, float* out) {
  if (kind == 0) {
    std::memcpy(out, x, K * sizeof(float));
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(x);
  for (int64_t k = 0; k < K; ++k) {
    if (kind == 1) {  // bf16: the high half of an fp32
      const uint32_t bits = static_cast<uint32_t>(h[k]) << 16;
      std::memcpy(out + k, &bits, 4);
    } else {
      out[k] = _cvtsh_ss(h[k]);
    }
  }
}

void w8_entries_row_scalar(const W8Plan& plan, const int8_t* q, int8_t* xe_row, int32_t* negsum_row) {
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const W8Segment& seg = plan.segments[s];
    int32_t total = 0;
    for (int64_t j = seg.j0; j < seg.j1; ++j) total += q[j];
    negsum_row[s] = -total;
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      const int64_t base = plan.entry_chunk[e] * kW8Chunk;
      int8_t* dst = xe_row + e * kW8Chunk;
      for (int t = 0; t < kW8Chunk; ++t) {  // byte 16q + j takes column 4j + q (the decoder's order)
        const int64_t col = base + 4 * (t % 16) + t / 16;
        dst[t] = col >= seg.j0 && col < seg.j1 ? q[col] : 0;
      }
    }
  }
}

namespace {

constexpr int kAvx2Rows = 4;  // W rows of a register block

struct Decoder {
  __m256i shifts_lo, shifts_hi, three, lut, ones;
};
TERNARY_W8_AVX2 inline Decoder decoder() {
  return {_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6), _mm256_set1_epi8(3),
          // bytes 0..3 of each 128-bit lane: u of codes 00 (0), 01 (+1), 10 (-1), 11 (reserved: 0)
          _mm256_setr_epi32(0x01000201, 0, 0, 0, 0x01000201, 0, 0, 0), _mm256_set1_epi16(1)};
}
// 64 weights from 16 packed bytes as u = w + 1: u0 = entry bytes 0..31, u1 = bytes 32..63.
TERNARY_W8_AVX2 inline void decode_u(const uint8_t* bytes, const Decoder& d, __m256i& u0, __m256i& u1) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  u0 = _mm256_shuffle_epi8(d.lut, _mm256_and_si256(_mm256_srlv_epi32(b, d.shifts_lo), d.three));
  u1 = _mm256_shuffle_epi8(d.lut, _mm256_and_si256(_mm256_srlv_epi32(b, d.shifts_hi), d.three));
}
TERNARY_W8_AVX2 inline __m256i dot64(__m256i acc, __m256i u0, __m256i u1, __m256i x0, __m256i x1, __m256i ones) {
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
}
TERNARY_W8_AVX2 inline float lane_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// y[m0 .. m0 + MT) x [n0 .. n0 + valid) of one register block.
//   DECODE: w[r] a packed row (16 bytes a chunk), else a tile row [E, 64] u8; ws[r]: [S] fp32
template <int MT, bool DECODE>
TERNARY_W8_AVX2 void w8_block(const W8Problem& p, const uint8_t* const* w, const float* const* ws, int64_t m0,
                              int64_t n0, int64_t valid, float* y) {
  const W8Plan& plan = *p.plan;
  const Decoder dec = decoder();
  const int8_t* x[MT];
  for (int i = 0; i < MT; ++i) x[i] = p.xe + (m0 + i) * p.E * kW8Chunk;
  __m256 sum[kAvx2Rows][MT];
  for (int r = 0; r < kAvx2Rows; ++r)
    for (int i = 0; i < MT; ++i) sum[r][i] = _mm256_setzero_ps();
  for (int64_t s = 0; s < p.S; ++s) {
    const W8Segment& seg = plan.segments[s];
    __m256i acc[kAvx2Rows][MT];
    for (int i = 0; i < MT; ++i) {
      const __m256i start = _mm256_setr_epi32(p.negsum[(m0 + i) * p.S + s], 0, 0, 0, 0, 0, 0, 0);
      for (int r = 0; r < kAvx2Rows; ++r) acc[r][i] = start;
    }
    const int64_t c0 = plan.entry_chunk[seg.e0];
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      __m256i x0[MT], x1[MT];
      for (int i = 0; i < MT; ++i) {
        x0[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i] + e * kW8Chunk));
        x1[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i] + e * kW8Chunk + 32));
      }
      for (int r = 0; r < kAvx2Rows; ++r) {
        __m256i u0, u1;
        if constexpr (DECODE) {
          decode_u(w[r] + 16 * (c0 + e - seg.e0), dec, u0, u1);
        } else {
          u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + e * kW8Chunk));
          u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + e * kW8Chunk + 32));
        }
        for (int i = 0; i < MT; ++i) acc[r][i] = dot64(acc[r][i], u0, u1, x0[i], x1[i], dec.ones);
      }
    }
    for (int r = 0; r < kAvx2Rows; ++r) {
      const __m256 wsv = _mm256_set1_ps(ws[r][s]);
      for (int i = 0; i < MT; ++i) sum[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][i]), wsv, sum[r][i]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    const float sx = p.sx[m0 + i];
    for (int r = 0; r < valid; ++r)
      y[(m0 + i) * p.N + n0 + r] = sx * lane_sum(sum[r][i]) + (p.bias ? p.bias[n0 + r] : 0.f);
  }
}

// x rows [m_begin, m_end) over one register block, MT at a time (the last one alone).
template <int MT, bool DECODE>
TERNARY_W8_AVX2 void w8_rows_m(const W8Problem& p, const uint8_t* const* w, const float* const* ws, int64_t m_begin,
                               int64_t m_end, int64_t n0, int64_t valid, float* y) {
  int64_t m0 = m_begin;
  for (; m0 + MT <= m_end; m0 += MT) w8_block<MT, DECODE>(p, w, ws, m0, n0, valid, y);
  for (; m0 < m_end; ++m0) w8_block<1, DECODE>(p, w, ws, m0, n0, valid, y);
}

// The fp32 scales of W rows [b0, b0 + valid) per segment into ws ([kAvx2Rows, S]; 0 past valid).
TERNARY_W8_AVX2 inline void block_scales(const W8Problem& p, int64_t b0, int64_t valid, float* ws) {
  for (int r = 0; r < kAvx2Rows; ++r)
    for (int64_t s = 0; s < p.S; ++s)
      ws[r * p.S + s] = r < valid ? _cvtsh_ss(p.scale[(b0 + r) * p.lds + p.plan->segments[s].block]) : 0.f;
}

}  // namespace

TERNARY_W8_AVX2 void w8_rows_decode_avx2(const W8Problem& p, int64_t n0, int64_t n1, float* y) {
  const std::vector<uint8_t> zero_row(p.row_bytes, 0);
  std::vector<float> ws(kAvx2Rows * p.S);
  for (int64_t b0 = n0; b0 < n1; b0 += kAvx2Rows) {
    const int64_t valid = std::min<int64_t>(kAvx2Rows, n1 - b0);
    const uint8_t* w[kAvx2Rows];
    const float* wsr[kAvx2Rows];
    for (int r = 0; r < kAvx2Rows; ++r) {
      w[r] = r < valid ? p.row(b0 + r) : zero_row.data();
      wsr[r] = ws.data() + r * p.S;
    }
    block_scales(p, b0, valid, ws.data());
    // one x row a block: 4 int32 accumulators, 4 fp32 sums, x's two halves, a row's codes and the
    // decoder's 5 constants in the 16 ymm
    w8_rows_m<1, true>(p, w, wsr, 0, p.M, b0, valid, y);
  }
}

TERNARY_W8_AVX2 void w8_rows_tile_avx2(const W8Problem& p, int64_t n0, int64_t n1, uint8_t* tile, float* y) {
  const Decoder dec = decoder();
  const int64_t rows = n1 - n0, row_tile = p.E * kW8Chunk;  // a tile row's bytes: its entries' u
  const std::vector<uint8_t> zero_row(row_tile, 1);          // u = 1: code 0 (and its scale is 0)
  const W8Plan& plan = *p.plan;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = p.row(n0 + r);
    uint8_t* dst = tile + r * row_tile;
    for (const W8Segment& seg : plan.segments) {
      const int64_t c0 = plan.entry_chunk[seg.e0];
      for (int64_t e = seg.e0; e < seg.e1; ++e) {
        __m256i u0, u1;
        decode_u(src + 16 * (c0 + e - seg.e0), dec, u0, u1);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + e * kW8Chunk), u0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + e * kW8Chunk + 32), u1);
      }
    }
  }
  std::vector<float> ws(kAvx2Rows * p.S);
  // x rows in blocks of <= kXBlockBytes (L2, beside the tile); 4 tile rows x 2 x rows a register
  // block inside (8 int32 accumulators, 8 fp32 sums: the sums spill, touched once a segment)
  constexpr int64_t kXBlockBytes = 128 * 1024;
  const int64_t mb = std::max<int64_t>(2, kXBlockBytes / std::max<int64_t>(row_tile, 1) / 2 * 2);
  for (int64_t m_begin = 0; m_begin < p.M; m_begin += mb) {
    const int64_t m_end = std::min(p.M, m_begin + mb);
    for (int64_t b = 0; b < rows; b += kAvx2Rows) {
      const int64_t valid = std::min<int64_t>(kAvx2Rows, rows - b);
      const uint8_t* w[kAvx2Rows];
      const float* wsr[kAvx2Rows];
      for (int r = 0; r < kAvx2Rows; ++r) {
        w[r] = r < valid ? tile + (b + r) * row_tile : zero_row.data();
        wsr[r] = ws.data() + r * p.S;
      }
      block_scales(p, n0 + b, valid, ws.data());
      w8_rows_m<2, false>(p, w, wsr, m_begin, m_end, n0 + b, valid, y);
    }
  }
}

#endif

}  // namespace ternary_cpu
