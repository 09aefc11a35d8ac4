// The CPU kernel's pieces shared by the op (ternary_cpu.cpp: checks, regimes, threads) and the
// AVX-512 code (ternary_cpu_kernels.cpp, no torch headers: it compiles in seconds).
#pragma once

#include <cstdint>
#include <vector>

// The kernels exist for x86-64 (gcc / clang target attributes); elsewhere only cpu_supported()
// (false) and make_plan.
#if defined(__x86_64__) && defined(__GNUC__)
#define TERNARY_CPU_KERNELS 1
#endif

namespace ternary_cpu {

constexpr int64_t kRows = 4;     // W rows a small-M task decodes once and runs every x row over
constexpr int64_t kChunk = 32;   // weights a decode covers: 8 packed bytes
constexpr int64_t kPiece = 1024; // weights of K a small-M task decodes before running x over them

// A run of local columns inside one scale block and one piece: chunks [c0, c1), the first and
// last masked to the segment's lanes (bit i: column 32c + i belongs to it). Chunks cut by a
// segment boundary (k_offset or block_size not multiples of 32, the end of K) appear in both.
struct Segment {
  int64_t block;                    // scale column: (k_offset + first column) / block_size
  int64_t c0, c1;
  uint32_t first_lanes, last_lanes;
};
struct Piece {
  int64_t s0, s1;   // segments [s0, s1)
  int64_t entries;  // chunks of its segments, counted once per segment
};
// The segmentation of K: a function of K, block_size and k_offset only, shared by every row.
struct Plan {
  std::vector<Segment> segments;
  std::vector<Piece> pieces;
  int64_t max_entries = 0, max_segments = 0;  // of one piece
};
Plan make_plan(int64_t K, int64_t block_size, int64_t k_offset);

// The pair-major kernel's segmentation of K: one segment a scale block, in pairs of columns
// [q0, q1) (the last pair of an odd K half past it, where x is zero). Needs block boundaries on
// even columns: k_offset and block_size even.
struct PairSegment {
  int64_t block, q0, q1;
};
struct PairPlan {
  std::vector<PairSegment> segments;
};
PairPlan make_pair_plan(int64_t K, int64_t block_size, int64_t k_offset);

// The VNNI tile's (vnni_rows_bf16) columns: for each pair q of columns (2q, 2q + 1) of the
// zero-padded K (kc), the scale column of each, or S for columns past K (scale 0 there).
struct VnniPlan {
  int64_t S = 0;                   // scale columns the shard reads: ceil((k_offset + K) / block_size)
  std::vector<int32_t> b0, b1;     // [kc / 2]
};
VnniPlan make_vnni_plan(int64_t K, int64_t kc, int64_t block_size, int64_t k_offset);
constexpr int64_t kVnniCols = 64;  // W rows a VNNI group: the N of one brgemm call
struct Problem {
  int64_t M, N, K;
  const uint8_t* packed;   // [N, ldp] uint8 codes, ldp >= ceil(K/4)
  int64_t ldp;
  const uint16_t* scale;   // [N, lds] fp16 bits, lds >= ceil((k_offset + K)/block_size)
  int64_t lds;
  const float* bias;       // [N] fp32, or nullptr
  const Plan* plan;
  const uint8_t* tail;     // rows tail_start .. N - 1 of packed, ldp apart, then 8 zero bytes
  int64_t tail_start;      // the first row whose 8-byte chunks could reach past the tensor's end

