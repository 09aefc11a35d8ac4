// The CPU kernel's AVX2 code (AVX2, FMA, F16C): the same two regimes as the AVX-512 code
// (ternary_cpu_kernels.cpp, whose tiling it shares through ternary_cpu_tiles.h), for x86-64 CPUs
// without AVX-512 (AMD Zen 1-3, Intel client cores, older Xeons). x runs in fp32 whatever its
// dtype (bf16 and fp16 widen exactly): these CPUs have no bf16 dot product, and their fp32 GEMM
// (oneDNN / MKL on AVX2) is what stock torch runs for bf16 there too.
//
// Decoding 8 weights (2 packed bytes, 16 bits): the packed dword holding them broadcast from
// memory to the 8 dwords of a ymm (a load, no ALU work; it serves two groups of 8), lane i shifted
// right by 2i or 16 + 2i (vpsrlvd), and vpermilps indexes the 4-entry table {0, s, -s, 0} of its
// 128-bit half with the lane's low 2 bits, code i (the reserved code 11 reads as 0, as
// format.unpack_ternary does): 2 instructions per 8 weights, and an AND with the lane mask for
// the chunks a segment boundary cuts. vpermilps stays inside each half (cheaper than a
// lane-crossing vpermps on CPUs that split 256-bit ops, such as AMD Zen 1/2; docs/kernel.md).
//
// Small M: tiles of kRows = 4 W rows, pieces of kPiece weights; sum += x * (+-scale) with vfmadd
// as the AVX-512 fp32 path does (fp16 scale * +-1 is exact in fp32). The first group of x rows
// (1 or 2) decodes: 4 x 2 fp32 sums, 2 x rows, a weight and 4 scale tables fill the 16 ymm. Where
// more x rows follow, it keeps the piece's decoded weights in wbuf ([4, entries, 32] fp32, 16 KB:
// L1) and the others read it 3 rows at a time: 12 sums, so 12 FMA chains keep both FMA pipes
// busy where 8 left the FMA's latency exposed. A chunk's 4 groups run as a rolled loop over its
// 2 dwords (2 groups each): 1.1x faster at M 1-4 on Zen 3 than the chunk fully unrolled, where
// gcc's register allocation moved and spilled sums inside the loop.
// Past small M: table lookups (lut_rows_avx2, at the end of this file; the idea of T-MAC and of
// bitnet.cpp's TL kernels, in fp32 here so that the numerics stay the fp32 mode's). A packed byte
// holds 4 codes: for 4 columns of x, the 81 sums of +-x or 0 over them, one per byte without code
// 11, are built once per x tile and looked up by every W row: one vaddps of 8 x rows covers 4
// weights, where an FMA covers one. On Zen 3 the lookups run ~0.7-0.9 a cycle (the dependent
// index -> table load, not the adds, bounds them), 1.3-2.2x the FMA tile GEMMs below. Those (an
// fp32 tile from dequantize_rows_f32_avx2 for tile_gemm_f32_avx2 or MKL) stay behind
// TERNARY_CPU_AVX2_GEMM=dot|mm.

#include "ternary_cpu.h"
#include "ternary_cpu_tiles.h"

#include <cstring>

#ifdef TERNARY_CPU_KERNELS
#include <immintrin.h>
#define TERNARY_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace ternary_cpu {

#ifdef TERNARY_CPU_KERNELS

bool cpu_avx2_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

namespace {

using tiles::chunk_lanes;
using tiles::Rows;
using tiles::Src;

// vpsrlvd counts: lane i takes bits [base + 2i, base + 2i + 2) to its bottom.
TERNARY_AVX2 inline __m256i shifts8(int base) {
  return _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
}
// vpermilps table, in both 128-bit halves: entry c = value(c) * s.
TERNARY_AVX2 inline __m256 table8(float s) { return _mm256_setr_ps(0.f, s, -s, 0.f, 0.f, s, -s, 0.f); }

// Lane i all ones where bit i of m8 is set.
TERNARY_AVX2 inline __m256 lane_mask8(uint32_t m8) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m8)), bit), bit));
}

