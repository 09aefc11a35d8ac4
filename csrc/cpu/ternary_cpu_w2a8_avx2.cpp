// The W2A8 CPU kernel's AVX2 code (AVX2 + FMA + F16C: x86-64 CPUs without AVX512-VNNI, such as
// AMD Zen 1-3 and Intel client cores), for torch.ops.ternary_serve.gemm_w2a8 (the op, its checks
// and threads: ternary_cpu.cpp; the numerics: ternary_plugin/activations.py). The same formula and
// the layouts of the AVX512-VNNI code's small-M regime (ternary_cpu_w2a8.cpp, whose header says
// why): codes as u = w + 1 in {0, 1, 2}, x by entries of 64 (byte 16q + j = column 4j + q) in
// both regimes, negsum as each segment's int32 start, one fp32 product per (lanes, segment). Every block dot is
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
//   large M (w8_rows_tile_avx2): W rows decoded once into a u8 tile of 16-row groups, as the
//     VNNI tile kernel's but in k-steps of an entry: [E, 16 dwords, 16 rows, 4 u8] (each row's
//     entry decoded as above, then two 8 x 8 dword transposes). A register block is one group (2
//     vectors of 8 row lanes) x 5 x rows, x broadcast a dword (4 xq bytes) at a time:
//       for segment s:   for entry runs of <= 4:   acc16[2][5] = 0
//           for k-step d:   acc16[v][i] += vpmaddubsw(u[v, d], broadcast(xe[m_i, d]))
//         part[v][i] += vpmaddwd(acc16[v][i], 1)        (int32; starts at negsum[m_i, s])
//         sum[v][i] += float(part[v][i]) * ws[8 rows of v, s]                          (fp32)
//       y[m, 8 rows of v] = sx[m] * sum[v][i] + bias                        (no lane reduction)
//     The int16 pair sums hold 64 k-steps (|u0 x0 + u1 x1| <= 508: 32512), so a 128-weight block
//     pays one widening per 32 vpmaddubsw, and the tile is read, not decoded, per x row. 1.3x the
//     earlier tile kernel (4 rows x 2 x rows of row-major entries, one widening and one lane
//     reduction per 2 entries) at M 128-512 on Qwen3-0.6B shapes, 1.3-1.6x on MiniLM's (Zen 3).
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

namespace {

// One element as the vector code below quantizes it: x / sx by division, rounded half to even
// (the default rounding mode) like torch.round, clamped to +-127; NaN -127 (vcvtps2dq's INT_MIN,
// clamped).
inline int8_t quantize1(float x, float sx) {
  const float r = std::nearbyint(x / sx);
  return r == r ? static_cast<int8_t>(std::clamp(r, -127.f, 127.f)) : -127;
}

// xq of 8 elements as int32, clamped to +-127: the VNNI code's quantize16 (ternary_cpu_w2a8.cpp
// says why x * fl(1 / sx) gives the quotient's rounding unless it lies within 2^-21 |t| of a
// half-integer, where the vector is divided).
TERNARY_W8_AVX2 inline __m256i quantize8(__m256 xv, __m256 vs, __m256 vinv, bool fast) {
  __m256 v;
  if (fast) {
    v = _mm256_mul_ps(xv, vinv);
    asm("" : "+x"(v));
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 frac = _mm256_sub_ps(v, _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    const __m256 dist = _mm256_and_ps(_mm256_sub_ps(frac, _mm256_set1_ps(0.5f)), abs_mask);
    const __m256 near = _mm256_cmp_ps(dist, _mm256_mul_ps(_mm256_and_ps(v, abs_mask), _mm256_set1_ps(0x1p-21f)),
                                      _CMP_LE_OQ);
    if (_mm256_movemask_ps(near)) v = _mm256_div_ps(xv, vs);
  } else {
    v = _mm256_div_ps(xv, vs);
  }
  const __m256i r = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return _mm256_max_epi32(_mm256_set1_epi32(-127), _mm256_min_epi32(_mm256_set1_epi32(127), r));
}

}  // namespace

TERNARY_W8_AVX2 float w8_quantize_row_avx2(const float* x, int64_t K, int8_t* q) {
  // absmax with NaN skipped (vmaxps returns its second operand, amax, where x is NaN), as
  // std::max(amax, |x|) does in the tail
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 am[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)  // four chains: one vmaxps chain waits its latency a vector
    for (int i = 0; i < 4; ++i) am[i] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k + 8 * i), abs_mask), am[i]);
  for (; k + 8 <= K; k += 8) am[0] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask), am[0]);
  const __m256 m8 = _mm256_max_ps(_mm256_max_ps(am[0], am[1]), _mm256_max_ps(am[2], am[3]));
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  // as torch: fp32 absmax / 127 (IEEE division), 1 where that is 0
  float sx = amax / 127.0f;
  if (!(sx > 0.f)) sx = 1.f;
  const float inv = 1.f / sx;
  const bool fast = std::isfinite(inv);  // a subnormal sx: 1 / sx overflows, divide all
  const __m256 vs = _mm256_set1_ps(sx), vinv = _mm256_set1_ps(inv);
  // 32 a step: four int32 vectors packed to bytes (vpackssdw / vpacksswb interleave the 128-bit
  // halves; vpermd puts the dwords back in order)
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (k = 0; k + 32 <= K; k += 32) {
    __m256i r[4];
    for (int i = 0; i < 4; ++i) r[i] = quantize8(_mm256_loadu_ps(x + k + 8 * i), vs, vinv, fast);
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_permutevar8x32_epi32(b, order));
  }
  for (; k < K; ++k) q[k] = quantize1(x[k], sx);
  return sx;
}