  // Row n's codes; a chunk may read up to 7 bytes past a row's ldp (see chunk_bits): into the
  // next row, or for the last rows into the tail copy's zero padding.
  const uint8_t* row(int64_t n) const { return n >= tail_start ? tail + (n - tail_start) * ldp : packed + n * ldp; }
};

// Whether this CPU runs the kernels below (cpuid: avx512 f/bw/vl/dq/vbmi/bf16, f16c, fma).
bool cpu_supported();
// Whether it runs their AVX2 versions (ternary_cpu_avx2.cpp; cpuid: avx2, fma, f16c).
bool cpu_avx2_supported();

// ---- The int8-activation (W2A8) kernel (ternary_cpu_w2a8.cpp) ----------------------------------
//
// A chunk is `width` weights of a row: 64 (16 packed bytes) for the small-M kernel, 4 (one
// packed byte) for the large-M tile; an entry is one chunk as one segment (the part of a scale
// block inside K) sees it: a chunk cut by a block boundary is two entries, each with x zeroed
// outside its segment, so the inner loops need no lane masks.
constexpr int64_t kW8Chunk = 64;
struct W8Segment {
  int64_t block;   // scale column: (k_offset + first column) / block_size
  int64_t e0, e1;  // entries [e0, e1)
  int64_t j0, j1;  // local columns [j0, j1)
};
struct W8Plan {
  std::vector<W8Segment> segments;
  std::vector<int64_t> entry_chunk;  // [E]: the chunk (`width` columns of K) of entry e
  int64_t width = 0, chunks = 0;     // chunks = ceil(K / width)
};
W8Plan make_w8_plan(int64_t K, int64_t block_size, int64_t k_offset, int64_t width);

// Whether this CPU runs the W2A8 kernel's AVX512-VNNI code (cpuid: avx512 f/bw/vl/vbmi/vnni,
// f16c, fma); without it, its AVX2 code where cpu_avx2_supported().
bool cpu_w2a8_supported();
// Whether the CPU has AMX-TILE and AMX-INT8 (cpuid; whether Linux lets the process use them: at::cpu::init_amx).
bool cpu_amx_int8_supported();

// What the W2A8 kernels read: x quantized and laid out by entries, the weights as packed.
struct W8Problem {
  int64_t M, N;
  const uint8_t* packed;   // [N, ldp] uint8 codes; rows n >= tail_from read from `tail`
  int64_t ldp;
  const uint8_t* tail;     // rows [tail_from, N) of packed, each zero-padded to row_bytes
  int64_t tail_from, row_bytes;  // row_bytes = 16 * ceil(K / 64)
  const uint16_t* scale;   // [N, lds] fp16 bits
  int64_t lds;
  const W8Plan* plan;      // the regime's: width 64 (small M) or 4 (tile)
  const int8_t* xe;        // [M, E, width] xq by entries (w8_entries_row)
  const int32_t* negsum;   // [M, S] -(sum of xq over segment s): the u = code + 1 correction
  int64_t E, S;
  const float* sx;         // [M] fp32
  const float* bias;       // [N] fp32, or nullptr

