// The W2A8 CPU kernel's AVX512-VNNI code (torch.ops.ternary_serve.gemm_w2a8; the op, its checks
// and threads: ternary_cpu.cpp; the numerics: ternary_plugin/activations.py). Per-function target
// attributes, as ternary_cpu_kernels.cpp: the library loads on any x86-64 and ternary_cpu.cpp
// calls in here only where cpu_w2a8_supported() says so.
//
// vpdpbusd multiplies u8 by s8. The codes are decoded as u = w + 1 in {0, 1, 2} (u8) and xq is
// the s8 side, so per block  d = dot(w, xq) = dot(u, xq) - sum(xq):  the correction is one int32
// per (token, segment), computed once when x is quantized (negsum), and enters the int32
// accumulator as its lane 0 start value. Every block dot is exact in int32, as the mode owes;
// the only float work is one fp32 product and sum per (16 lanes, segment), as the reference
// weighs a block (bitnet.cpp's I2_S does the same with a per-row weight sum, which needs the
// weights' sums precomputed; the per-token sum of x needs nothing stored with the model).
//
// Decoding a chunk (64 weights = 16 packed bytes, byte j holding weights 4j .. 4j+3, the first
// in the lowest bits): the 16 bytes broadcast to the four 128-bit lanes, lane q shifted right by
// 2q (vpsrlvw), masked to 2 bits, and vpshufb's table {1, 2, 0, 1} maps code -> u (the reserved
// 11 reads as 0, as format.unpack_ternary reads it): 4 instructions per 64 weights. Byte 16q + j
// then holds weight 4j + q, so x is stored in that order too (vpermb once per chunk of x, when
// it is quantized); a dot product does not care about the order of its terms.
//
//   x [M, K] --quantize--> xe [M, E, width] s8 (entries: a chunk as one segment sees it, zero
//                          outside the segment), negsum [M, S] = -sum_segment xq
//
//   small M (w8_rows_decode, width 64): 4 W rows a task, codes decoded in registers per group
//   of 2 x rows; the 16 int32 lanes of an accumulator are 16 positions of K:
//     for segment s:   acc[4 rows][2 tokens] = (negsum[m, s], 0, ..., 0)
//       for entry e in s:   acc[r][i] += vpdpbusd(u[r, e], xe[m_i, e])
//       sum[r][i] += float(acc[r][i]) * ws[r, s]                                    (fp32)
//     y[m, n] = sx[m] * lane_sum(sum[r][i]) + bias[n]
//
//   large M (w8_rows_tile, width 4): W rows decoded once into a tile of 16-row groups, each
//   [ceil(K/64) * 16 column groups, 16 rows, 4 u8] (<= 256 KB: L2); the 16 lanes of an
//   accumulator are 16 W rows, x broadcast 4 bytes (one entry) at a time, 32 W rows x 6 tokens
//   a register block:
//     for segment s:   acc[2 groups][6 tokens] = negsum[m, s] in every lane
//       for entry e in s:   acc[v][i] += vpdpbusd(u[v, e] (16 rows x 4), broadcast(xe[m_i, e]))
//       sum[v][i] += float(acc[v][i]) * ws[16 rows of v, s]                         (fp32)
//     y[m, 16 rows of v] = sx[m] * sum[v][i] + bias                       (no lane reduction)
//   One convert-and-scale per block_size / 4 vpdpbusd (32 at block 128) where the small-M
//   layout pays one per block_size / 64 (2): 2.5x faster at M 512 (Qwen3-0.6B gate_up, 1 thread).
//
// The int32 lanes never overflow, and their conversion to fp32 is exact: a lane's block sum is
// at most 2 * 127 * block_size (u <= 2) plus |negsum| <= 127 * block_size, < 2^24 for block
// sizes to 32K.

#include "ternary_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#ifdef TERNARY_CPU_KERNELS
#include <cpuid.h>
#include <immintrin.h>
// gcc 12's AVX-512 headers: see ternary_cpu_kernels.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define TERNARY_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,fma,f16c")))
#endif