// Weights 8g .. 8g + 7 of the chunk at `chunk` (its 8 packed bytes) as table entries; lanes of the
// chunk outside `lanes` are 0. The dword holding groups 2h and 2h + 1 is broadcast from memory
// (a load, no ALU work) and shifted by shifts8(0) or shifts8(16): vpermilps reads only a lane's
// low 2 bits, so the bits above code i need no mask.
TERNARY_AVX2 inline __m256 decode8(const uint8_t* chunk, int g, uint32_t lanes, __m256i shifts_lo, __m256i shifts_hi,
                                   __m256 table) {
  int32_t dword;
  std::memcpy(&dword, chunk + 4 * (g >> 1), 4);
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(dword), (g & 1) ? shifts_hi : shifts_lo);
  const __m256 w = _mm256_permutevar_ps(table, v);
  const uint32_t m8 = (lanes >> (8 * g)) & 0xFF;
  return m8 == 0xFF ? w : _mm256_and_ps(w, lane_mask8(m8));
}

// One piece, x rows [m0, m0 + MT).
//   sc: [kRows, S] fp32 scales; wbuf: [kRows, E, 32] fp32 weights (+-scale, 0); xf: [M, ldx] fp32;
//   tot: [kRows, M, 8] fp32
template <int MT, Src SRC>
TERNARY_AVX2 void group_avx2(const Plan& plan, const Piece& piece, const Rows& rows, const float* sc, float* wbuf,
                             int64_t E, const float* xf, int64_t ldx, int64_t M, int64_t m0, float* tot, bool first) {
  const __m256i shifts_lo = shifts8(0), shifts_hi = shifts8(16);
  __m256 sum[kRows][MT];
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) sum[r][i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(tot + (r * M + m0 + i) * 8);
  int64_t e = 0;
  for (int64_t s = piece.s0; s < piece.s1; ++s) {
    const Segment seg = plan.segments[s];
    __m256 table[kRows];
    if constexpr (SRC != Src::kBuffer)
      for (int r = 0; r < kRows; ++r) table[r] = table8(sc[r * (piece.s1 - piece.s0) + (s - piece.s0)]);
    for (int64_t c = seg.c0; c < seg.c1; ++c, ++e) {
      const uint32_t lanes = chunk_lanes(seg, c);
#pragma GCC unroll 1
      for (int h = 0; h < 2; ++h) {
        for (int gh = 0; gh < 2; ++gh) {
          const int g = 2 * h + gh;
          __m256 xv[MT];
          for (int i = 0; i < MT; ++i) xv[i] = _mm256_loadu_ps(xf + (m0 + i) * ldx + c * kChunk + 8 * g);
          for (int r = 0; r < kRows; ++r) {
            float* keep = wbuf + (r * E + e) * kChunk + 8 * g;
            __m256 w;
            if constexpr (SRC == Src::kBuffer) {
              w = _mm256_load_ps(keep);
            } else {
              w = decode8(rows.packed[r] + 8 * c, g, lanes, shifts_lo, shifts_hi, table[r]);
              if constexpr (SRC == Src::kDecodeKeep) _mm256_store_ps(keep, w);
            }
            for (int i = 0; i < MT; ++i) sum[r][i] = _mm256_fmadd_ps(xv[i], w, sum[r][i]);
          }
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < MT; ++i) _mm256_storeu_ps(tot + (r * M + m0 + i) * 8, sum[r][i]);
}

TERNARY_AVX2 inline float lane_sum8(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// y[m, n0 .. n0 + 3] = lane sums of tot[r, m] + bias.  tot: [kRows, M, 8] fp32; y: [M, N] fp32
TERNARY_AVX2 void store_sums8(const Problem& p, const float* tot, int64_t n0, float* y) {
  const int64_t rows = std::min<int64_t>(kRows, p.N - n0);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t r = 0; r < rows; ++r)
      y[m * p.N + n0 + r] = lane_sum8(_mm256_load_ps(tot + (r * p.M + m) * 8)) + (p.bias ? p.bias[n0 + r] : 0.f);
}

}  // namespace

void small_m_avx2(const Problem& p, const float* xf, int64_t ldx, float* y, int64_t t0, int64_t t1) {
  const Plan& plan = *p.plan;
  tiles::small_m_tiles<float>(p, 8, t0, t1, [&](const Piece& piece, const Rows& rows, const float* sc,
                                              float* wbuf, float* tot, bool first) {
    const int64_t E = piece.entries;
#define TERNARY_GROUP(MT, SRC) group_avx2<MT, SRC>(plan, piece, rows, sc, wbuf, E, xf, ldx, p.M, m0, tot, first)
    int64_t m0 = 0;
    if (p.M == 1) TERNARY_GROUP(1, Src::kDecode);
    else if (p.M == 2) TERNARY_GROUP(2, Src::kDecode);
    else TERNARY_GROUP(2, Src::kDecodeKeep);
    // the other rows read the kept piece 3 at a time: 12 FMA chains (8 left the FMA's latency exposed)
    for (m0 = 2; m0 + 3 <= p.M; m0 += 3) TERNARY_GROUP(3, Src::kBuffer);
    if (p.M - m0 == 2) TERNARY_GROUP(2, Src::kBuffer);
    else if (p.M - m0 == 1) TERNARY_GROUP(1, Src::kBuffer);
#undef TERNARY_GROUP
  }, [&](const float* tot, int64_t n0) { store_sums8(p, tot, n0, y); });
}

TERNARY_AVX2 void dequantize_rows_f32_avx2(const Problem& p, int64_t n0, int64_t rows, float* tile, int64_t ldt) {
  const __m256i shifts_lo = shifts8(0), shifts_hi = shifts8(16);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* prow = p.row(n0 + r);
    const uint16_t* srow = p.scale + (n0 + r) * p.lds;
    float* dst = tile + r * ldt;
    for (const Segment& seg : p.plan->segments) {
      const __m256 table = table8(tiles::half_to_float(srow[seg.block]));  // exact: fp16 * +-1 in fp32
      for (int64_t c = seg.c0; c < seg.c1; ++c) {
        const uint32_t lanes = chunk_lanes(seg, c);
        for (int g = 0; g < 4; ++g) {
          const uint32_t m8 = (lanes >> (8 * g)) & 0xFF;
          if (m8 == 0) continue;
          const __m256 w = decode8(prow + 8 * c, g, ~0u, shifts_lo, shifts_hi, table);
          float* out = dst + c * kChunk + 8 * g;
          if (m8 == 0xFF) _mm256_storeu_ps(out, w);
          else _mm256_maskstore_ps(out, _mm256_castps_si256(lane_mask8(m8)), w);
        }
      }
    }
  }
}

namespace {

// kMT x rows against kNT tile rows over columns [0, kn) of both (x, w: already at the slice): kMT
// x kNT fp32 sums of 8 lanes (12 ymm, with 3 x vectors and 1 weight vector 16), reduced by vhaddps
// at the end and added to y (`add`) or to the bias. w: the kNT rows (a pointer repeated where the
// tile has fewer rows left; only `nt` sums are stored).
constexpr int kMT = 3, kNT = 4;
template <int MT>
TERNARY_AVX2 void dot_block(const float* x, int64_t ldx, const float* const* w, int64_t kn, int64_t nt, bool add,
                            const float* bias, float* y, int64_t ldy) {
  __m256 acc[MT][kNT];
  for (int i = 0; i < MT; ++i)
    for (int r = 0; r < kNT; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kn; k += 8) {
    __m256 xv[MT];
    for (int i = 0; i < MT; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + k);
    for (int r = 0; r < kNT; ++r) {
      const __m256 wv = _mm256_loadu_ps(w[r] + k);
      for (int i = 0; i < MT; ++i) acc[i][r] = _mm256_fmadd_ps(xv[i], wv, acc[i][r]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    // [r0 r1 r2 r3] of each 128-bit half, then the halves added: the 4 sums
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]), _mm256_hadd_ps(acc[i][2], acc[i][3]));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    float* out = y + i * ldy;
    const float* base = add ? out : bias;
    if (nt == kNT) {
      _mm_storeu_ps(out, base ? _mm_add_ps(s, _mm_loadu_ps(base)) : s);
    } else {
      alignas(16) float v[4];
      _mm_store_ps(v, s);
      for (int64_t r = 0; r < nt; ++r) out[r] = v[r] + (base ? base[r] : 0.f);
    }
  }
}

// K in slices of about kDotKSliceCols columns (a multiple of 8): 4 tile rows (8 KB) and 3 x rows
// (6 KB) of a slice stay in L1 while the x rows change; x rows in chunks of about kDotXBytes of a
// slice stay in L2 while every group of 4 tile rows runs over them.
constexpr int64_t kDotKSliceCols = 512;
constexpr int64_t kDotXBytes = 192 * 1024;

}  // namespace

