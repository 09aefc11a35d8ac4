// The CPU kernel's AVX-512 code (AVX512-F/BW/VL/DQ, VBMI, BF16), compiled with per-function
// target attributes: the library builds with default flags and loads on any x86-64, and
// ternary_cpu.cpp calls in here only where cpu_supported() says this CPU has them.
//
// Decoding (decode_bf16 / decode_f32_half, the one decoder of both regimes): a chunk is 32
// weights of a row, its 8 packed bytes broadcast to the 8 qwords of a zmm. vpmultishiftqb puts
// bits [2i, 2i+8) of the row under lane i's low byte (the others zeroed), so the lane's low bits
// are code i followed by the next codes; vpermw / vpermps index a 32 / 16-entry table with them,
// every entry e holding value(e & 3): the lookup ignores the following codes and reads the
// reserved code 11 as 0, as format.unpack_ternary does. 3 instructions per 32 weights; a zeroing
// mask clears the lanes outside the segment being decoded.
//
// Small M: a task owns kRows = 4 W rows; x (M rows, padded to whole chunks) stays in cache.
//
//        K --> piece 0 (kPiece = 1024 weights)              piece 1 ...
//        +--------+--------+--------+--- ... ---+--------+---------
//  4 W   | seg    | seg    | seg    |           |        |             segment = one scale block
//  rows  | blk 0  | blk 1  | blk 2  |           |        |             (inside one piece)
//        +--------+--------+--------+--- ... ---+--------+---------
//   bf16 x (1-2 rows): acc[4][2] = vdpbf16ps(x, codes +-1) over a segment's chunks, decoded in
//             registers (exact products, fp32 sums), then sum += acc * scale once a segment, as
//             the reference weighs a block: fp32 accumulation and one fp32 product per block.
//   fp32 x, 4 rows a group: sum[4][4] += x * (+-scale) with vfmadd (fp16 scale * +-1 is exact
//             in fp32); the first group decodes the piece and, where more groups follow, keeps it
//             in wbuf ([4, entries, 32], 16 KB: L1) for the others.
//   The sums wait in tot ([4, M, 16] fp32) between pieces; each is reduced across its 16 lanes
//   once, at the end.
//
// Past small M, bf16 x (pair_rows_bf16): a thread decodes its W rows once into a pair-major tile
// (decode_pairs16: 16 W rows x 2 columns a zmm, codes as bf16 +-1 / 0, the scales beside in fp32)
// and runs every x row over it, oneDNN's register blocking without its per-call packing: 32 W
// rows x 6 x rows a block, a broadcast pair of x times two weight vectors, 12 vdpbf16ps for 2
// weight loads and 6 broadcasts, each scale block's exact sum times its scale (the small-M
// numerics). Against the small-M kernel past M 2 and the oneDNN tile it replaced: docs/kernel.md.
//
// The other large-M paths (fp32 x; bf16 x whose scale blocks cut a pair, odd k_offset or
// block_size): dequantize_rows_* writes a tile of W rows (value * scale) for ternary_cpu.cpp's GEMM.

#include "ternary_cpu.h"
#include "ternary_cpu_tiles.h"

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef TERNARY_CPU_KERNELS
#include <immintrin.h>
// gcc 12's AVX-512 headers start many intrinsics from an `undefined` register and warn about it
// where they are inlined: a false positive of the headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define TERNARY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512bf16,fma,f16c")))
#endif