namespace ternary_cpu {

W8Plan make_w8_plan(int64_t K, int64_t block_size, int64_t k_offset, int64_t width) {
  W8Plan p;
  p.width = width;
  p.chunks = (K + width - 1) / width;
  int64_t j = 0;
  while (j < K) {
    const int64_t block = (k_offset + j) / block_size;
    const int64_t j1 = std::min(K, (block + 1) * block_size - k_offset);
    const int64_t e0 = static_cast<int64_t>(p.entry_chunk.size());
    for (int64_t c = j / width; c <= (j1 - 1) / width; ++c) p.entry_chunk.push_back(c);
    p.segments.push_back({block, e0, static_cast<int64_t>(p.entry_chunk.size()), j, j1});
    j = j1;
  }
  return p;
}

int64_t w8_tile_rows(int64_t K, int64_t bytes) {
  const int64_t row = (K + kW8Chunk - 1) / kW8Chunk * kW8Chunk;  // a tile row's u8 bytes
  return std::max<int64_t>(32, bytes / row / 32 * 32);
}

#ifdef TERNARY_CPU_KERNELS

bool cpu_w2a8_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

namespace {

constexpr int kW8Rows = 4;  // W rows of a register block

TERNARY_VNNI inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The decoder's constants: vpsrlvw counts (2q in 128-bit lane q), the 2-bit mask, code -> u.
struct Decoder {
  __m512i shifts, three, lut;
};
TERNARY_VNNI inline Decoder decoder() {
  return {_mm512_set_epi32(0x00060006, 0x00060006, 0x00060006, 0x00060006, 0x00040004, 0x00040004, 0x00040004,
                           0x00040004, 0x00020002, 0x00020002, 0x00020002, 0x00020002, 0, 0, 0, 0),
          _mm512_set1_epi8(3),
          // bytes 0..3 of each 128-bit lane: u of codes 00 (0), 01 (+1), 10 (-1), 11 (reserved: 0)
          _mm512_set4_epi32(0, 0, 0, 0x01000201)};
}
// 64 weights from 16 packed bytes as u = w + 1, byte 16q + j = weight 4j + q.
TERNARY_VNNI inline __m512i decode_u(const uint8_t* bytes, const Decoder& d) {
  const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  return _mm512_shuffle_epi8(d.lut, _mm512_and_si512(_mm512_srlv_epi16(b, d.shifts), d.three));
}

// The W rows of one register block: their codes (packed row or tile row) and fp32 scales [S].
struct BlockRows {
  const uint8_t* w[kW8Rows];
  const float* ws[kW8Rows];
};

// y[m0 .. m0 + MT) x [n0 .. n0 + valid) of one register block (module header).
//   DECODE: rows.w[r] a packed row (16 bytes a chunk), else a tile row [E, 64] u8.
template <int MT, bool DECODE>
TERNARY_VNNI void w8_block(const W8Problem& p, const BlockRows& rows, int64_t m0, int64_t n0, int64_t valid,
                           float* y) {
  const W8Plan& plan = *p.plan;
  const Decoder dec = decoder();
  const int8_t* x[MT];
  for (int i = 0; i < MT; ++i) x[i] = p.xe + (m0 + i) * p.E * kW8Chunk;
  __m512 sum[kW8Rows][MT];
  for (int r = 0; r < kW8Rows; ++r)
    for (int i = 0; i < MT; ++i) sum[r][i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < p.S; ++s) {
    const W8Segment& seg = plan.segments[s];
    __m512i acc[kW8Rows][MT];
    for (int i = 0; i < MT; ++i) {
      const __m512i start = _mm512_maskz_loadu_epi32(1, p.negsum + (m0 + i) * p.S + s);
      for (int r = 0; r < kW8Rows; ++r) acc[r][i] = start;
    }
    const int64_t c0 = plan.entry_chunk[seg.e0];
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      __m512i u[kW8Rows];
      for (int r = 0; r < kW8Rows; ++r) {
        if constexpr (DECODE) u[r] = decode_u(rows.w[r] + 16 * (c0 + e - seg.e0), dec);
        else u[r] = _mm512_load_si512(rows.w[r] + e * kW8Chunk);
      }
      for (int i = 0; i < MT; ++i) {
        const __m512i xv = _mm512_load_si512(x[i] + e * kW8Chunk);
        for (int r = 0; r < kW8Rows; ++r) acc[r][i] = _mm512_dpbusd_epi32(acc[r][i], u[r], xv);
      }
    }
    for (int r = 0; r < kW8Rows; ++r) {
      const __m512 ws = _mm512_set1_ps(rows.ws[r][s]);
      for (int i = 0; i < MT; ++i) sum[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][i]), ws, sum[r][i]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    const float sx = p.sx[m0 + i];
    for (int r = 0; r < valid; ++r)
      y[(m0 + i) * p.N + n0 + r] = sx * _mm512_reduce_add_ps(sum[r][i]) + (p.bias ? p.bias[n0 + r] : 0.f);
  }
}

// Every x row over one register block, MT at a time (remainders by smaller MT).
template <int MT, bool DECODE>
TERNARY_VNNI void w8_all_m(const W8Problem& p, const BlockRows& rows, int64_t n0, int64_t valid, float* y) {
  int64_t m0 = 0;
  for (; m0 + MT <= p.M; m0 += MT) w8_block<MT, DECODE>(p, rows, m0, n0, valid, y);
  if constexpr (MT > 1) {
    const int64_t left = p.M - m0;
    if (left == 2 && MT > 2) w8_block<2, DECODE>(p, rows, m0, n0, valid, y);
    else
      for (; m0 < p.M; ++m0) w8_block<1, DECODE>(p, rows, m0, n0, valid, y);
  }
}

// 16 elements of a row of x in its dtype (KIND 0 fp32, 1 bf16, 2 fp16) as fp32 (exact), 0 outside m.
template <int KIND>
TERNARY_VNNI inline __m512 load_f32(const void* x, int64_t k, __mmask16 m) {
  if constexpr (KIND == 0) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + k);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + k);
    return KIND == 1 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
  }
}

TERNARY_VNNI inline __mmask16 lanes16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : left > 0 ? __mmask16((1u << left) - 1) : __mmask16(0);
}