TERNARY_AVX2 void tile_gemm_f32_avx2(const float* x, int64_t ldx, int64_t M, const float* tile, int64_t ldt,
                                     int64_t nt, int64_t kc, const float* bias, float* y, int64_t ldy) {
  const int64_t slices = (kc + kDotKSliceCols - 1) / kDotKSliceCols;
  const int64_t ks = (kc / slices + 7) / 8 * 8;
  const int64_t mc = std::max<int64_t>(kMT, kDotXBytes / (ks * 4) / kMT * kMT);
  for (int64_t k0 = 0; k0 < kc; k0 += ks) {
    const int64_t kn = std::min(ks, kc - k0);
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
      const int64_t m1 = std::min(M, m0 + mc);
      for (int64_t j = 0; j < nt; j += kNT) {
        const int64_t rows = std::min<int64_t>(kNT, nt - j);
        const float* w[kNT];
        for (int r = 0; r < kNT; ++r) w[r] = tile + (j + std::min<int64_t>(r, rows - 1)) * ldt + k0;
        const float* b = bias ? bias + j : nullptr;
        const float* xs = x + k0;
        int64_t m = m0;
        for (; m + kMT <= m1; m += kMT) dot_block<kMT>(xs + m * ldx, ldx, w, kn, rows, k0 > 0, b, y + m * ldy + j, ldy);
        if (m1 - m == 2) dot_block<2>(xs + m * ldx, ldx, w, kn, rows, k0 > 0, b, y + m * ldy + j, ldy);
        else if (m1 - m == 1) dot_block<1>(xs + m * ldx, ldx, w, kn, rows, k0 > 0, b, y + m * ldy + j, ldy);
      }
    }
  }
}