namespace ternary_cpu {

namespace {
uint32_t lanes_from(int64_t lo) { return ~0u << lo; }                       // lo in [0, 32)
uint32_t lanes_below(int64_t hi) { return hi == 32 ? ~0u : (1u << hi) - 1; }  // hi in [1, 32]
}  // namespace

Plan make_plan(int64_t K, int64_t block_size, int64_t k_offset) {
  Plan p;
  int64_t j = 0;  // local column
  while (j < K) {
    Piece piece{static_cast<int64_t>(p.segments.size()), 0, 0};
    const int64_t piece_end = std::min(K, (j / kPiece + 1) * kPiece);
    while (j < piece_end) {
      const int64_t block = (k_offset + j) / block_size;
      const int64_t j1 = std::min(piece_end, (block + 1) * block_size - k_offset);
      const int64_t c0 = j / kChunk, c1 = (j1 - 1) / kChunk + 1;
      p.segments.push_back({block, c0, c1, lanes_from(j - c0 * kChunk), lanes_below(j1 - (c1 - 1) * kChunk)});
      piece.entries += c1 - c0;
      j = j1;
    }
    piece.s1 = static_cast<int64_t>(p.segments.size());
    p.max_entries = std::max(p.max_entries, piece.entries);
    p.max_segments = std::max(p.max_segments, piece.s1 - piece.s0);
    p.pieces.push_back(piece);
  }
  return p;
}

#ifdef TERNARY_CPU_KERNELS

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

namespace {

using tiles::chunk_bits;
using tiles::chunk_lanes;
using tiles::half_to_float;
using tiles::Rows;
using tiles::Src;

// The lane's code bits for vpermw: control byte 2w of qword l selects bit 8l + 2w = 2i (lane
// i = 4l + w), the odd bytes (the words' high halves) are zeroed.
TERNARY_AVX512 inline __m512i ctrl_w16() {
  return _mm512_set_epi8(0, 62, 0, 60, 0, 58, 0, 56, 0, 54, 0, 52, 0, 50, 0, 48, 0, 46, 0, 44, 0, 42, 0, 40, 0, 38, 0,
                         36, 0, 34, 0, 32, 0, 30, 0, 28, 0, 26, 0, 24, 0, 22, 0, 20, 0, 18, 0, 16, 0, 14, 0, 12, 0, 10,
                         0, 8, 0, 6, 0, 4, 0, 2, 0, 0);
}
constexpr __mmask64 kWordLowBytes = 0x5555555555555555ull;

// The same for vpermps, weights 16h .. 16h + 15: dword d of qword l (d = 2l, 2l + 1) takes bits
// 32h + 2d from control bytes 0 and 4 of the qword.
TERNARY_AVX512 inline __m512i ctrl_f32(int h) {
  const __m512i lo = _mm512_set_epi8(0, 0, 0, 30, 0, 0, 0, 28, 0, 0, 0, 26, 0, 0, 0, 24, 0, 0, 0, 22, 0, 0, 0, 20, 0, 0,
                                     0, 18, 0, 0, 0, 16, 0, 0, 0, 14, 0, 0, 0, 12, 0, 0, 0, 10, 0, 0, 0, 8, 0, 0, 0, 6,
                                     0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 0);
  return _mm512_add_epi32(lo, _mm512_set1_epi32(32 * h));
}
constexpr __mmask64 kDwordLowBytes = 0x1111111111111111ull;

// vpermw table: entry e = value(e & 3) as the bf16 bits 0, plus, minus, 0.
TERNARY_AVX512 inline __m512i table_w16(uint16_t plus, uint16_t minus) {
  return _mm512_set1_epi64(static_cast<long long>(uint64_t{plus} << 16 | uint64_t{minus} << 32));
}
// vpermps table: entry e = value(e & 3) * s.
TERNARY_AVX512 inline __m512 table_f32(float s) { return _mm512_setr4_ps(0.f, s, -s, 0.f); }

// 32 weights as bf16 table entries; lanes outside `lanes` are 0.
TERNARY_AVX512 inline __m512i decode_bf16(uint64_t bits, uint32_t lanes, __m512i ctrl, __m512i table) {
  const __m512i idx = _mm512_maskz_multishift_epi64_epi8(kWordLowBytes, ctrl, _mm512_set1_epi64(static_cast<long long>(bits)));
  return _mm512_maskz_permutexvar_epi16(lanes, idx, table);
}
// Weights 16h .. 16h + 15 of a chunk as fp32 table entries (ctrl = ctrl_f32(h), lanes16 = the
// chunk's lanes >> 16h).
TERNARY_AVX512 inline __m512 decode_f32_half(uint64_t bits, uint32_t lanes16, __m512i ctrl, __m512 table) {
  const __m512i idx = _mm512_maskz_multishift_epi64_epi8(kDwordLowBytes, ctrl, _mm512_set1_epi64(static_cast<long long>(bits)));
  return _mm512_maskz_permutexvar_ps(static_cast<__mmask16>(lanes16), idx, table);
}

uint16_t bf16_round(float v) {  // round to nearest even (finite v: scales are finite and > 0)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// One piece, x rows [m0, m0 + MT) (MT <= 2), bf16 x, the codes decoded in registers.
//   sc: [kRows, S] fp32 scales of the piece's S segments; xb: [M, ldx] bf16; tot: [kRows, M, 16] fp32
template <int MT>
TERNARY_AVX512 void group_bf16(const Plan& plan, const Piece& piece, const Rows& rows, const float* sc,
                               const uint16_t* xb, int64_t ldx, int64_t M, int64_t m0, float* tot, bool first) {
  const __m512i ctrl = ctrl_w16(), codes = table_w16(0x3F80, 0xBF80);  // bf16 +1, -1
  __m512 sum[kRows][MT];
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) sum[r][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(tot + (r * M + m0 + i) * 16);
  for (int64_t s = piece.s0; s < piece.s1; ++s) {
    const Segment seg = plan.segments[s];
    __m512 acc[kRows][MT];
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < MT; ++i) acc[r][i] = _mm512_setzero_ps();
    for (int64_t c = seg.c0; c < seg.c1; ++c) {
      __m512bh xv[MT];
      for (int i = 0; i < MT; ++i) xv[i] = (__m512bh)_mm512_loadu_si512(xb + (m0 + i) * ldx + c * kChunk);
      const uint32_t lanes = chunk_lanes(seg, c);
      for (int r = 0; r < kRows; ++r) {
        const __m512i w = decode_bf16(chunk_bits(rows.packed[r], c), lanes, ctrl, codes);
        for (int i = 0; i < MT; ++i) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], xv[i], (__m512bh)w);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512 scale = _mm512_set1_ps(sc[r * (piece.s1 - piece.s0) + (s - piece.s0)]);
      for (int i = 0; i < MT; ++i) sum[r][i] = _mm512_fmadd_ps(acc[r][i], scale, sum[r][i]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) _mm512_storeu_ps(tot + (r * M + m0 + i) * 16, sum[r][i]);
}

// One piece, x rows [m0, m0 + MT), fp32 x.
//   sc: [kRows, S] fp32 scales; wbuf: [kRows, E, 32] fp32 weights (+-scale, 0); xf: [M, ldx] fp32; tot: [kRows, M, 16] fp32
template <int MT, Src SRC>
TERNARY_AVX512 void group_f32(const Plan& plan, const Piece& piece, const Rows& rows, const float* sc, float* wbuf,
                              int64_t E, const float* xf, int64_t ldx, int64_t M, int64_t m0, float* tot, bool first) {
  const __m512i ctrl[2] = {ctrl_f32(0), ctrl_f32(1)};
  __m512 sum[kRows][MT];
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) sum[r][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(tot + (r * M + m0 + i) * 16);
  int64_t e = 0;
  for (int64_t s = piece.s0; s < piece.s1; ++s) {
    const Segment seg = plan.segments[s];
    __m512 table[kRows];
    if constexpr (SRC != Src::kBuffer)
      for (int r = 0; r < kRows; ++r) table[r] = table_f32(sc[r * (piece.s1 - piece.s0) + (s - piece.s0)]);
    for (int64_t c = seg.c0; c < seg.c1; ++c, ++e) {
      const uint32_t lanes = chunk_lanes(seg, c);
      uint64_t bits[kRows];
      if constexpr (SRC != Src::kBuffer)
        for (int r = 0; r < kRows; ++r) bits[r] = chunk_bits(rows.packed[r], c);
      for (int h = 0; h < 2; ++h) {
        __m512 xv[MT];
        for (int i = 0; i < MT; ++i) xv[i] = _mm512_loadu_ps(xf + (m0 + i) * ldx + c * kChunk + h * 16);
        for (int r = 0; r < kRows; ++r) {
          float* keep = wbuf + (r * E + e) * kChunk + h * 16;
          __m512 w;
          if constexpr (SRC == Src::kBuffer) {
            w = _mm512_loadu_ps(keep);
          } else {
            w = decode_f32_half(bits[r], lanes >> (16 * h), ctrl[h], table[r]);
            if constexpr (SRC == Src::kDecodeKeep) _mm512_storeu_ps(keep, w);
          }
          for (int i = 0; i < MT; ++i) sum[r][i] = _mm512_fmadd_ps(xv[i], w, sum[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) _mm512_storeu_ps(tot + (r * M + m0 + i) * 16, sum[r][i]);
}

// The lane sums of 16 vectors v[0..15] as one vector (element i = sum of v[i]'s lanes): pairs
// of vectors, then pairs of pairs, are added lane-interleaved, then the 128-bit quarters: 45
// instructions for 16 sums, where one reduction a vector took ~8 each, too many next to the
// 4 x 12 chunks of a MiniLM-sized (K = 384) row tile.
TERNARY_AVX512 inline __m512 lane_sums16(const __m512* v) {
  __m512 t[8], w[4];
  for (int i = 0; i < 8; ++i)  // quarter q: (a0+a2, b0+b2, a1+a3, b1+b3) of v[2i], v[2i+1]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // quarter q: the quarter sums of v[4i .. 4i+3]
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // quarters (0+1, 2+3) of w[0], w[1]: then (0+1+2+3) of w[0..3], w[i] in quarter i
  const __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

// y[m, n0 .. n0 + 3] = lane sums of tot[r, m] + bias, 4 x rows at a time (16 sums a reduction).
//   tot: [kRows, M, 16] fp32; y: [M, N] fp32
TERNARY_AVX512 void store_sums(const Problem& p, const float* tot, int64_t n0, float* y) {
  static_assert(kRows == 4, "lane_sums16 takes 4 x rows of 4 W rows");
  const int64_t rows = std::min<int64_t>(kRows, p.N - n0);
  const __mmask8 valid = static_cast<__mmask8>((1u << rows) - 1);
  const __m128 bias = p.bias ? _mm_maskz_loadu_ps(valid, p.bias + n0) : _mm_setzero_ps();
  for (int64_t m0 = 0; m0 < p.M; m0 += 4) {
    __m512 v[16];  // v[4 i + r] = tot[r, m0 + i]
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < kRows; ++r)
        v[4 * i + r] = m0 + i < p.M ? _mm512_load_ps(tot + (r * p.M + m0 + i) * 16) : _mm512_setzero_ps();
    alignas(64) float sums[16];
    _mm512_store_ps(sums, lane_sums16(v));
    for (int i = 0; i < 4 && m0 + i < p.M; ++i)
      _mm_mask_storeu_ps(y + (m0 + i) * p.N + n0, valid, _mm_add_ps(_mm_load_ps(sums + 4 * i), bias));
  }
}

}  // namespace

void small_m_bf16(const Problem& p, const uint16_t* xb, int64_t ldx, float* y, int64_t t0, int64_t t1) {
  const Plan& plan = *p.plan;
  // 2 x rows a group: 4 x 2 accumulators and 4 x 2 sums, with the x and weight registers, fit
  // the 32 zmm (M <= 2 by the op's rule; more only where TERNARY_CPU_SMALL_M_MAX forces it)
  tiles::small_m_tiles<uint16_t>(p, 16, t0, t1, [&](const Piece& piece, const Rows& rows, const float* sc,
                                                     uint16_t*, float* tot, bool first) {
    for (int64_t m0 = 0; m0 < p.M; m0 += 2) {
      if (p.M - m0 >= 2) group_bf16<2>(plan, piece, rows, sc, xb, ldx, p.M, m0, tot, first);
      else group_bf16<1>(plan, piece, rows, sc, xb, ldx, p.M, m0, tot, first);
    }
  }, [&](const float* tot, int64_t n0) { store_sums(p, tot, n0, y); });
}

void small_m_f32(const Problem& p, const float* xf, int64_t ldx, float* y, int64_t t0, int64_t t1) {
  const Plan& plan = *p.plan;
  tiles::small_m_tiles<float>(p, 16, t0, t1, [&](const Piece& piece, const Rows& rows, const float* sc,
                                               float* wbuf, float* tot, bool first) {
    const int64_t E = piece.entries;
    // 4 x rows a group: 4 x 4 sums, 4 x rows, a weight and 4 scale tables fit the 32 zmm
    for (int64_t m0 = 0; m0 < p.M; m0 += 4) {
      const int64_t mt = std::min<int64_t>(4, p.M - m0);
      const Src src = p.M <= 4 ? Src::kDecode : m0 == 0 ? Src::kDecodeKeep : Src::kBuffer;
#define TERNARY_GROUP(MT, SRC) group_f32<MT, SRC>(plan, piece, rows, sc, wbuf, E, xf, ldx, p.M, m0, tot, first)
#define TERNARY_GROUPS(SRC)                   \
  switch (mt) {                               \
    case 4: TERNARY_GROUP(4, SRC); break;     \
    case 3: TERNARY_GROUP(3, SRC); break;     \
    case 2: TERNARY_GROUP(2, SRC); break;     \
    default: TERNARY_GROUP(1, SRC); break;    \
  }
      if (src == Src::kDecode) { TERNARY_GROUPS(Src::kDecode) }
      else if (src == Src::kDecodeKeep) { TERNARY_GROUPS(Src::kDecodeKeep) }
      else { TERNARY_GROUPS(Src::kBuffer) }
#undef TERNARY_GROUPS
#undef TERNARY_GROUP
    }
  }, [&](const float* tot, int64_t n0) { store_sums(p, tot, n0, y); });
}

TERNARY_AVX512 void dequantize_rows_bf16(const Problem& p, int64_t n0, int64_t rows, uint16_t* tile, int64_t ldt) {
  const __m512i ctrl = ctrl_w16();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* prow = p.row(n0 + r);
    const uint16_t* srow = p.scale + (n0 + r) * p.lds;
    uint16_t* dst = tile + r * ldt;
    for (const Segment& seg : p.plan->segments) {
      // value * scale rounded to bf16 (the fp16 scale has 11 significant bits, bf16 8): a
      // relative error <= 2^-8 per block, the size of the output's own bf16 rounding (the tests
      // bound both). Exact codes with the scales applied per block instead took 8 GEMMs of
      // K = 128 and an fp32 pass each: 1.7-2x slower at M 128-512 (Qwen3-0.6B gate_up, 1 thread).
      const float s = half_to_float(srow[seg.block]);
      const __m512i table = table_w16(bf16_round(s), bf16_round(-s));
      for (int64_t c = seg.c0; c < seg.c1; ++c) {
        const uint32_t lanes = chunk_lanes(seg, c);
        _mm512_mask_storeu_epi16(dst + c * kChunk, lanes, decode_bf16(chunk_bits(prow, c), lanes, ctrl, table));
      }
    }
  }
}

TERNARY_AVX512 void dequantize_rows_f32(const Problem& p, int64_t n0, int64_t rows, float* tile, int64_t ldt) {
  const __m512i ctrl[2] = {ctrl_f32(0), ctrl_f32(1)};
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* prow = p.row(n0 + r);
    const uint16_t* srow = p.scale + (n0 + r) * p.lds;
    float* dst = tile + r * ldt;
    for (const Segment& seg : p.plan->segments) {
      const __m512 table = table_f32(half_to_float(srow[seg.block]));  // exact: fp16 * +-1 in fp32
      for (int64_t c = seg.c0; c < seg.c1; ++c) {
        const uint32_t lanes = chunk_lanes(seg, c);
        const uint64_t bits = chunk_bits(prow, c);
        for (int h = 0; h < 2; ++h)
          _mm512_mask_storeu_ps(dst + c * kChunk + 16 * h, static_cast<__mmask16>(lanes >> (16 * h)),
                                decode_f32_half(bits, lanes >> (16 * h), ctrl[h], table));
      }
    }
  }
}

namespace {

// A chunk (8 packed bytes: 32 codes) of 16 W rows, its 16 qwords in two zmm (row r in qword r of
// a, r - 8 of b), as 16 pair vectors, pair-major: vector j = columns 2j, 2j + 1 of the chunk for
// the 16 rows (row r in dword r), each word table[code], handed to sink(j, vector). For each
// packed byte b, vpermt2b copies row r's byte b into both bytes of words 2r and 2r + 1, vpsrlvw
// moves the word's code to its low bits (pair 2b: shifts 0 and 2, pair 2b + 1: 4 and 6), vpermw
// reads the value from a table whose entry e is value(e & 3) (table_w16: the higher index bits,
// the next codes, ignored; the reserved 11 reads as 0, as format.unpack_ternary). 3.5
// instructions per 32 weights.
template <class Sink>
TERNARY_AVX512 inline void decode_pairs16(__m512i a, __m512i b, __m512i table, Sink&& sink) {
  // byte k of the index: row k / 4's byte 0 in the 128 bytes of (a, b), 8 (k / 4); + byte below
  const __m512i base = _mm512_set_epi64(0x7878787870707070ll, 0x6868686860606060ll, 0x5858585850505050ll,
                                        0x4848484840404040ll, 0x3838383830303030ll, 0x2828282820202020ll,
                                        0x1818181810101010ll, 0x0808080800000000ll);
  const __m512i shift_lo = _mm512_set1_epi32(0x00020000), shift_hi = _mm512_set1_epi32(0x00060004);
  for (int byte = 0; byte < 8; ++byte) {
    const __m512i z = _mm512_permutex2var_epi8(a, _mm512_add_epi8(base, _mm512_set1_epi8(static_cast<char>(byte))), b);
    sink(2 * byte, _mm512_permutexvar_epi16(_mm512_srlv_epi16(z, shift_lo), table));
    sink(2 * byte + 1, _mm512_permutexvar_epi16(_mm512_srlv_epi16(z, shift_hi), table));
  }
}

// The same for chunk c of rows[0..15], its qwords loaded here.
template <class Sink>
TERNARY_AVX512 inline void decode_pairs16(const uint8_t* const* rows, int64_t c, __m512i table, Sink&& sink) {
  const __m512i a = _mm512_set_epi64(
      static_cast<long long>(chunk_bits(rows[7], c)), static_cast<long long>(chunk_bits(rows[6], c)),
      static_cast<long long>(chunk_bits(rows[5], c)), static_cast<long long>(chunk_bits(rows[4], c)),
      static_cast<long long>(chunk_bits(rows[3], c)), static_cast<long long>(chunk_bits(rows[2], c)),
      static_cast<long long>(chunk_bits(rows[1], c)), static_cast<long long>(chunk_bits(rows[0], c)));
  const __m512i b = _mm512_set_epi64(
      static_cast<long long>(chunk_bits(rows[15], c)), static_cast<long long>(chunk_bits(rows[14], c)),
      static_cast<long long>(chunk_bits(rows[13], c)), static_cast<long long>(chunk_bits(rows[12], c)),
      static_cast<long long>(chunk_bits(rows[11], c)), static_cast<long long>(chunk_bits(rows[10], c)),
      static_cast<long long>(chunk_bits(rows[9], c)), static_cast<long long>(chunk_bits(rows[8], c)));
  decode_pairs16(a, b, table, sink);
}

// One register block of the pair-major kernel: NV groups of 16 W rows (lanes) x MT x rows, over
// all of K, a scale block at a time: exact products (x times +-1) summed in fp32 over the
// block's pairs, then sum += acc * scale once a block, as the reference weighs a block.
//   tile: [NV][pairs, 16, 2] bf16 at stride ldg; ws: [NV][S, 16] fp32 at stride S * 16;
//   x2: x rows as dwords (bf16 pairs), ldx2 apart; y: [M, ldy] bf16; bias: fp32 from the block's first row, or nullptr
template <int NV, int MT>
TERNARY_AVX512 void pair_block(const uint16_t* tile, int64_t ldg, const PairSegment* segs, int64_t S, const float* ws,
                               const int32_t* x2, int64_t ldx2, const float* bias, int64_t valid, uint16_t* y,
                               int64_t ldy) {
  __m512 sum[NV][MT];
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < MT; ++i) sum[v][i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    __m512 acc[NV][MT];
    for (int v = 0; v < NV; ++v)
      for (int i = 0; i < MT; ++i) acc[v][i] = _mm512_setzero_ps();
    for (int64_t q = segs[s].q0; q < segs[s].q1; ++q) {
      __m512bh w[NV];
      for (int v = 0; v < NV; ++v) w[v] = (__m512bh)_mm512_load_si512(tile + v * ldg + q * 32);
      for (int i = 0; i < MT; ++i) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(x2[i * ldx2 + q]);
        for (int v = 0; v < NV; ++v) acc[v][i] = _mm512_dpbf16_ps(acc[v][i], w[v], xb);
      }
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 scale = _mm512_load_ps(ws + (v * S + s) * 16);
      for (int i = 0; i < MT; ++i) sum[v][i] = _mm512_fmadd_ps(acc[v][i], scale, sum[v][i]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int64_t lanes = std::clamp<int64_t>(valid - 16 * v, 0, 16);
    if (lanes == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * v) : _mm512_setzero_ps();
    for (int i = 0; i < MT; ++i)
      _mm256_mask_storeu_epi16(y + i * ldy + 16 * v, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(sum[v][i], b)));
  }
}

template <int NV>
TERNARY_AVX512 void pair_all_m(const uint16_t* tile, int64_t ldg, const PairSegment* segs, int64_t S, const float* ws,
                               const int32_t* x2, int64_t ldx2, int64_t m_begin, int64_t m_end, const float* bias,
                               int64_t valid, uint16_t* y, int64_t ldy) {
  // 2 x 16 W rows and 6 x rows: 12 accumulators, 12 sums, 2 weight vectors, an x broadcast and
  // a scale vector in the 32 zmm; 12 vdpbf16ps for 2 weight loads and 6 broadcasts
  int64_t m0 = m_begin;
  for (; m0 + 6 <= m_end; m0 += 6)
    pair_block<NV, 6>(tile, ldg, segs, S, ws, x2 + m0 * ldx2, ldx2, bias, valid, y + m0 * ldy, ldy);
  switch (m_end - m0) {
#define TERNARY_CASE(MT)                                                                                    \
  case MT: pair_block<NV, MT>(tile, ldg, segs, S, ws, x2 + m0 * ldx2, ldx2, bias, valid, y + m0 * ldy, ldy); \
    break;
    TERNARY_CASE(5) TERNARY_CASE(4) TERNARY_CASE(3) TERNARY_CASE(2) TERNARY_CASE(1)
#undef TERNARY_CASE
    default: break;
  }
}

// W rows [n0, n1) into the pair-major tile and their scales into ws (pair_rows_bf16's layouts). Its
// own function: written inside pair_rows_bf16, the prefetches below made gcc's code for the GEMM
// after it 6-15 % slower at M >= 64.
TERNARY_AVX512 __attribute__((noinline)) void decode_pair_tile(const Problem& p, const PairPlan& plan, int64_t kc,
                                                                int64_t n0, int64_t n1, uint16_t* tile, float* ws) {
  const int64_t pairs = kc / 2, rows = n1 - n0, groups = (rows + 15) / 16, S = plan.segments.size();
  const int64_t ldg = pairs * 32;  // a group's bf16 values: [pairs, 16, 2]
  const std::vector<uint8_t> zero_row(kc / 4, 0);
  const auto group_rows = [&](int64_t g, const uint8_t** out) {
    for (int r = 0; r < 16; ++r) out[r] = 16 * g + r < rows ? p.row(n0 + 16 * g + r) : zero_row.data();
  };
  const __m512i codes = table_w16(0x3F80, 0xBF80);  // bf16 +1, -1
  const uint8_t* src[16];
  group_rows(0, src);
  for (int64_t g = 0; g < groups; ++g) {
    // the next group's 16 rows are read into L1 a line at a time while this one is decoded, and its
    // scales (16 rows of lds fp16, contiguous): 16 interleaved row streams defeat the hardware
    // prefetchers (M 4, cold weights: 5-10 % of the call)
    const uint8_t* next[16];
    const bool ahead = g + 1 < groups;
    if (ahead) {
      group_rows(g + 1, next);
      const int64_t n_rows = std::min<int64_t>(16, rows - 16 * (g + 1));
      tiles::prefetch_range_l1(p.scale + (n0 + 16 * (g + 1)) * p.lds, n_rows * p.lds * 2);
    }
    for (int64_t c = 0; c < kc / kChunk; ++c) {
      if (ahead && c % 8 == 0)
        for (int r = 0; r < 16; ++r) tiles::prefetch_l1(reinterpret_cast<const char*>(next[r] + c * 8));
      uint16_t* out = tile + g * ldg + c * 16 * 32;
      decode_pairs16(src, c, codes, [&](int j, __m512i v) TERNARY_AVX512 { _mm512_store_si512(out + j * 32, v); });
    }
    // missing rows of the last group: scale 0
    for (int64_t s = 0; s < S; ++s)
      for (int r = 0; r < 16; ++r)
        ws[(g * S + s) * 16 + r] =
            16 * g + r < rows ? half_to_float(p.scale[(n0 + 16 * g + r) * p.lds + plan.segments[s].block]) : 0.f;
    if (ahead) std::copy(next, next + 16, src);
  }
}

}  // namespace

TERNARY_AVX512 void pair_rows_bf16(const Problem& p, const PairPlan& plan, const uint16_t* xb, int64_t kc, int64_t n0,
                                   int64_t n1, uint16_t* tile, float* ws, uint16_t* y) {
  const int64_t pairs = kc / 2, rows = n1 - n0, groups = (rows + 15) / 16, S = plan.segments.size();
  const int64_t ldg = pairs * 32;  // a group's bf16 values: [pairs, 16, 2]
  decode_pair_tile(p, plan, kc, n0, n1, tile, ws);
  // x rows in blocks of <= kXBlockBytes (L2, beside the tile), 2 groups (32 W rows) a register
  // block, the block's x rows 6 at a time inside (the W2A8 tile kernel's order)
  constexpr int64_t kXBlockBytes = 256 * 1024;
  const int64_t mb = std::max<int64_t>(6, kXBlockBytes / (kc * 2) / 6 * 6);
  const int32_t* x2 = reinterpret_cast<const int32_t*>(xb);
  const PairSegment* segs = plan.segments.data();
  for (int64_t m_begin = 0; m_begin < p.M; m_begin += mb) {
    const int64_t m_end = std::min(p.M, m_begin + mb);
    for (int64_t g = 0; g < groups; g += 2) {
      const int64_t valid = std::min<int64_t>(32, rows - 16 * g), n = n0 + 16 * g;
      const float* bias = p.bias ? p.bias + n : nullptr;
      if (g + 1 < groups)
        pair_all_m<2>(tile + g * ldg, ldg, segs, S, ws + g * S * 16, x2, pairs, m_begin, m_end, bias, valid, y + n, p.N);
      else
        pair_all_m<1>(tile + g * ldg, ldg, segs, S, ws + g * S * 16, x2, pairs, m_begin, m_end, bias, valid, y + n, p.N);
    }
  }
}

TERNARY_AVX512 void vnni_rows_bf16(const Problem& p, const VnniPlan& plan, int64_t kc, int64_t n0, int64_t n1,
                                   uint16_t* tile, int64_t k0, int64_t k1) {
  if (k1 < 0) k1 = kc;
  const int64_t pairs = (k1 - k0) / 2, rows = n1 - n0, groups = (rows + kVnniCols - 1) / kVnniCols, S = plan.S;
  const int64_t qbase = k0 / 2;
  constexpr int kHalves = kVnniCols / 16;
  // the scale blocks columns [k0, k1) touch (S: past K): only those are converted (a K slice's
  // call converts its own few, not all S of every row)
  const int64_t bmin = plan.b0[qbase], bmax = plan.b1[k1 / 2 - 1];
  // this thread's zeros for the missing rows of the last group, and its scale vectors: kept
  // between calls (the K-slice kernel calls this once a group and slice)
  thread_local std::vector<uint8_t> zero_row;
  if (static_cast<int64_t>(zero_row.size()) < kc / 4 + 8) zero_row.assign(kc / 4 + 8, 0);
  // The decoded word is 0x7FFF (+1), 0xFFFF (-1) or 0; with the scale's bf16 bits s and c =
  // 0x8000, vpternlogd 0x68 gives bits 0-14 of s where the code is not 0 and bit 15 = s's sign
  // xor the code's: +s, -s, or +-0 (x times a signed zero adds nothing).
  const __m512i table = table_w16(0x7FFF, 0xFFFF), sign = _mm512_set1_epi16(static_cast<short>(0x8000));
  // sv[(h * (S + 1) + b) * 16 + r]: the bf16 scale of block b of the group's row 16h + r in both
  // words; zero for the missing rows of the last group and for b = S (the columns past K)
  thread_local std::vector<uint32_t> sv;
  if (static_cast<int64_t>(sv.size()) < kHalves * (S + 1) * 16) sv.resize(kHalves * (S + 1) * 16);
  for (int64_t g = 0; g < groups; ++g) {
    // the 16 rows' addresses of each half, gathered 8 bytes a row a chunk (vpgatherqq: no
    // per-row inserts on the shuffle port the decode needs)
    alignas(64) const uint8_t* src[kHalves][16];
    for (int h = 0; h < kHalves; ++h)
      for (int r = 0; r < 16; ++r) {
        const int64_t row = kVnniCols * g + 16 * h + r;
        src[h][r] = row < rows ? p.row(n0 + row) : zero_row.data();
        for (int64_t b = bmin; b <= bmax; ++b) {
          const uint32_t v = row < rows && b < S ? bf16_round(half_to_float(p.scale[(n0 + row) * p.lds + b])) : 0u;
          sv[(h * (S + 1) + b) * 16 + r] = v | v << 16;
        }
      }
    uint16_t* out = tile + g * pairs * 2 * kVnniCols;  // [pairs, kVnniCols, 2]: pair q of K at q - qbase
    for (int64_t c = k0 / kChunk; c < k1 / kChunk; ++c) {
      // the chunk's 32 columns in one scale block (or all past K): one scale vector for all pairs
      const int64_t q0 = 16 * c, b = plan.b0[q0];
      const bool uniform = plan.b1[q0 + 15] == b;
      for (int h = 0; h < kHalves; ++h) {
        const uint32_t* svh = sv.data() + h * (S + 1) * 16;
        const __m512i off = _mm512_set1_epi64(8 * c);
        const __m512i a = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_load_si512(src[h]), off), nullptr, 1);
        const __m512i bb = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_load_si512(src[h] + 8), off), nullptr, 1);
        if (uniform) {
          const __m512i s = _mm512_loadu_si512(svh + b * 16);
          decode_pairs16(a, bb, table, [&](int j, __m512i v) TERNARY_AVX512 {
            _mm512_store_si512(out + (q0 + j - qbase) * 2 * kVnniCols + 32 * h, _mm512_ternarylogic_epi32(v, s, sign, 0x68));
          });
        } else {
          decode_pairs16(a, bb, table, [&](int j, __m512i v) TERNARY_AVX512 {
            const int64_t q = q0 + j, b0 = plan.b0[q], b1 = plan.b1[q];
            __m512i s = _mm512_loadu_si512(svh + b0 * 16);
            if (b1 != b0) s = _mm512_mask_blend_epi16(0xAAAAAAAAu, s, _mm512_loadu_si512(svh + b1 * 16));  // column 2q + 1
            _mm512_store_si512(out + (q - qbase) * 2 * kVnniCols + 32 * h, _mm512_ternarylogic_epi32(v, s, sign, 0x68));
          });
        }
      }
    }
  }
}