// xq of 16 elements as int32, clamped to +-127: x / sx rounded half to even, the IEEE quotient's
// rounding bit for bit. The product t = x * fl(1 / sx) is within |t| 2^-22 of the quotient (two
// roundings of 2^-24 each, plus the quotient's own), so both round to the same integer unless t
// lies within that of a half-integer: only then (about one vector in a thousand on random rows;
// always on ties) is the vector divided. `fast` false (1 / sx not finite): divide always.
TERNARY_VNNI inline __m512i quantize16(__m512 xv, __m512 vs, __m512 vinv, bool fast) {
  __m512 v;
  if (fast) {
    v = _mm512_mul_ps(xv, vinv);
    asm("" : "+v"(v));
    const __m512 frac = _mm512_sub_ps(v, _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    const __m512 dist = _mm512_abs_ps(_mm512_sub_ps(frac, _mm512_set1_ps(0.5f)));
    if (_mm512_cmp_ps_mask(dist, _mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(0x1p-21f)), _CMP_LE_OQ))
      v = _mm512_div_ps(xv, vs);
  } else {
    v = _mm512_div_ps(xv, vs);
  }
  const __m512i r = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_max_epi32(_mm512_set1_epi32(-127), _mm512_min_epi32(_mm512_set1_epi32(127), r));
}

}  // namespace

TERNARY_VNNI float w8_quantize_row(const float* x, int64_t K, int8_t* q) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + k)));
  }
  // as torch: fp32 absmax / 127 (IEEE division), 1 where that is 0
  float sx = _mm512_reduce_max_ps(amax) / 127.0f;
  if (!(sx > 0.f)) sx = 1.f;
  // x / sx must be the IEEE quotient, rounded half to even like torch.round (quantize16)
  const float inv = 1.f / sx;
  const bool fast = std::isfinite(inv);  // a subnormal sx: 1 / sx overflows, divide all
  const __m512 vs = _mm512_set1_ps(sx), vinv = _mm512_set1_ps(inv);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = lanes16(K - k);
    _mm512_mask_cvtepi32_storeu_epi8(q + k, m, quantize16(_mm512_maskz_loadu_ps(m, x + k), vs, vinv, fast));
  }
  return sx;
}

TERNARY_VNNI void w8_widen_row(const void* x, int kind, int64_t K, float* out) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = lanes16(K - k);
    const __m512 v = kind == 0 ? load_f32<0>(x, k, m) : kind == 1 ? load_f32<1>(x, k, m) : load_f32<2>(x, k, m);
    _mm512_mask_storeu_ps(out + k, m, v);
  }
}

TERNARY_VNNI void w8_entries_row(const W8Plan& plan, const int8_t* q, int8_t* xe_row, int32_t* negsum_row) {
  alignas(64) static const uint8_t kPerm[64] = {
      // byte 16q + j takes column 4j + q (the decoder's order)
      0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49,
      53, 57, 61, 2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 3, 7, 11, 15, 19, 23, 27, 31, 35,
      39, 43, 47, 51, 55, 59, 63};
  const __m512i perm = _mm512_load_si512(kPerm);
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const W8Segment& seg = plan.segments[s];
    int32_t total = 0;
    for (int64_t j = seg.j0; j < seg.j1; ++j) total += q[j];
    negsum_row[s] = -total;
    if (plan.width != kW8Chunk) {
      // width 4, in column order (the tile kernel broadcasts an entry's 4 bytes): the segment's
      // chunks are consecutive columns, then the columns outside it in its first and last
      // entry zeroed
      const int64_t c0 = plan.entry_chunk[seg.e0], n = seg.e1 - seg.e0;
      int8_t* dst = xe_row + seg.e0 * 4;
      std::memcpy(dst, q + c0 * 4, n * 4);
      for (int64_t j = c0 * 4; j < seg.j0; ++j) dst[j - c0 * 4] = 0;
      for (int64_t j = seg.j1; j < (c0 + n) * 4; ++j) dst[j - c0 * 4] = 0;
      continue;
    }
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      const int64_t base = plan.entry_chunk[e] * kW8Chunk;
      const int64_t lo = std::max<int64_t>(seg.j0 - base, 0), hi = std::min<int64_t>(seg.j1 - base, kW8Chunk);
      const __mmask64 lanes = (hi == 64 ? ~0ull : (1ull << hi) - 1) & (~0ull << lo);
      _mm512_store_si512(xe_row + e * kW8Chunk, _mm512_permutexvar_epi8(perm, _mm512_maskz_loadu_epi8(lanes, q + base)));
    }
  }
}

TERNARY_VNNI void w8_rows_decode(const W8Problem& p, int64_t n0, int64_t n1, float* y) {
  const std::vector<uint8_t> zero_row(p.row_bytes, 0);
  std::vector<float> ws(kW8Rows * p.S);
  for (int64_t b0 = n0; b0 < n1; b0 += kW8Rows) {
    const int64_t valid = std::min<int64_t>(kW8Rows, n1 - b0);
    BlockRows rows;
    for (int r = 0; r < kW8Rows; ++r) {
      const bool real = r < valid;
      rows.w[r] = real ? p.row(b0 + r) : zero_row.data();
      rows.ws[r] = ws.data() + r * p.S;
      for (int64_t s = 0; s < p.S; ++s)
        ws[r * p.S + s] = real ? half_to_float(p.scale[(b0 + r) * p.lds + p.plan->segments[s].block]) : 0.f;
    }
    // 2 x rows a group: 4 x 2 int32 accumulators and 4 x 2 fp32 sums, the decoded codes and the
    // decoder's constants fit the 32 zmm; more x rows decode the codes again, once a group
    w8_all_m<2, true>(p, rows, b0, valid, y);
  }
}