TERNARY_W8_AVX2 void w8_widen_row_avx2(const void* x, int kind, int64_t K, float* out) {
  if (kind == 0) {
    std::memcpy(out, x, K * sizeof(float));
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(x);
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + k));
    // bf16: the high half of an fp32
    _mm256_storeu_ps(out + k, kind == 1 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                                        : _mm256_cvtph_ps(v));
  }
  for (; k < K; ++k) {
    if (kind == 1) {
      const uint32_t bits = static_cast<uint32_t>(h[k]) << 16;
      std::memcpy(out + k, &bits, 4);
    } else {
      out[k] = _cvtsh_ss(h[k]);
    }
  }
}

// Width 64 (both AVX2 regimes): an entry's 64 columns (two ymm of q, zero past the segment) with
// byte 16q + j taking column 4j + q: a 4 x 4 byte transpose in each 128-bit half (vpshufb: a
// half's dword q holds its 4 values of j), then its dwords gathered across the halves (vpermd and
// a blend); the segment's sum by vpmaddubsw / vpmaddwd against ones.
TERNARY_W8_AVX2 void w8_entries_row_avx2(const W8Plan& plan, const int8_t* q, int8_t* xe_row, int32_t* negsum_row) {
  const __m256i by_q = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i a0 = _mm256_setr_epi32(0, 4, 0, 0, 1, 5, 0, 0), b0 = _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 1, 5);
  const __m256i a1 = _mm256_setr_epi32(2, 6, 0, 0, 3, 7, 0, 0), b1 = _mm256_setr_epi32(0, 0, 2, 6, 0, 0, 3, 7);
  const __m256i iota = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                        22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), k32 = _mm256_set1_epi8(32);
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const W8Segment& seg = plan.segments[s];
    __m256i total = _mm256_setzero_si256();
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      const int64_t base = plan.entry_chunk[e] * kW8Chunk;
      const int64_t lo = std::max<int64_t>(seg.j0 - base, 0), hi = std::min<int64_t>(seg.j1 - base, kW8Chunk);
      __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + base));
      __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + base + 32));
      if (lo > 0 || hi < kW8Chunk) {  // columns [lo, hi) of the entry: (lo > t) false, (hi > t) true
        const __m256i vlo = _mm256_set1_epi8(static_cast<char>(lo)), vhi = _mm256_set1_epi8(static_cast<char>(hi));
        const __m256i tb = _mm256_add_epi8(iota, k32);
        A = _mm256_and_si256(A, _mm256_andnot_si256(_mm256_cmpgt_epi8(vlo, iota), _mm256_cmpgt_epi8(vhi, iota)));
        B = _mm256_and_si256(B, _mm256_andnot_si256(_mm256_cmpgt_epi8(vlo, tb), _mm256_cmpgt_epi8(vhi, tb)));
      }
      const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, A), _mm256_maddubs_epi16(ones8, B));
      total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs, ones16));
      A = _mm256_shuffle_epi8(A, by_q);
      B = _mm256_shuffle_epi8(B, by_q);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xe_row + e * kW8Chunk),
                          _mm256_blend_epi32(_mm256_permutevar8x32_epi32(A, a0), _mm256_permutevar8x32_epi32(B, b0), 0xCC));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xe_row + e * kW8Chunk + 32),
                          _mm256_blend_epi32(_mm256_permutevar8x32_epi32(A, a1), _mm256_permutevar8x32_epi32(B, b1), 0xCC));
    }
    const __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    const __m128i t2 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    negsum_row[s] = -_mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 0xB1)));
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
//   w[r]: a packed row (16 bytes a chunk); ws[r]: [S] fp32
template <int MT>
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
        decode_u(w[r] + 16 * (c0 + e - seg.e0), dec, u0, u1);
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
    for (int64_t m = 0; m < p.M; ++m) w8_block<1>(p, w, wsr, m, b0, valid, y);
  }
}