namespace {

// The lookup kernel's tables: for each of the kLutGroups groups of 4 columns of an entry, an entry
// of T fp32 lanes (the tile's x rows) for every value of a packed byte, at byte * T floats; groups
// kLutGroupFloats apart (256 x 16 lanes and 64 bytes more, so that the groups' entries for the same
// byte do not share L1 sets). Only the 81 bytes without the reserved code 11 are written: a byte's
// codes 11 read as 00 (lut_codes), as format.unpack_ternary reads them.
constexpr int kLutGroups = static_cast<int>(kLutWidth / 4);
constexpr int64_t kLutGroupFloats = 256 * 16 + 16;

// The 8 packed bytes of a row's 32 columns with every reserved code 11 made 00.
inline uint64_t lut_codes(const uint8_t* bytes) {
  uint64_t q;
  std::memcpy(&q, bytes, 8);
  const uint64_t both = q & (q >> 1) & 0x5555555555555555ull;  // bit 2i: code i is 11
  return q & ~(both | (both << 1));
}

// The tables of chunk c for x columns [a0, a1) (local, inside the chunk; x is zero elsewhere) of
// the tile xt ([kc, 16] fp32). Entry byte b of group g: sum over its 4 codes i of value(code) *
// x[4g + i], in two steps: the 9 sums of columns 0-1 and of columns 2-3, then their 81 sums.
template <int T>
TERNARY_AVX2 void lut_build(const float* xt, int64_t c, int64_t a0, int64_t a1, float* tab) {
  constexpr int V = T / 8;
  const __m256 zero = _mm256_setzero_ps();
  for (int g = 0; g < kLutGroups; ++g) {
    __m256 val[4][3][V];  // column j: value(code) * x for codes 00, 01, 10
    for (int j = 0; j < 4; ++j) {
      const int64_t col = c * kLutWidth + 4 * g + j;
      for (int v = 0; v < V; ++v) {
        const __m256 xv = col >= a0 && col < a1 ? _mm256_load_ps(xt + col * 16 + 8 * v) : zero;
        val[j][0][v] = zero;
        val[j][1][v] = xv;
        val[j][2][v] = _mm256_sub_ps(zero, xv);
      }
    }
    __m256 lo[9][V], hi[9][V];  // [code0 + 3 code1]: columns 0-1; [code2 + 3 code3]: columns 2-3
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b)
        for (int v = 0; v < V; ++v) {
          lo[a + 3 * b][v] = _mm256_add_ps(val[0][a][v], val[1][b][v]);
          hi[a + 3 * b][v] = _mm256_add_ps(val[2][a][v], val[3][b][v]);
        }
    float* tg = tab + g * kLutGroupFloats;
    for (int l = 0; l < 9; ++l)
      for (int h = 0; h < 9; ++h) {
        const int byte = (l % 3) | (l / 3) << 2 | (h % 3) << 4 | (h / 3) << 6;
        for (int v = 0; v < V; ++v) _mm256_store_ps(tg + byte * T + 8 * v, _mm256_add_ps(lo[l][v], hi[h][v]));
      }
  }
}