namespace {

// fp32 -> bf16 bits, rounded to nearest even, NaN to 0x7FC0: c10's round_to_nearest_even, in
// integer ops (a VNNI CPU need not have AVX512-BF16's vcvtneps2bf16).
TERNARY_VNNI inline __m256i bf16_rne(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_mask_mov_epi32(_mm512_add_epi32(u, bias), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                          _mm512_set1_epi32(0x7FC00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
// 16 fp32 results to y + at in y's dtype (KIND 0 fp32, 1 bf16, 2 fp16), lanes `mask`.
template <int KIND>
TERNARY_VNNI inline void store_y(void* y, int64_t at, __mmask16 mask, __m512 v) {
  if constexpr (KIND == 0) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + at, mask, v);
  } else {
    const __m256i h = KIND == 1 ? bf16_rne(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + at, mask, h);
  }
}

// One register block of the tile kernel: 16 NV W rows (lanes) x MT x rows, over all of K.
//   tile: [NV][G4, 16, 4] u8 at stride ldg (a 16-row group's bytes); ws: [NV][S, 16] fp32;
//   x4: [M, E] int32 (4 xq bytes an entry)
template <int NV, int MT, int KIND>
TERNARY_VNNI void w8_tile_block(const W8Problem& p, const uint8_t* tile, int64_t ldg, const float* ws, int64_t m0,
                                int64_t n0, int64_t valid, void* y) {
  const W8Plan& plan = *p.plan;
  const int32_t* x4 = reinterpret_cast<const int32_t*>(p.xe);
  __m512 sum[NV][MT];
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < MT; ++i) sum[v][i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < p.S; ++s) {
    const W8Segment& seg = plan.segments[s];
    __m512i acc[NV][MT];
    for (int i = 0; i < MT; ++i) {
      const __m512i start = _mm512_set1_epi32(p.negsum[(m0 + i) * p.S + s]);
      for (int v = 0; v < NV; ++v) acc[v][i] = start;
    }
    const uint8_t* w = tile + (plan.entry_chunk[seg.e0] - seg.e0) * 64;  // entry e's group at w + 64 e
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      __m512i u[NV];
      for (int v = 0; v < NV; ++v) u[v] = _mm512_load_si512(w + v * ldg + e * 64);
      for (int i = 0; i < MT; ++i) {
        const __m512i xb = _mm512_set1_epi32(x4[(m0 + i) * p.E + e]);
        for (int v = 0; v < NV; ++v) acc[v][i] = _mm512_dpbusd_epi32(acc[v][i], u[v], xb);
      }
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 wsv = _mm512_load_ps(ws + (v * p.S + s) * 16);
      for (int i = 0; i < MT; ++i) sum[v][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[v][i]), wsv, sum[v][i]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int64_t lanes = std::clamp<int64_t>(valid - 16 * v, 0, 16);
    if (lanes == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
    const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(mask, p.bias + n0 + 16 * v) : _mm512_setzero_ps();
    for (int i = 0; i < MT; ++i)
      store_y<KIND>(y, (m0 + i) * p.N + n0 + 16 * v, mask,
              _mm512_fmadd_ps(sum[v][i], _mm512_set1_ps(p.sx[m0 + i]), bias));
  }
}

template <int NV, int KIND>
TERNARY_VNNI void w8_tile_all_m(const W8Problem& p, const uint8_t* tile, int64_t ldg, const float* ws, int64_t n0,
                                int64_t valid, int64_t m_begin, int64_t m_end, void* y) {
  int64_t m0 = m_begin;
  // 2 x 16 W rows and 6 x rows: 12 int32 accumulators, 12 fp32 sums, 2 weight vectors and an x
  // broadcast in the 32 zmm; 12 vpdpbusd for 2 weight loads and 6 broadcasts
  for (; m0 + 6 <= m_end; m0 += 6) w8_tile_block<NV, 6, KIND>(p, tile, ldg, ws, m0, n0, valid, y);
  switch (m_end - m0) {
    case 5: w8_tile_block<NV, 5, KIND>(p, tile, ldg, ws, m0, n0, valid, y); break;
    case 4: w8_tile_block<NV, 4, KIND>(p, tile, ldg, ws, m0, n0, valid, y); break;
    case 3: w8_tile_block<NV, 3, KIND>(p, tile, ldg, ws, m0, n0, valid, y); break;
    case 2: w8_tile_block<NV, 2, KIND>(p, tile, ldg, ws, m0, n0, valid, y); break;
    case 1: w8_tile_block<NV, 1, KIND>(p, tile, ldg, ws, m0, n0, valid, y); break;
    default: break;
  }
}

// 16 W rows (their 16 packed bytes from byte 16c each: rows[r]) to 16 groups of 4 columns,
// group g = [16 rows, 4 u8] (64 bytes at out + 64 g): a 16 x 16 byte transpose (vpermt2b on four
// rows a zmm), then each packed byte spread over its row's dword (vpermb), its codes to the
// dword's bytes (vpmultishiftqb), code -> u (vpshufb).
TERNARY_VNNI void decode_group16(const uint8_t* const* rows, int64_t c, uint8_t* out, const Decoder& d) {
  __m512i a[4];  // a[k]: rows 4k .. 4k + 3, 16 bytes each
  for (int k = 0; k < 4; ++k) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 * k] + 16 * c)));
    for (int r = 1; r < 4; ++r)
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 * k + r] + 16 * c)), r);
    a[k] = v;
  }
  alignas(64) static const uint8_t kT[64] = {
      // byte 16 jj + r: row r's byte jj of the 4 (column group 4p + jj), r mod 8 of a source pair
      0,  16, 32, 48, 64, 80, 96, 112, 0,  16, 32, 48, 64, 80, 96, 112, 1,  17, 33, 49, 65, 81,
      97, 113, 1, 17, 33, 49, 65, 81, 97, 113, 2,  18, 34, 50, 66, 82, 98, 114, 2,  18, 34, 50,
      66, 82, 98, 114, 3,  19, 35, 51, 67, 83, 99, 115, 3,  19, 35, 51, 67, 83, 99, 115};
  alignas(64) static const uint8_t kSpread[4][64] = {
#define TERNARY_SPREAD(jj)                                                                              \
  {16 * jj + 0,  16 * jj + 0,  16 * jj + 0,  16 * jj + 0,  16 * jj + 1,  16 * jj + 1,  16 * jj + 1,  16 * jj + 1,  \
   16 * jj + 2,  16 * jj + 2,  16 * jj + 2,  16 * jj + 2,  16 * jj + 3,  16 * jj + 3,  16 * jj + 3,  16 * jj + 3,  \
   16 * jj + 4,  16 * jj + 4,  16 * jj + 4,  16 * jj + 4,  16 * jj + 5,  16 * jj + 5,  16 * jj + 5,  16 * jj + 5,  \
   16 * jj + 6,  16 * jj + 6,  16 * jj + 6,  16 * jj + 6,  16 * jj + 7,  16 * jj + 7,  16 * jj + 7,  16 * jj + 7,  \
   16 * jj + 8,  16 * jj + 8,  16 * jj + 8,  16 * jj + 8,  16 * jj + 9,  16 * jj + 9,  16 * jj + 9,  16 * jj + 9,  \
   16 * jj + 10, 16 * jj + 10, 16 * jj + 10, 16 * jj + 10, 16 * jj + 11, 16 * jj + 11, 16 * jj + 11, 16 * jj + 11, \
   16 * jj + 12, 16 * jj + 12, 16 * jj + 12, 16 * jj + 12, 16 * jj + 13, 16 * jj + 13, 16 * jj + 13, 16 * jj + 13, \
   16 * jj + 14, 16 * jj + 14, 16 * jj + 14, 16 * jj + 14, 16 * jj + 15, 16 * jj + 15, 16 * jj + 15, 16 * jj + 15}
      TERNARY_SPREAD(0), TERNARY_SPREAD(1), TERNARY_SPREAD(2), TERNARY_SPREAD(3)};
