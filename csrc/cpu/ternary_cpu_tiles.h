// The small-M regime's tiling, shared by the AVX-512 and the AVX2 code of the CPU kernel
// (ternary_cpu_kernels.cpp, ternary_cpu_avx2.cpp): compiled for F16C only, which both have; each
// includer passes its ISA's work in as callables. x86-64 only (TERNARY_CPU_KERNELS).
#pragma once

#include "ternary_cpu.h"

#ifdef TERNARY_CPU_KERNELS
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ternary_cpu {
namespace tiles {

// Packed bytes [8c, 8c + 8) of a row: a row's last chunk may end past its ldp bytes, inside the
// next row (its lanes past K are masked off), and the last rows are read from Problem::tail,
// a copy padded by 8 bytes, so no chunk reads past the tensor. One plain load: a branch
// to a byte-wise tail copy here made gcc keep every accumulator in memory (4x slower at M 2).
inline uint64_t chunk_bits(const uint8_t* row, int64_t c) {
  uint64_t v;
  std::memcpy(&v, row + c * 8, 8);
  return v;
}

// Chunk c's lanes inside a segment (bit i: column 32c + i).
inline uint32_t chunk_lanes(const Segment& seg, int64_t c) {
  uint32_t lanes = ~0u;
  if (c == seg.c0) lanes &= seg.first_lanes;
  if (c == seg.c1 - 1) lanes &= seg.last_lanes;
  return lanes;
}

// Both kernels' ISAs have F16C: the tiling code is compiled for it (and inlines the conversion of
// the scales, once per scale block and row: a portable conversion there cost 5-10 % at M 1-2).
#define TERNARY_TILES __attribute__((target("f16c")))

TERNARY_TILES inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// Where a group of x rows takes the piece's weights from.
enum class Src { kDecode, kDecodeKeep, kBuffer };  // decode; decode and keep in wbuf; read wbuf

// The tile's W rows (a missing row of the last tile points at zeros: codes 0, scales 0).
struct Rows {
  const uint8_t* packed[kRows];  // Problem::row(n) each
  const uint16_t* scale[kRows];  // [lds] each
};

// Zeroed scratch whose data() is 64-byte aligned: a zmm load that straddles two cache lines
// costs two on Zen 4, which made the kernel's loop 2x slower (4.6 vs 2.4 ns a chunk, 1 thread).
template <typename T>
class Scratch {
 public:
  explicit Scratch(size_t n) : bytes_(n * sizeof(T) + 64, 0) {}
  T* data() { return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(bytes_.data()) + 63) & ~uintptr_t{63}); }

 private:
  std::vector<unsigned char> bytes_;
};

// A prefetch as asm: gcc 12 deleted a loop of __builtin_prefetch / _mm_prefetch whose bound is not a
// constant (as a loop without effect), and no prefetch instruction was emitted.
inline void prefetch_l1(const char* a) { asm volatile("prefetcht0 %0" : : "m"(*a)); }
// Bytes [a, a + n) into L1, a prefetch a line.
inline void prefetch_range_l1(const void* a, int64_t n) {
  for (int64_t b = 0; b < n; b += 64) prefetch_l1(static_cast<const char*>(a) + b);
}

// The codes and scales of W rows [n0, n0 + kRows) into L1 while the tile before them is computed.
// Without it, rows of >= 512 bytes (K >= 2048) read from L3 or DRAM ran 1.6-1.7x slower than from
// L2 at M 1 on Zen 4 (rows of 256 bytes did not): the hardware prefetchers missed the pattern.
TERNARY_TILES inline void prefetch_rows(const Problem& p, int64_t n0) {
  const int64_t rows = std::min<int64_t>(kRows, p.N - n0);
  // row by row (a row may be in the tail copy); the scale rows are contiguous
  for (int64_t r = 0; r < rows; ++r) prefetch_range_l1(p.row(n0 + r), p.ldp);
  prefetch_range_l1(p.scale + n0 * p.lds, rows * p.lds * 2);
}

// Tiles [t0, t1) of kRows W rows: per tile, every piece through piecewise(piece, rows, sc, wbuf,
// tot, first) (sc: [kRows, S] fp32 scales of the piece's segments; wbuf: [kRows, max_entries, 32]
// of W; tot: [kRows, M, lanes] fp32 sums kept between pieces), then store(tot, n0).
template <typename W, typename Piecewise, typename Store>
TERNARY_TILES void small_m_tiles(const Problem& p, int64_t lanes, int64_t t0, int64_t t1, Piecewise piecewise, Store store) {
  const Plan& plan = *p.plan;
  Scratch<W> wbuf(kRows * plan.max_entries * kChunk);
  Scratch<float> tot(kRows * p.M * lanes);
  Scratch<float> sc(kRows * plan.max_segments);
  const std::vector<uint8_t> zero_packed(p.ldp + 8, 0);  // a row and the 8 bytes a chunk may read past it
  const std::vector<uint16_t> zero_scale(p.lds, 0);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kRows;
    if (t + 1 < t1) prefetch_rows(p, n0 + kRows);
    Rows rows;
    for (int64_t r = 0; r < kRows; ++r) {
      const bool real = n0 + r < p.N;
      rows.packed[r] = real ? p.row(n0 + r) : zero_packed.data();
      rows.scale[r] = real ? p.scale + (n0 + r) * p.lds : zero_scale.data();
    }
    for (size_t q = 0; q < plan.pieces.size(); ++q) {
      const Piece& piece = plan.pieces[q];
      // fp32 scales of the piece's segments, [kRows, S]: converted once, not once a group
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t s = piece.s0; s < piece.s1; ++s)
          sc.data()[r * (piece.s1 - piece.s0) + (s - piece.s0)] = half_to_float(rows.scale[r][plan.segments[s].block]);
      piecewise(piece, rows, sc.data(), wbuf.data(), tot.data(), q == 0);
    }
    store(tot.data(), n0);
  }
}

}  // namespace tiles
}  // namespace ternary_cpu
#endif  // TERNARY_CPU_KERNELS