// acc[n - n0] += scale[n, block] * (the 8 lookups of row n's bytes of chunk c), T lanes a row.
template <int T>
TERNARY_AVX2 void lut_rows(const Problem& p, int64_t c, int64_t block, const float* tab, int64_t n0, int64_t n1,
                           float* acc) {
  constexpr int V = T / 8;
  for (int64_t n = n0; n < n1; ++n) {
    const uint64_t q = lut_codes(p.row(n) + 8 * c);
    __m256 sum[V][2];  // two chains a lane group
    for (int v = 0; v < V; ++v) sum[v][0] = sum[v][1] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int g = 0; g < kLutGroups; ++g) {
      const float* e = tab + g * kLutGroupFloats + ((q >> (8 * g)) & 0xFF) * T;
      for (int v = 0; v < V; ++v) sum[v][g & 1] = _mm256_add_ps(sum[v][g & 1], _mm256_load_ps(e + 8 * v));
    }
    const __m256 s = _mm256_set1_ps(tiles::half_to_float(p.scale[n * p.lds + block]));
    float* a = acc + (n - n0) * T;
    for (int v = 0; v < V; ++v)
      _mm256_store_ps(a + 8 * v, _mm256_fmadd_ps(s, _mm256_add_ps(sum[v][0], sum[v][1]), _mm256_load_ps(a + 8 * v)));
  }
}

template <int T>
TERNARY_AVX2 void lut_tile(const Problem& p, const W8Plan& plan, const float* x, int64_t ldx, int64_t rows,
                           int64_t n0, int64_t n1, float* xt, float* tab, float* acc, float* y) {
  const int64_t kc = plan.chunks * kLutWidth;
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t i = 0; i < 16; ++i) xt[k * 16 + i] = i < rows && k < p.K ? x[i * ldx + k] : 0.f;
  std::memset(acc, 0, (n1 - n0) * T * sizeof(float));
  for (const W8Segment& seg : plan.segments)
    for (int64_t e = seg.e0; e < seg.e1; ++e) {
      const int64_t c = plan.entry_chunk[e];
      lut_build<T>(xt, c, seg.j0, seg.j1, tab);
      lut_rows<T>(p, c, seg.block, tab, n0, n1, acc);
    }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t n = n0; n < n1; ++n) y[i * p.N + n] = acc[(n - n0) * T + i] + (p.bias ? p.bias[n] : 0.f);
}

}  // namespace

void lut_rows_avx2(const Problem& p, const W8Plan& plan, const float* x, int64_t ldx, int64_t rows, int64_t n0,
                   int64_t n1, float* xt, float* tab, float* acc, float* y) {
  if (rows <= 8) lut_tile<8>(p, plan, x, ldx, rows, n0, n1, xt, tab, acc, y);
  else lut_tile<16>(p, plan, x, ldx, rows, n0, n1, xt, tab, acc, y);
}

int64_t lut_table_floats() { return kLutGroups * kLutGroupFloats; }

#else  // not x86-64

bool cpu_avx2_supported() { return false; }

#endif

}  // namespace ternary_cpu