#undef TERNARY_SPREAD
  // byte t of a dword: its packed byte's bits [2t, 2t + 2) (the dword's copies at bytes 0..3 /
  // 4..7 of the qword: bit offsets 8b + 2t)
  const __m512i shift = _mm512_set1_epi64(0x3E342A201E140A00ll);  // bytes 0, 10, 20, 30, 32, 42, 52, 62
  const __m512i t0 = _mm512_load_si512(kT);
  const __mmask64 high_rows = 0xFF00FF00FF00FF00ull;  // r >= 8: from rows 8..15 (a[2], a[3])
  for (int pq = 0; pq < 4; ++pq) {
    const __m512i idx = _mm512_add_epi8(t0, _mm512_set1_epi8(static_cast<char>(4 * pq)));
    const __m512i z = _mm512_mask_blend_epi8(high_rows, _mm512_permutex2var_epi8(a[0], idx, a[1]),
                                             _mm512_permutex2var_epi8(a[2], idx, a[3]));
    for (int jj = 0; jj < 4; ++jj) {
      const __m512i spread = _mm512_permutexvar_epi8(_mm512_load_si512(kSpread[jj]), z);
      const __m512i codes = _mm512_and_si512(_mm512_multishift_epi64_epi8(shift, spread), d.three);
      _mm512_store_si512(out + 64 * (4 * pq + jj), _mm512_shuffle_epi8(d.lut, codes));
    }
  }
}

}  // namespace