namespace {

// 8 x 8 dwords transposed: r[i] holds dwords 0..7 of W row i; afterwards r[d] holds dword d of
// rows 0..7 (unpack by 32 and 64 bits inside the 128-bit halves, then the halves exchanged).
TERNARY_W8_AVX2 inline void transpose8x8(__m256i* r) {
  __m256i t[8], q[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);      // dwords 0, 1 | 4, 5 of rows 2k, 2k + 1
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);  // dwords 2, 3 | 6, 7
  }
  for (int h = 0; h < 2; ++h) {  // rows 0..3, then 4..7
    q[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);      // dword 0 | 4 of 4 rows
    q[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);      // 1 | 5
    q[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);  // 2 | 6
    q[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);  // 3 | 7
  }
  for (int d = 0; d < 4; ++d) {
    r[d] = _mm256_permute2x128_si256(q[d], q[4 + d], 0x20);
    r[4 + d] = _mm256_permute2x128_si256(q[d], q[4 + d], 0x31);
  }
}

constexpr int kTileRows = 16;         // W rows of a tile group: two ymm of 8 row lanes a dword
constexpr int64_t kTileStep = 64;     // a k-step's bytes in a group: 16 rows x 4 u8
constexpr int64_t kTileEntry = 16 * kTileStep;  // an entry's 16 k-steps

// One register block: the 16 W rows of a group (two vectors of 8 lanes) x MT x rows, all of K.
//   tg: the group's tile [E, 16 dwords, 16 rows, 4] u8; wsg: [S, 16] fp32; y: [M, N] fp32
template <int MT>
TERNARY_W8_AVX2 void w8_tile16_block(const W8Problem& p, const uint8_t* tg, const float* wsg, int64_t m0, int64_t n0,
                                     int64_t valid, float* y) {
  const W8Plan& plan = *p.plan;
  const int32_t* xd = reinterpret_cast<const int32_t*>(p.xe);  // [M, E, 16] dwords: 4 xq bytes each
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sum[2][MT];
  for (int v = 0; v < 2; ++v)
    for (int i = 0; i < MT; ++i) sum[v][i] = _mm256_setzero_ps();
  for (int64_t s = 0; s < p.S; ++s) {
    const W8Segment& seg = plan.segments[s];
    __m256i part[2][MT];  // the segment's int32 dots (negsum included)
    for (int i = 0; i < MT; ++i) part[0][i] = part[1][i] = _mm256_set1_epi32(p.negsum[(m0 + i) * p.S + s]);
    // int16 pair sums over at most 4 entries (64 k-steps x |u0 x0 + u1 x1| <= 508: 32512), then
    // widened by vpmaddwd: one widening per 32 vpmaddubsw at 128-weight blocks
    for (int64_t eb = seg.e0; eb < seg.e1; eb += 4) {
      const int64_t ee = std::min(seg.e1, eb + 4);
      __m256i acc[2][MT];
      for (int v = 0; v < 2; ++v)
        for (int i = 0; i < MT; ++i) acc[v][i] = _mm256_setzero_si256();
      for (int64_t e = eb; e < ee; ++e) {
        const uint8_t* w = tg + e * kTileEntry;
        const int32_t* x = xd + (m0 * p.E + e) * 16;
        // unrolled by 2 where gcc can: without it the blocks of few x rows ran ~6 % slower at M 3
        // (Zen 3), the 5-row block alike
#pragma GCC unroll 2
        for (int d = 0; d < 16; ++d) {
          const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + d * kTileStep));
          const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + d * kTileStep + 32));
          for (int i = 0; i < MT; ++i) {
            const __m256i xb = _mm256_set1_epi32(x[i * p.E * 16 + d]);
            acc[0][i] = _mm256_add_epi16(acc[0][i], _mm256_maddubs_epi16(w0, xb));
            acc[1][i] = _mm256_add_epi16(acc[1][i], _mm256_maddubs_epi16(w1, xb));
          }
        }
      }
      for (int v = 0; v < 2; ++v)
        for (int i = 0; i < MT; ++i) part[v][i] = _mm256_add_epi32(part[v][i], _mm256_madd_epi16(acc[v][i], ones));
    }
    for (int v = 0; v < 2; ++v) {
      const __m256 wsv = _mm256_load_ps(wsg + s * kTileRows + 8 * v);
      for (int i = 0; i < MT; ++i) sum[v][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[v][i]), wsv, sum[v][i]);
    }
  }
  for (int v = 0; v < 2; ++v) {
    const int64_t lanes = std::clamp<int64_t>(valid - 8 * v, 0, 8);
    if (lanes == 0) break;
    alignas(32) float b[8] = {};
    if (p.bias) std::memcpy(b, p.bias + n0 + 8 * v, lanes * sizeof(float));
    const __m256 bias = _mm256_load_ps(b);
    for (int i = 0; i < MT; ++i) {
      const __m256 out = _mm256_fmadd_ps(sum[v][i], _mm256_set1_ps(p.sx[m0 + i]), bias);
      float* dst = y + (m0 + i) * p.N + n0 + 8 * v;
      if (lanes == 8) {
        _mm256_storeu_ps(dst, out);
      } else {
        alignas(32) float o[8];
        _mm256_store_ps(o, out);
        std::memcpy(dst, o, lanes * sizeof(float));
      }
    }
  }
}

}  // namespace