  // Row n's codes: 16 bytes from byte 16c for every chunk c, inside the tensor (or the tail copy).
  const uint8_t* row(int64_t n) const {
    return n >= tail_from ? tail + (n - tail_from) * row_bytes : packed + n * ldp;
  }
};

#ifdef TERNARY_CPU_KERNELS
// Row m of x (fp32 [K]) to int8: sx = absmax / 127 (1 where 0), xq = clamp(rne(x / sx), +-127),
// bit for bit activations.quantize_activations_int8 (IEEE division, not a reciprocal).
//   q: [K] int8. Returns sx.
float w8_quantize_row(const float* x, int64_t K, int8_t* q);
// Row of x in its dtype (bits: fp32, bf16 or fp16, `kind` 0 / 1 / 2) widened to fp32 [K]: exact.
void w8_widen_row(const void* x, int kind, int64_t K, float* out);
// One row's xq (q: [64 * ceil(K/64)] int8, zero past K) by entries: xe_row [E, width] int8 (width
// 64: its lanes permuted as the decoder's, ternary_cpu_w2a8.cpp), and negsum_row [S] int32.
void w8_entries_row(const W8Plan& plan, const int8_t* q, int8_t* xe_row, int32_t* negsum_row);
// y[m, n] = sx[m] * sum_b ws[n, b] * d[m, n, b] + bias[n] in fp32, for W rows [n0, n1):
//   small M (decode): the codes decoded in registers, each once per group of x rows;
//   large M (tile):   W rows decoded once into tile ([rows / 16, 16 ceil(K/64), 16, 4] u8,
//                     ws_tile [rows / 16, S, 16] fp32, this thread's) and every x row run over them.
//   y: [M, N] fp32 (decode); in `y_kind` (tile: 0 fp32, 1 bf16, 2 fp16 bits, x's dtype: rounded to
//   nearest even once, as torch converts, so the op's bf16 / fp16 output needs no fp32 copy of y)
void w8_rows_decode(const W8Problem& p, int64_t n0, int64_t n1, float* y);
void w8_rows_tile(const W8Problem& p, int64_t n0, int64_t n1, uint8_t* tile, float* ws_tile, void* y, int y_kind);
// The tile's W rows that fit in `bytes` for K (>= 32, a multiple of 32).
int64_t w8_tile_rows(int64_t K, int64_t bytes);

// The AMX kernel (W2A8 where the CPU has AMX-INT8; the driver and the numerics: ternary_cpu.cpp,
// gemm_w2a8_cpu).
// A row of x in its dtype (`kind` as w8_widen_row's) quantized as w8_quantize_row, stored as the
// brgemm's u8 side: a [lda] = xq + 128 (128 past K, lda >= K). Returns sx.
float w8_quantize_row_u8(const void* x, int kind, int64_t K, uint8_t* a, int64_t lda);
// W rows [n0, n1) as the VNNI B matrices of oneDNN's u8 x s8 brgemm, kVnniCols rows each:
// tile [ceil(rows / kVnniCols), kc / 4, kVnniCols, 4] int8, w = value(code) * q (0 past K and past
// the last row); comp [rows] = 128 * the row's sum of w (the u8 side is xq + 128); ws [rows].
// A row's block scales folded into int8 against the row's largest: S = max_b |s_b| over its
// blocks, q_b = rne(s_b / S * 127) (0 where S is 0), ws = S / 127, in fp32
// (activations.fold_block_scales).
void vnni_rows_s8(const W8Problem& p, const VnniPlan& plan, int64_t kc, int64_t n0, int64_t n1, int8_t* tile,
                  int32_t* comp, float* ws);
// y[i, j] = (float(c[i, j] - comp[j]) * sx[i]) * ws[j] + bias[j], each operation rounded in fp32,
// then to y's dtype (y_kind 0 fp32, 1 bf16, 2 fp16; nearest even) for i < rows, j < cols; `stream`
// as store_rows_bf16's.  c: [rows, ldc] int32; y: [rows, ldy]
void store_rows_w8(const int32_t* c, int64_t ldc, int64_t rows, int64_t cols, const float* sx, const int32_t* comp,
                   const float* ws, const float* bias, void* y, int64_t ldy, int y_kind, bool stream);

// The AVX2 versions (ternary_cpu_w2a8_avx2.cpp; cpu_avx2_supported), width 64 in both regimes:
// the same arguments, results and layouts, except the
// tile: [ceil(rows / 16), E, 16 k-steps, 16 rows, 4] u8 (an entry's u in the decoder's order, a
// k-step 4 of its bytes), ws_tile [ceil(rows / 16), S, 16] fp32, and y fp32 whatever x's dtype.
// w8_tile_rows_avx2: rows a tile of <= `bytes` holds (a multiple of 16).
float w8_quantize_row_avx2(const float* x, int64_t K, int8_t* q);
void w8_widen_row_avx2(const void* x, int kind, int64_t K, float* out);
void w8_entries_row_avx2(const W8Plan& plan, const int8_t* q, int8_t* xe_row, int32_t* negsum_row);  // width 64
void w8_rows_decode_avx2(const W8Problem& p, int64_t n0, int64_t n1, float* y);
void w8_rows_tile_avx2(const W8Problem& p, int64_t n0, int64_t n1, uint8_t* tile, float* ws_tile, float* y);
int64_t w8_tile_rows_avx2(int64_t E, int64_t bytes);
#endif

#ifdef TERNARY_CPU_KERNELS
// Small M: W row tiles [t0, t1) of kRows rows each, y[m, n] = sum + bias in fp32.
//   xb: [M, ldx] bf16 bits, x zero-padded to whole chunks (ldx >= 32 * ceil(K/32))
//   xf: [M, ldx] fp32, the same
//   y:  [M, N] fp32
void small_m_bf16(const Problem& p, const uint16_t* xb, int64_t ldx, float* y, int64_t t0, int64_t t1);
void small_m_f32(const Problem& p, const float* xf, int64_t ldx, float* y, int64_t t0, int64_t t1);

// Large M: W rows [n0, n0 + rows) dequantized (value(code) * scale) into tile rows [0, rows).
//   tile: [rows, ldt] bf16 bits / fp32, ldt >= 32 * ceil(K/32); columns past K left as they were
void dequantize_rows_bf16(const Problem& p, int64_t n0, int64_t rows, uint16_t* tile, int64_t ldt);
void dequantize_rows_f32(const Problem& p, int64_t n0, int64_t rows, float* tile, int64_t ldt);
// Past small M, bf16 x, blocks on even columns (k_offset and block_size even): W rows [n0, n1)
// decoded once into tile, pair-major ([ceil(rows / 16), kc / 2, 16, 2] bf16 +-1 / 0: 16 W rows x
// 2 columns a vector, the layout vdpbf16ps multiplies by a broadcast pair of x) with their scales
// in ws ([ceil(rows / 16), S, 16] fp32); every x row run over them, a scale block at a time:
// y[m, n] = sum_b scale[n, b] * (x . codes)_b + bias, fp32 sums rounded once to bf16.
//   xb: [M, kc] bf16 bits, zero-padded to whole chunks; y: [M, N] bf16 bits
void pair_rows_bf16(const Problem& p, const PairPlan& plan, const uint16_t* xb, int64_t kc, int64_t n0, int64_t n1,
                    uint16_t* tile, float* ws, uint16_t* y);
// Past small M, bf16 x, for oneDNN's batch-reduce GEMM (at::native::cpublas::brgemm: AMX tiles
// where the CPU has AMX-BF16): W rows [n0, n1) as the VNNI B matrices of kVnniCols rows each,
// [ceil(rows / kVnniCols), kc / 2, kVnniCols, 2] bf16, value(code) * scale rounded to bf16 (as
// dequantize_rows_bf16), zero past K and past the last row. With a K range [k0, k1) (multiples of
// kChunk, k1 -1: kc) only those columns: tile [ceil(rows / kVnniCols), (k1 - k0) / 2, kVnniCols, 2].
void vnni_rows_bf16(const Problem& p, const VnniPlan& plan, int64_t kc, int64_t n0, int64_t n1, uint16_t* tile,
                    int64_t k0 = 0, int64_t k1 = -1);
// y[i, j] = bf16(c[i, j] + bias[j]) (rounded to nearest even) for i < rows, j < cols; `stream`:
// streaming (non-temporal) stores where a store is whole and aligned, for a y past the caches.
//   c: [rows, ldc] fp32; bias: [cols] fp32 or nullptr; y: [rows, ldy] bf16 bits
void store_rows_bf16(const float* c, int64_t ldc, int64_t rows, int64_t cols, const float* bias, uint16_t* y,
                     int64_t ldy, bool stream);

// The AVX2 versions (ternary_cpu_avx2.cpp): x in fp32 for every input dtype.
void small_m_avx2(const Problem& p, const float* xf, int64_t ldx, float* y, int64_t t0, int64_t t1);
void dequantize_rows_f32_avx2(const Problem& p, int64_t n0, int64_t rows, float* tile, int64_t ldt);
// y[m, j] (ldy apart) = bias[j] + sum over k < kc of x[m, k] * tile[j, k], for M x rows (ldx apart,
// zero past K) and tile rows j < nt (ldt apart, zero past K): the large-M regime's GEMM on a decoded
// tile (TERNARY_CPU_AVX2_GEMM). bias: nt fp32 or nullptr.
void tile_gemm_f32_avx2(const float* x, int64_t ldx, int64_t M, const float* tile, int64_t ldt, int64_t nt,
                        int64_t kc, const float* bias, float* y, int64_t ldy);
// Past small M on AVX2 (TERNARY_CPU_AVX2_GEMM=lut, auto's choice): table lookups in place of
// multiplies. For a tile of up to 16 x rows and each entry of `plan` (make_w8_plan at width
// kLutWidth: 32 columns of K inside one scale block, x zero outside it), every group of 4 columns
// gets a table of its 81 sums of +-x or 0 (one fp32 lane per x row) indexed by a packed byte, and
// each W row adds the 8 entries its bytes name, then scale * that sum to its accumulator.
//   x: the tile's rows of x in fp32 (ldx apart); rows: 1 .. 16 (at most 8 run 8 lanes wide);
//   W rows [n0, n1); xt: [32 ceil(K / 32), 16] fp32, the tile transposed here (zero past rows and
//   K); tab: lut_table_floats() fp32, 64-byte aligned; acc: [(n1 - n0) * 16] fp32, 32-byte
//   aligned; y: the tile's first row of [M, N] fp32, bias added
constexpr int64_t kLutWidth = 32;
void lut_rows_avx2(const Problem& p, const W8Plan& plan, const float* x, int64_t ldx, int64_t rows, int64_t n0,
                   int64_t n1, float* xt, float* tab, float* acc, float* y);
int64_t lut_table_floats();
#endif

}  // namespace ternary_cpu