TERNARY_VNNI void w8_rows_tile(const W8Problem& p, int64_t n0, int64_t n1, uint8_t* tile, float* ws_tile, void* y,
                               int y_kind) {
  const W8Plan& plan = *p.plan;
  const Decoder dec = decoder();
  const int64_t rows = n1 - n0, groups = (rows + 15) / 16;
  const int64_t c64 = p.row_bytes / 16, ldg = c64 * 16 * 64;  // chunks of 64 columns; a group's bytes
  const std::vector<uint8_t> zero_row(p.row_bytes, 0);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* src[16];
    for (int r = 0; r < 16; ++r) src[r] = 16 * g + r < rows ? p.row(n0 + 16 * g + r) : zero_row.data();
    for (int64_t c = 0; c < c64; ++c) decode_group16(src, c, tile + g * ldg + c * 16 * 64, dec);
    // missing rows of the last group: scale 0
    for (int64_t s = 0; s < p.S; ++s)
      for (int r = 0; r < 16; ++r)
        ws_tile[(g * p.S + s) * 16 + r] =
            16 * g + r < rows ? half_to_float(p.scale[(n0 + 16 * g + r) * p.lds + plan.segments[s].block]) : 0.f;
  }
  // x rows in blocks of <= kXBlockBytes (L2, beside the tile), then 2 groups (32 W rows) a
  // register block, the block's x rows 6 at a time inside: without the blocks every pair of
  // groups streamed all of x from L3 (M 2048, K 1024: 2 MB a pair), and M 2048 ran below M 512
  constexpr int64_t kXBlockBytes = 256 * 1024;
  const int64_t mb = std::max<int64_t>(6, kXBlockBytes / std::max<int64_t>(p.E * 4, 1) / 6 * 6);
  for (int64_t m_begin = 0; m_begin < p.M; m_begin += mb) {
    const int64_t m_end = std::min(p.M, m_begin + mb);
    for (int64_t g = 0; g < groups; g += 2) {
      const int64_t valid = std::min<int64_t>(32, rows - 16 * g);
      const uint8_t* t = tile + g * ldg;
      const float* w = ws_tile + g * p.S * 16;
      const int64_t n = n0 + 16 * g;
      if (g + 1 < groups) {
        if (y_kind == 0) w8_tile_all_m<2, 0>(p, t, ldg, w, n, valid, m_begin, m_end, y);
        else if (y_kind == 1) w8_tile_all_m<2, 1>(p, t, ldg, w, n, valid, m_begin, m_end, y);
        else w8_tile_all_m<2, 2>(p, t, ldg, w, n, valid, m_begin, m_end, y);
      } else {
        if (y_kind == 0) w8_tile_all_m<1, 0>(p, t, ldg, w, n, valid, m_begin, m_end, y);
        else if (y_kind == 1) w8_tile_all_m<1, 1>(p, t, ldg, w, n, valid, m_begin, m_end, y);
        else w8_tile_all_m<1, 2>(p, t, ldg, w, n, valid, m_begin, m_end, y);
      }
    }
  }
}

// ---- The AMX kernel's pieces (the folded W2A8 mode; its driver and the numerics: ternary_cpu.cpp) ----

bool cpu_amx_int8_supported() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
}

namespace {

template <int KIND>
TERNARY_VNNI float quantize_row_u8(const void* x, int64_t K, uint8_t* a, int64_t lda) {
  __m512 amax[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)  // four chains: one vmaxps chain waits its latency a vector
    for (int i = 0; i < 4; ++i)
      amax[i] = _mm512_max_ps(amax[i], _mm512_abs_ps(load_f32<KIND>(x, k + 16 * i, __mmask16(0xFFFF))));
  for (; k < K; k += 16) amax[0] = _mm512_max_ps(amax[0], _mm512_abs_ps(load_f32<KIND>(x, k, lanes16(K - k))));
  float sx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(amax[0], amax[1]), _mm512_max_ps(amax[2], amax[3]))) / 127.0f;  // as torch: fp32 absmax / 127, 1 where that is 0
  if (!(sx > 0.f)) sx = 1.f;
  const float inv = 1.f / sx;
  const bool fast = std::isfinite(inv);
  const __m512 vs = _mm512_set1_ps(sx), vinv = _mm512_set1_ps(inv);
  // 64 a step: four int32 vectors packed to bytes (vpackssdw / vpacksswb interleave the 128-bit
  // lanes; vpermd puts them back in order), + 128 as xor 0x80, one store; past K the loads give 0
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (k = 0; k < lda; k += 64) {
    __m512i r[4];
    for (int i = 0; i < 4; ++i) r[i] = quantize16(load_f32<KIND>(x, k + 16 * i, lanes16(K - k - 16 * i)), vs, vinv, fast);
    const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(r[0], r[1]), _mm512_packs_epi32(r[2], r[3]));
    const __m512i v = _mm512_xor_si512(_mm512_permutexvar_epi32(order, b), flip);
    if (lda - k >= 64) _mm512_storeu_si512(a + k, v);
    else _mm512_mask_storeu_epi8(a + k, (1ull << (lda - k)) - 1, v);
  }
  return sx;
}

}  // namespace

TERNARY_VNNI float w8_quantize_row_u8(const void* x, int kind, int64_t K, uint8_t* a, int64_t lda) {
  return kind == 0 ? quantize_row_u8<0>(x, K, a, lda)
         : kind == 1 ? quantize_row_u8<1>(x, K, a, lda)
                     : quantize_row_u8<2>(x, K, a, lda);
}