int64_t w8_tile_rows_avx2(int64_t E, int64_t bytes) {
  return std::max<int64_t>(kTileRows, bytes / std::max<int64_t>(E * kW8Chunk, 1) / kTileRows * kTileRows);
}

TERNARY_W8_AVX2 void w8_rows_tile_avx2(const W8Problem& p, int64_t n0, int64_t n1, uint8_t* tile, float* ws_tile,
                                       float* y) {
  const Decoder dec = decoder();
  const W8Plan& plan = *p.plan;
  const int64_t rows = n1 - n0, groups = (rows + kTileRows - 1) / kTileRows, ldg = p.E * kTileEntry;
  const std::vector<uint8_t> zero_row(p.row_bytes, 0);  // codes 0 (u = 1), scale 0
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* src[kTileRows];
    for (int r = 0; r < kTileRows; ++r)
      src[r] = kTileRows * g + r < rows ? p.row(n0 + kTileRows * g + r) : zero_row.data();
    uint8_t* tg = tile + g * ldg;
    for (int64_t e = 0; e < p.E; ++e) {
      const int64_t c = plan.entry_chunk[e];
      for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7: their entry's u, transposed to k-steps
        __m256i lo[8], hi[8];
        for (int r = 0; r < 8; ++r) decode_u(src[8 * h + r] + 16 * c, dec, lo[r], hi[r]);
        transpose8x8(lo);
        transpose8x8(hi);
        for (int d = 0; d < 8; ++d) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(tg + e * kTileEntry + d * kTileStep + 32 * h), lo[d]);
          _mm256_store_si256(reinterpret_cast<__m256i*>(tg + e * kTileEntry + (8 + d) * kTileStep + 32 * h), hi[d]);
        }
      }
    }
    for (int64_t s = 0; s < p.S; ++s)
      for (int r = 0; r < kTileRows; ++r)
        ws_tile[(g * p.S + s) * kTileRows + r] =
            kTileRows * g + r < rows ? _cvtsh_ss(p.scale[(n0 + kTileRows * g + r) * p.lds + plan.segments[s].block])
                                     : 0.f;
  }
  // x rows in blocks of <= kXBlockBytes (L2, beside the tile), then a group (16 W rows) a
  // register block, 6 x rows at a time inside: 12 int16 accumulators, 2 weight vectors and an x
  // broadcast in the 16 ymm; 12 vpmaddubsw for 2 weight loads and 6 broadcasts
  constexpr int64_t kXBlockBytes = 128 * 1024;
  const int64_t mb = std::max<int64_t>(5, kXBlockBytes / std::max<int64_t>(p.E * kW8Chunk, 1) / 5 * 5);
  for (int64_t m_begin = 0; m_begin < p.M; m_begin += mb) {
    const int64_t m_end = std::min(p.M, m_begin + mb);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t valid = std::min<int64_t>(kTileRows, rows - kTileRows * g), n = n0 + kTileRows * g;
      const uint8_t* tg = tile + g * ldg;
      const float* wsg = ws_tile + g * p.S * kTileRows;
      int64_t m0 = m_begin;
      for (; m0 + 5 <= m_end; m0 += 5) w8_tile16_block<5>(p, tg, wsg, m0, n, valid, y);
      switch (m_end - m0) {
        case 4: w8_tile16_block<4>(p, tg, wsg, m0, n, valid, y); break;
        case 3: w8_tile16_block<3>(p, tg, wsg, m0, n, valid, y); break;
        case 2: w8_tile16_block<2>(p, tg, wsg, m0, n, valid, y); break;
        case 1: w8_tile16_block<1>(p, tg, wsg, m0, n, valid, y); break;
        default: break;
      }
    }
  }
}

#endif

}  // namespace ternary_cpu