TERNARY_AVX512 void store_rows_bf16(const float* c, int64_t ldc, int64_t rows, int64_t cols, const float* bias,
                                    uint16_t* y, int64_t ldy, bool stream) {
  for (int64_t i = 0; i < rows; ++i)  // row by row: a row's stores fill its lines together
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - j)) - 1);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + j) : _mm512_setzero_ps();
      const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_maskz_loadu_ps(mask, c + i * ldc + j), b));
      uint16_t* dst = y + i * ldy + j;
      if (stream && mask == 0xFFFF && reinterpret_cast<uintptr_t>(dst) % 32 == 0)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), v);
      else
        _mm256_mask_storeu_epi16(dst, mask, v);
    }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: visible before the op returns
}

PairPlan make_pair_plan(int64_t K, int64_t block_size, int64_t k_offset) {
  PairPlan plan;
  for (int64_t j = 0; j < K;) {
    const int64_t block = (k_offset + j) / block_size;
    const int64_t j1 = std::min(K, (block + 1) * block_size - k_offset);
    plan.segments.push_back({block, j / 2, (j1 + 1) / 2});
    j = j1;
  }
  return plan;
}

VnniPlan make_vnni_plan(int64_t K, int64_t kc, int64_t block_size, int64_t k_offset) {
  VnniPlan plan;
  plan.S = (k_offset + K - 1) / block_size + 1;  // k_offset < block_size: local block = scale column
  const auto block = [&](int64_t j) { return static_cast<int32_t>(j < K ? (k_offset + j) / block_size : plan.S); };
  for (int64_t q = 0; q < kc / 2; ++q) {
    plan.b0.push_back(block(2 * q));
    plan.b1.push_back(block(2 * q + 1));
  }
  return plan;
}

#else  // not x86-64: no kernels (ternary_cpu.h), the op refuses to run

bool cpu_supported() { return false; }

#endif

}  // namespace ternary_cpu