namespace {

// The folded scales of 16 rows, a row a lane (fold_block_scales' arithmetic, fp32):
// S = max_b |s_b|, q_b = rne(s_b / S * 127) (0 where that is NaN: S = 0, or a NaN scale),
// ws = S / 127. sbits [S, 16] fp16 bits; writes tbl [S + 1, 16] ({0, q, -q, 0} as a dword a
// row; block S zero) and ws [valid].
TERNARY_VNNI void fold16(const uint16_t* sbits, int64_t S, uint32_t* tbl, float* ws, int valid) {
  const auto load = [&](int64_t b) TERNARY_VNNI {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sbits + b * 16)));
  };
  __m512 smax = _mm512_setzero_ps();
  for (int64_t b = 0; b < S; ++b) smax = _mm512_max_ps(smax, _mm512_abs_ps(load(b)));
  const __m512 k127 = _mm512_set1_ps(127.f);
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int64_t b = 0; b < S; ++b) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_div_ps(load(b), smax), k127),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q = _mm512_cvtps_epi32(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r));
    const __m512i d = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(q, byte), 8),
                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), q), byte), 16));
    _mm512_storeu_si512(tbl + b * 16, d);
  }
  _mm512_storeu_si512(tbl + S * 16, _mm512_setzero_si512());
  _mm512_mask_storeu_ps(ws, static_cast<__mmask16>((1u << valid) - 1), _mm512_div_ps(smax, k127));
}

}  // namespace

TERNARY_VNNI void vnni_rows_s8(const W8Problem& p, const VnniPlan& plan, int64_t kc, int64_t n0, int64_t n1,
                               int8_t* tile, int32_t* comp, float* ws) {
  const int64_t quads = kc / 4, rows = n1 - n0, groups = (rows + kVnniCols - 1) / kVnniCols, S = plan.S;
  constexpr int kHalves = kVnniCols / 16;
  const std::vector<uint8_t> zero_row(p.row_bytes, 0);
  // A half's 16 rows, row r in qword r of (a, b) (8 packed bytes: 32 columns). Per packed byte:
  //   vpermt2b    row r's byte into all four bytes of dword r (index byte 4r + i: 8r + the byte)
  //   vpmultishiftqb   code i (bits 2i, 2i + 1 of that byte) to the low bits of byte i
  //   vpternlogd  (& 3) | 4 * (r % 4): the index of row r's code in its 128-bit lane's table
  //   vpshufb     the table: bytes 4r .. 4r + 3 = {0, q, -q, 0} for codes 00, 01, 10, 11
  //               (q: row r's folded scale of the block; the reserved 11 reads as 0, as
  //               format.unpack_ternary reads it)
  // 4 instructions per 64 weights, 3 of them on the shuffle port.
  alignas(64) uint8_t idx[64], sh[64], pos[64];
  for (int k = 0; k < 64; ++k) {
    idx[k] = static_cast<uint8_t>(8 * (k / 4));
    sh[k] = static_cast<uint8_t>(8 * (k % 8) + 2 * (k % 4));
    pos[k] = static_cast<uint8_t>(4 * ((k / 4) % 4));
  }
  const __m512i base = _mm512_load_si512(idx), ctrl = _mm512_load_si512(sh), lane_pos = _mm512_load_si512(pos);
  const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  __m512i index[8];
  for (int byte = 0; byte < 8; ++byte) index[byte] = _mm512_add_epi8(base, _mm512_set1_epi8(static_cast<char>(byte)));
  // tbl[(h * (S + 1) + b) * 16 + r]: the table dword of block b for the group's row 16h + r;
  // block S (the columns past K) and missing rows all zero. The scales are folded 16 rows at a
  // time, a row a lane (fold16): a row at a time, with the table's scalar stores, was a sixth of
  // the decode.
  std::vector<uint32_t> tbl(kHalves * (S + 1) * 16);
  std::vector<uint16_t> sbits(S * 16);  // [S, 16] the half's fp16 scales, block-major
  for (int64_t g = 0; g < groups; ++g) {
    alignas(64) const uint8_t* src[kHalves][16];
    for (int h = 0; h < kHalves; ++h) {
      const int64_t row0 = kVnniCols * g + 16 * h;
      for (int r = 0; r < 16; ++r) {
        src[h][r] = row0 + r < rows ? p.row(n0 + row0 + r) : zero_row.data();
        const uint16_t* srow = p.scale + (n0 + row0 + r) * p.lds;
        for (int64_t b = 0; b < S; ++b) sbits[b * 16 + r] = row0 + r < rows ? srow[b] : uint16_t{0};
      }
      const int valid = static_cast<int>(std::clamp<int64_t>(rows - row0, 0, 16));
      fold16(sbits.data(), S, tbl.data() + h * (S + 1) * 16, ws + row0, valid);
    }
    int8_t* out = tile + g * quads * 4 * kVnniCols;  // [quads, kVnniCols, 4]
    // a half at a time over all of K: its row sums stay in one register
    for (int h = 0; h < kHalves; ++h) {
      const uint32_t* th = tbl.data() + h * (S + 1) * 16;
      __m512i sum = _mm512_setzero_si512();
      for (int64_t c = 0; c < kc / kChunk; ++c) {
        const int64_t q0 = 16 * c;  // the chunk's first pair of columns (VnniPlan), its quads 8c ..
        const __m512i off = _mm512_set1_epi64(8 * c);
        const __m512i a = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_load_si512(src[h]), off), nullptr, 1);
        const __m512i bb = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_load_si512(src[h] + 8), off), nullptr, 1);
        int8_t* dst = out + 8 * c * 4 * kVnniCols + 64 * h;
        if (plan.b1[q0 + 15] == plan.b0[q0]) {  // the chunk in one block: one table
          const __m512i t0 = _mm512_loadu_si512(th + plan.b0[q0] * 16);
#pragma GCC unroll 8
          for (int byte = 0; byte < 8; ++byte) {
            const __m512i z = _mm512_permutex2var_epi8(a, index[byte], bb);
            const __m512i at = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(ctrl, z), three, lane_pos, 0xEA);
            const __m512i v = _mm512_shuffle_epi8(t0, at);
            sum = _mm512_dpbusd_epi32(sum, one, v);
            _mm512_store_si512(dst + byte * 4 * kVnniCols, v);
          }
        } else {  // a block boundary in the chunk: byte i of each dword reads its column's block
          for (int byte = 0; byte < 8; ++byte) {
            const int64_t quad = 8 * c + byte;
            const int32_t blk[4] = {plan.b0[2 * quad], plan.b1[2 * quad], plan.b0[2 * quad + 1], plan.b1[2 * quad + 1]};
            const __m512i z = _mm512_permutex2var_epi8(a, index[byte], bb);
            const __m512i at = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(ctrl, z), three, lane_pos, 0xEA);
            __m512i v = _mm512_shuffle_epi8(_mm512_loadu_si512(th + blk[0] * 16), at);
            for (int i = 1; i < 4; ++i)
              if (blk[i] != blk[0])
                v = _mm512_mask_blend_epi8(0x1111111111111111ull << i, v,
                                           _mm512_shuffle_epi8(_mm512_loadu_si512(th + blk[i] * 16), at));
            sum = _mm512_dpbusd_epi32(sum, one, v);
            _mm512_store_si512(dst + byte * 4 * kVnniCols, v);
          }
        }
      }
      // the u8 side is xq + 128: 128 * (the row's sum of w) comes off every dot (store_rows_w8)
      alignas(64) int32_t sums[16];
      _mm512_store_si512(sums, _mm512_slli_epi32(sum, 7));
      for (int r = 0; r < 16; ++r)
        if (kVnniCols * g + 16 * h + r < rows) comp[kVnniCols * g + 16 * h + r] = sums[r];
    }
  }
}

namespace {

// Keeps v as computed: no fused multiply-add across it (gcc contracts a * b + c by default), so
// each fp32 operation of the epilogue rounds once, as the reference's separate tensor ops do.
TERNARY_VNNI inline __m512 rounded(__m512 v) {
  asm("" : "+v"(v));
  return v;
}

template <int KIND>
TERNARY_VNNI void store_w8(const int32_t* c, int64_t ldc, int64_t rows, int64_t cols, const float* sx,
                           const int32_t* comp, const float* ws, const float* bias, void* y, int64_t ldy, bool stream) {
  for (int64_t i = 0; i < rows; ++i) {  // row by row: a row's stores fill its lines together
    const __m512 s = _mm512_set1_ps(sx[i]);
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - j)) - 1);
      const __m512i d = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mask, c + i * ldc + j),
                                         _mm512_maskz_loadu_epi32(mask, comp + j));
      __m512 v = rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(d), s));
      v = rounded(_mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, ws + j)));
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + j));
      const int64_t at = i * ldy + j;
      if constexpr (KIND == 0) {
        float* dst = static_cast<float*>(y) + at;
        if (stream && mask == 0xFFFF && reinterpret_cast<uintptr_t>(dst) % 64 == 0) _mm512_stream_ps(dst, v);
        else _mm512_mask_storeu_ps(dst, mask, v);
      } else {
        const __m256i h = KIND == 1 ? bf16_rne(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        uint16_t* dst = static_cast<uint16_t*>(y) + at;
        if (stream && mask == 0xFFFF && reinterpret_cast<uintptr_t>(dst) % 32 == 0)
          _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), h);
        else _mm256_mask_storeu_epi16(dst, mask, h);
      }
    }
  }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: visible before the op returns
}

}  // namespace

TERNARY_VNNI void store_rows_w8(const int32_t* c, int64_t ldc, int64_t rows, int64_t cols, const float* sx,
                                const int32_t* comp, const float* ws, const float* bias, void* y, int64_t ldy,
                                int y_kind, bool stream) {
  if (y_kind == 0) store_w8<0>(c, ldc, rows, cols, sx, comp, ws, bias, y, ldy, stream);
  else if (y_kind == 1) store_w8<1>(c, ldc, rows, cols, sx, comp, ws, bias, y, ldy, stream);
  else store_w8<2>(c, ldc, rows, cols, sx, comp, ws, bias, y, ldy, stream);
}

#else  // not x86-64: no kernels (ternary_cpu.h), the op refuses to run

bool cpu_w2a8_supported() { return false; }
bool cpu_amx_int8_supported() { return false; }

#endif

}  // namespace ternary_cpu
