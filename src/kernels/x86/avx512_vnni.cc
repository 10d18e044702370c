// The AVX-512 VNNI int8 GEMM (gemm_nt_q8 of the AVX-512 table on CPUs with
// avx512vnni): its own translation unit because it is compiled with
// -mavx512vnni, which the rest of the AVX-512 table must not assume
// (Skylake-SP has AVX-512 without VNNI). Same rules as avx512.cc: internal
// linkage, no inline library functions.
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/prepared_chunks.h"
#include "kernels/x86/avx512_util.h"
#include "kernels/x86/panel_split.h"
#include "kernels/x86/q8_drive.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

// int8 weights (util/quant.h: 16-block groups interleaved 4 bytes at a time,
// each followed by its f16 scales) against activations rounded to int8 per
// block of 32 (kernels.h has the semantics). One 64-byte step of a full group holds 4
// weights of each of 16 blocks, a 32-bit lane per block, so per W row,
// activation row and group (8 steps):
//   acc = -128 * sum(a of each block)                  (16 int32 lanes)
//   acc = dpbusd(acc, w ^ 0x80, a)   x 8               (lane l: block l's dot, exact)
//   facc = fma(w_scale * a_scale, float(acc), facc)    (16 blocks at once)
// and C = hsum(facc). vpdpbusd multiplies unsigned by signed bytes: w ^ 0x80
// is w + 128 read as unsigned, and the prepared row carries each block's
// -128 * sum(a), which removes the offset exactly. A block's dot is at most
// 32 * 127^2 < 2^24, so it converts to f32 exactly. A group costs 8 loads,
// 8 xors and 8 dpbusd per W row (the xor is shared by the tile's rows) plus
// 3 vector ops for its 16 scales: about a third of the instructions per
// weight byte of the int16 kernel this replaced, which left batch-1 int8
// decode bound by compute. Nothing depends on M, the tile or the column
// split (the gemm_nt contract).

constexpr int64_t kFarMaxM = 8;      // as avx512.cc: chunks this small read W rows far apart
constexpr int64_t kQ8ActBytes = 40;  // per block of a prepared row: 32 int8, f32 scale, int32 offset
// Decode (far) tiles prefetch each stream 2 rows ahead, and every tile
// prefetches into the table's level (kernels.h, Prefetch; prefill tiles
// fetch the next tile's rows, M32 streamed 4.4 GB/s with either hint).
// With 1 row ahead into L2 (T1) a Zen 5 core streamed int8 rows at 21.5
// GB/s; T0 alone gave 26.3, T0 and 2 rows 29.9, and no software prefetch
// 15.7 (bench_kernels avx512/gemm_nt_q8_stream/M1_N1536_K512, one thread,
// medians of 6 interleaved rounds; M4: 13.0 -> 17.4). A 544-byte int8 row
// is half a bf16 row, so one row ahead was half as far ahead in bytes. A
// Zen 4 core, 2 rows ahead, streamed 15.3-17.0 GB/s into L1 and 20.9-21.9
// into L2 (M4: 11.0-12.7 -> 15.8-18.5); 1, 4 and 8 rows ahead into L2 were
// within 10% of 2.
constexpr int64_t kQ8FarAhead = 2;

// A full group of 16 blocks (512 int8 in natural order, as prepare_groups_q8
// rounds them) -> the kQ8 interleave (q8_drive.h, q8_interleave_group): word
// t of block l (4 bytes) goes to word 16 t + l. That is a transpose of a
// 16 x 8 matrix of words. Held in 8 registers of 16 words, word 8 l + t is
// register l / 2, lane 8 (l % 2) + t; it must end in register t, lane l.
// Each of three permute stages swaps one bit of the register index with one
// bit of the lane index (l1 with t0, l2 with t1, l3 with t2), combining the
// pairs of registers that differ in that bit; the last stage also puts the
// lanes in block order. 24 two-source permutes replace 128 4-byte copies.
// (The index vectors come from simulating the three layouts.)
inline void q8_interleave_group16(const uint8_t* blocks, uint8_t* out) {
  __m512i z[8];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) z[p] = _mm512_load_si512(blocks + 64 * p);
  // One stage: registers r and r | bit -> lanes chosen by lo (into r) and
  // lo + step (into r | bit); an index >= 16 takes lane index - 16 of the
  // second register.
  auto stage = [&z](int bit, __m512i lo, int step) {
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(step));
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      if (r & bit) continue;
      const __m512i a = z[r], b = z[r | bit];
      z[r] = _mm512_permutex2var_epi32(a, lo, b);
      z[r | bit] = _mm512_permutex2var_epi32(a, hi, b);
    }
  };
  stage(1, _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30), 1);
  stage(2, _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29), 2);
  stage(4, _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27), 4);
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) _mm512_storeu_si512(out + 64 * t, z[t]);
}

// Lane b of the result = the unsigned max of d[b]'s 16 lanes: hsum16's
// transpose tree (avx512.cc) with max for add.
inline __m512i max16_epu32(const __m512i (&d)[16]) {
  __m512i x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    x[i] =
        _mm512_max_epu32(_mm512_unpacklo_epi32(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_epi32(d[2 * i], d[2 * i + 1]));
  __m512i y[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    y[i] =
        _mm512_max_epu32(_mm512_unpacklo_epi64(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
  const __m512i u01 = _mm512_max_epu32(_mm512_shuffle_i32x4(y[0], y[1], 0x88), _mm512_shuffle_i32x4(y[0], y[1], 0xDD));
  const __m512i u23 = _mm512_max_epu32(_mm512_shuffle_i32x4(y[2], y[3], 0x88), _mm512_shuffle_i32x4(y[2], y[3], 0xDD));
  return _mm512_max_epu32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xDD));
}

// One group of r <= 16 blocks (32 r values at a) -> its 32 r interleaved
// int8 (out), r scales (qs) and r offsets (qc), rounded as
// util/quant.h's quantize_a8_row does, with the per-block reductions done
// for the whole group at once: the largest |x| as the unsigned max of the
// sign-cleared bits (for non-negative floats the same order; NaN and inf
// are the patterns from 0x7f800000 up, so the same max flags them), and
// each block's sum as vpdpbusd of the interleaved bytes against ones (lane
// l holds block l's bytes in every step of 4 r bytes). One thread,
// bench_kernels avx512/prepare_q8/M32_K1536, 3 rounds in turn, against a
// reduction chain per block: 10.8 -> 6.6-6.7 us (14.6-17.1 -> 8.9-11.1
// beside a build on the other core). kFull: r is 16 at compile time; with
// r known only at run time the full groups took 6.8 us.
template <bool kFull>
void prepare_group_q8(const float* a, int64_t group_blocks, uint8_t* out, float* qs, int32_t* qc) {
  const int64_t r = kFull ? 16 : group_blocks;
  const __mmask16 lanes = tail_mask(r);
  const __m512i sign_off = _mm512_set1_epi32(0x7fffffff);
  __m512i m[16];
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l)  // blocks past r: 0, which counts as tiny below
    m[l] = l < r ? _mm512_max_epu32(_mm512_and_si512(_mm512_loadu_si512(a + l * 32), sign_off),
                                    _mm512_and_si512(_mm512_loadu_si512(a + l * 32 + 16), sign_off))
                 : _mm512_setzero_si512();
  const __m512i amax_bits = max16_epu32(m);
  const __m512 amax = _mm512_castsi512_ps(amax_bits);
  const __mmask16 bad = _mm512_cmpge_epu32_mask(amax_bits, _mm512_set1_epi32(0x7f800000));
  // Blocks below 2^-100 count as all zero (util/quant.h, quantize_a8_row).
  const __mmask16 tiny =
      _mm512_mask_cmp_ps_mask(static_cast<__mmask16>(~bad), amax, _mm512_set1_ps(0x1p-100f), _CMP_LT_OQ);
  const __mmask16 ok = static_cast<__mmask16>(~(bad | tiny));
  const __m512 c127 = _mm512_set1_ps(127.0f);
  _mm512_mask_storeu_ps(
      qs, lanes, _mm512_mask_mov_ps(_mm512_maskz_div_ps(ok, amax, c127), bad, _mm512_set1_ps(__builtin_nanf(""))));
  alignas(64) float inv[16];
  _mm512_store_ps(inv, _mm512_maskz_div_ps(ok, c127, amax));
  alignas(64) uint8_t blocks[512];
#pragma GCC unroll 2
  for (int l = 0; l < r; ++l) {
    __m128i b0 = _mm_setzero_si128(), b1 = _mm_setzero_si128();
    if ((ok >> l) & 1) {
      const __m512 vinv = _mm512_set1_ps(inv[l]);
      // cvtps rounds to nearest even (the default MXCSR mode), like nearbyint; |q| <= 127.
      b0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(a + l * 32), vinv)));
      b1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(a + l * 32 + 16), vinv)));
    }
    _mm_store_si128(reinterpret_cast<__m128i*>(blocks + l * 32), b0);
    _mm_store_si128(reinterpret_cast<__m128i*>(blocks + l * 32 + 16), b1);
  }
  if (kFull)
    q8_interleave_group16(blocks, out);
  else
    q8_interleave_group(blocks, r, out);
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_maskz_loadu_epi32(lanes, out + 4 * r * t));
  _mm512_mask_storeu_epi32(qc, lanes,
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));  // -128 * sum
}

// Groups [g0, g1) of one row of A (a: the row's first value) -> their part
// of the prepared row: K int8 in the weights' interleaved order, then K/32
// f32 scales, then K/32 int32 offsets (-128 * block sum). A group's values,
// scales and offsets depend on its 16 blocks alone.
void prepare_groups_q8(const float* a, int64_t K, int64_t g0, int64_t g1, uint8_t* out) {
  const int64_t nb = K / 32;
  float* qs = reinterpret_cast<float*>(out + K);
  int32_t* qc = reinterpret_cast<int32_t*>(out + K + nb * 4);
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t r = min64(16, nb - g * 16);
    (r == 16 ? prepare_group_q8<true> : prepare_group_q8<false>)(a + g * 512, r, out + g * 512, qs + g * 16,
                                                                 qc + g * 16);
  }
}

// MR prepared A rows (qa_stride bytes apart) against NR W rows (NR memory
// streams): MR x NR int accumulators + NR W + A + the 0x80 constant in
// zmm (22 at 4 x 4, 18 at 1 x 8); the f32 sums stay on the stack between
// groups. kOne: K <= 512, a single group, whose scaled sums stay in
// registers for the horizontal sums (the same fma onto zero, so the same
// bits).
template <Prefetch P, int MR, int NR, bool kPrefetch, bool kOne>
void q8_tile_body(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t row_bytes, float* C,
                  int64_t ldc, int64_t cs, const uint8_t* prefetch) {
  const int64_t nb = K / 32;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  // The f32 sums live on the stack: they are touched once per group, and
  // keeping them in registers next to the integer accumulators spilled
  // inside the group loop.
  alignas(64) float facc[MR][NR][16];
  if constexpr (!kOne) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm512_store_ps(facc[i][j], _mm512_setzero_ps());
  }
  __m512 sums1[MR][NR];  // kOne: the scaled sums, kept in registers
  const int64_t groups = kOne ? 1 : (nb + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r = min64(16, nb - g * 16), step = 4 * r;
    const __mmask16 mask = tail_mask(r);
    __m512i acc[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i c = _mm512_maskz_loadu_epi32(mask, qa + i * qa_stride + K + nb * 4 + g * 64);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = c;
    }
    const int64_t wo = q8_group_values(g), so = q8_group_scales(g, r);  // in a W row
    const uint8_t* wg = W + wo;
    const uint8_t* ag = qa + g * 512;
    if (r == 16) {
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        __m512i wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          if (kPrefetch)
            _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * row_bytes + wo + t * 64), kHintOf<P>);
          wv[j] = _mm512_xor_si512(_mm512_loadu_si512(wg + j * row_bytes + t * 64), bias);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512i av = _mm512_loadu_si512(ag + i * qa_stride + t * 64);
#pragma GCC unroll 8
          for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], av);
        }
      }
    } else {  // the row's last, partial group: r lanes; the masked-off lanes read as 0 (w ^ 0x80 times a = 0)
      if (kPrefetch) {
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j)
          for (int64_t o = 0; o < 32 * r; o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * row_bytes + wo + o), kHintOf<P>);
      }
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        __m512i wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j)
          wv[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi32(mask, wg + j * row_bytes + t * step), bias);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512i av = _mm512_maskz_loadu_epi32(mask, ag + i * qa_stride + t * step);
#pragma GCC unroll 8
          for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], av);
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * row_bytes + so), kHintOf<P>);
      const __m512 sw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, W + j * row_bytes + so));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 sa = _mm512_maskz_loadu_ps(mask, qa + i * qa_stride + K + g * 64);
        const __m512 prev = kOne ? _mm512_setzero_ps() : _mm512_load_ps(facc[i][j]);
        const __m512 sum = _mm512_fmadd_ps(_mm512_mul_ps(sw, sa), _mm512_cvtepi32_ps(acc[i][j]), prev);
        if constexpr (kOne)
          sums1[i][j] = sum;
        else
          _mm512_store_ps(facc[i][j], sum);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    __m512 sums[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) sums[j] = kOne ? sums1[i][j] : _mm512_load_ps(facc[i][j]);
    store_hsums(sums, C + i * ldc, cs);
  }
}

// The tile with its prefetch, and whether K is a single group, decided once
// per call. One group (K <= 512: every k3-base matrix but the experts' down
// projections) skips the stack sums: one thread, K 512 (bench_kernels
// avx512/gemm_nt_q8_(hot|stream)/M(1|8|32|128)_N1536_K512, 3 rounds in
// turn, Zen 4) M8 hot 224-227 -> 258-268 GOP/s, M1 hot 111-122 -> 129-137,
// M128 hot 272-280 -> 290-294; K 1536 the same within noise. (Done with a
// runtime test inside one body, the same idea was 10-20% slower.)
// The prefetch: tested inside the k
// loop, GCC 12 kept a branch and the prefetch addresses' pointers (spilled
// to the stack) in every step of the unprefetched tiles too, which are all
// but the first row tile of a prefill. Templated, bench_kernels
// avx512/gemm_nt_q8_(hot|stream)/M(8|32|128) (one thread, 3 rounds in turn
// on the Zen 5 host) rose 10-15% at M 32 and M 128: M32 N1536 K512 streamed
// 291-345 -> 348-398 GOP/s, M128 N512 K1536 hot 438-454 -> 422-502.
template <Prefetch P, int MR, int NR>
void q8_tile(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t row_bytes, float* C,
             int64_t ldc, int64_t cs, const uint8_t* prefetch) {
  const bool one = K <= 512;
  const Q8TileFn body = prefetch != nullptr
                            ? (one ? q8_tile_body<P, MR, NR, true, true> : q8_tile_body<P, MR, NR, true, false>)
                            : (one ? q8_tile_body<P, MR, NR, false, true> : q8_tile_body<P, MR, NR, false, false>);
  body(K, qa, qa_stride, W, row_bytes, C, ldc, cs, prefetch);
}

// 4 x 4 prefill tiles (16 accumulators, 4 W, A and the 0x80 constant in
// zmm). 6 x 4 needs 30 of the 32 zmm, and GCC 12 spilled two accumulators
// and the W row pointers in every k step of it: on a Zen 5 core
// (bench_kernels avx512/gemm_nt_q8_(hot|stream)/M(32|128), one thread, 3
// rounds in turn) 4 x 4 ran M32 N1536 K512 streamed at 225-337 GOP/s
// against 202-277 for 6 x 4 (5 x 4: 220-304), and M128 N512 K1536 hot at
// 360-459 against 287-362. (On the Zen 4 host, at M = 32 with W streamed,
// 6 x 4 had run 132-195 GOP/s and 4 x 3 97-150.)
constexpr int kQ8Mr = 4;
constexpr int kQ8Nr = 4;
// Far streams of a one-row (decode) tile, per prefetch level. 8 were
// chosen on 2026-12-02 for the int16 kernel this file had then. With the
// VNNI tiles and the prefetch into L2, a Zen 4 core streams one row faster
// with 4 (bench_kernels avx512/gemm_nt_q8_stream/M1_N1536_K512, one thread,
// 4 rounds in turn: 18.5-20.8 GB/s with 8, 23.6-24.9 with 4, 21.1-22.1
// with 6; M1_N512_K1536 the same within 5%), and k3-base int8 decode on one
// thread took 6.5-6.9 ms a step instead of 7.4-7.9 (6 pairs in turn). The
// L1 level, chosen on Zen 5 and Intel, keeps the 8 it was measured with.
template <Prefetch P>
constexpr int kQ8FarNr1 = P == Prefetch::kL2 ? 4 : 8;
// kQ8Tiles<P>[(mr - 1) * kQ8Nr + nr - 1] = q8_tile<P, mr, nr>.
template <Prefetch P, int... I>
constexpr auto make_q8_tiles(std::integer_sequence<int, I...>) {
  return std::array<Q8TileFn, sizeof...(I)>{q8_tile<P, I / kQ8Nr + 1, I % kQ8Nr + 1>...};
}
template <Prefetch P>
constexpr auto kQ8Tiles = make_q8_tiles<P>(std::make_integer_sequence<int, kQ8Mr * kQ8Nr>{});

template <Prefetch P>
constexpr Q8Tiling kTiling = {kQ8Mr,       kFarMaxM,    kQ8FarNr1<P>,      kQ8Nr, kQ8Nr, kQ8Nr,
                              kQ8ActBytes, kQ8FarAhead, P == Prefetch::kL2};
static_assert(kQ8FarNr1<Prefetch::kL2> <= kQ8Nr, "the L2 level's one-row tile is one of kQ8Tiles");

// ---- int8 panels (gemm_nt_q8p16) ------------------------------------------
//
// W in the int8 panel layout (util/q8_panel.h): a 64-byte load of block b,
// step t of a panel holds weights 32b + 4t .. +3 of its 16 rows, stored
// offset by 128, so vpdpbusd takes it as is (no xor) against the
// activation row's 4 bytes broadcast: lane c accumulates row c's block dot
// (exact, with the prepared row's -128 * block sum as its start). Per
// block and tile (MR rows x NP panels):
//   acc = -128 * sum(a of block b)                       (MR x NP, 16 lanes)
//   acc = dpbusd(acc, w, broadcast(a[4 bytes]))  x 8
//   facc = fma(w_scale * a_scale, float(acc), facc)      (16 outputs at once)
// and each lane is one output: no horizontal sums. The prepared rows are the
// kQ8 kernel's (prepare_groups_q8: blocks interleaved 4 bytes at a time within
// groups of 16), so block b, step t of a row sits at group b / 16, offset
// t * 4r + 4 (b % 16), r the group's block count. One thread on the Zen 4
// host, bench_kernels avx512/gemm_nt_q8(p16)?_(hot|stream), 2 rounds in
// turn, GOP/s, rows -> panels: M128 N1536 K512 hot 292-296 -> 326-331; M16
// N1536 K512 streamed (a thread's expert at prefill) 269 -> 304-306; M8
// N512 K320 hot (the attention output projection, 10 of 16 lanes busy in
// the row tile) 158 -> 284-297. One row (decode) streams slower: M1 N1536
// K512 28.2-28.7 -> 20.2 GB/s (docs/performance.md, "int8 panels").
// Rows of A and panels per prefill tile: 6 x 2 holds 12 int and 12 f32
// accumulators, 2 W, a broadcast and 2 weight-scale vectors in zmm (29 of
// 32; each row's offset and scale are read off its pointer when used). 12
// dot chains where 4 x 2 had 8, for a core retiring two vpdpbusd a cycle at
// latency 5: one thread on the 480 MiB-L3 Intel host, bench_kernels
// avx512/gemm_nt_q8c?p16_hot, 2 rounds in turn, 4 x 2 -> 6 x 2: q8p16 M128
// N1536 K512 364-378 -> 382-401 GOP/s, M32 N512 K1536 351-381 -> 357-423,
// q8cp16 M128 N1536 K512 392-403 -> 416-444; streamed M32 0-12% more.
// End to end (k3-base int8 panel prefill, 2 threads) within 1-2%.
constexpr int kQ8PMr = 6;
constexpr int kQ8PNp = 2;

inline float load_f32(const uint8_t* p) {
  float v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// One block of 32 k for a q8p_tile: a[i] is row i's first word of the
// block, w[j] panel j's first byte of it, step the bytes between a row's
// words t and t + 1 (64 in a full group of 16 blocks, known at compile time
// there so each broadcast is one load off a row pointer held in a register;
// with the step read at run time GCC 12 kept 32 precomputed addresses on
// the stack and loaded one per broadcast). Row i's block offset and
// activation scale sit to_offset and to_scale bytes past a[i], read where
// they are used rather than held in zmm for the whole block.
template <int MR, int NP, int kStep, bool kChannel>
__attribute__((always_inline)) inline void q8p_block(const uint8_t* const (&a)[MR], const uint8_t* const (&w)[NP],
                                                     int64_t step, int64_t to_offset, int64_t to_scale,
                                                     const __m512 (&sw)[NP], __m512 (&facc)[MR][NP]) {
  const int64_t st = kStep != 0 ? kStep : step;
  __m512i acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512i offset = _mm512_set1_epi32(load_i32(a[i] + to_offset));
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[i][j] = offset;
  }
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) {
    __m512i wv[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) wv[j] = _mm512_loadu_si512(w[j] + t * 64);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(load_i32(a[i] + t * st));
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], av);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512 sa = _mm512_set1_ps(load_f32(a[i] + to_scale));
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
      facc[i][j] = kChannel ? _mm512_fmadd_ps(sa, _mm512_cvtepi32_ps(acc[i][j]), facc[i][j])
                            : _mm512_fmadd_ps(_mm512_mul_ps(sw[j], sa), _mm512_cvtepi32_ps(acc[i][j]), facc[i][j]);
  }
}

// C[0..MR, 16 * NP columns) = prepared rows qa[0..MR) (qa_stride bytes
// apart) . (NP panels from W, ps bytes apart)^T; panel j's outputs go to
// C + j * pcs. Spreads `spread`'s prefetches over its blocks. kChannel: the
// channel-scale panels (kQ8CP16), whose blocks take the activation scale
// only and whose 16 f32 weight scales multiply the sums once at the end.
template <int MR, int NP, bool kChannel>
void q8p_tile(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t ps, float* C, int64_t ldc,
              int64_t pcs, PanelSpread spread) {
  const int64_t nb = K / 32;
  const uint8_t* w_scales = W + 16 * K;
  __m512 facc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) facc[i][j] = _mm512_setzero_ps();
  SpreadState st(spread);
  for (int64_t g = 0; g * 16 < nb; ++g) {
    const int64_t r = min64(16, nb - g * 16);
    for (int64_t l = 0; l < r; ++l) {
      const int64_t b = g * 16 + l;
      // Row i's block-b word sits `word` bytes into its prepared row (K
      // values, nb scales, nb offsets); its scale and offset at the same
      // distance from that word in every row.
      const int64_t word = g * 512 + 4 * l;
      const int64_t to_scale = K + b * 4 - word, to_offset = to_scale + nb * 4;
      const uint8_t* a[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) a[i] = qa + i * qa_stride + word;
      const uint8_t* w[NP];
      __m512 sw[NP];
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        w[j] = W + j * ps + b * 512;
        if constexpr (!kChannel)
          sw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_scales + j * ps + b * 32)));
      }
      // Opaque to the optimizer, so each broadcast and weight load below
      // is one load off a pointer in a register plus a constant. Without
      // it GCC 12 strength-reduced the rows' addresses across blocks and
      // spent 2-3 scalar instructions (lea, add, reloads from the stack)
      // on each broadcast, which on a core retiring two vpdpbusd a cycle
      // (the 480 MiB-L3 Intel host) made the tile front-end bound: one
      // thread, bench_kernels avx512/gemm_nt_q8(c)?p16_hot, 5-12% more
      // GOP/s; k3-base int8 panel prefill, 2 threads, 4-5% less a step.
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) __asm__("" : "+r"(a[i]));
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) __asm__("" : "+r"(w[j]));
      if (r == 16)
        q8p_block<MR, NP, 64, kChannel>(a, w, 64, to_offset, to_scale, sw, facc);
      else
        q8p_block<MR, NP, 0, kChannel>(a, w, 4 * r, to_offset, to_scale, sw, facc);
      if (spread.lines > 0) panel_spread_step(spread, st, nb);
    }
  }
  if constexpr (kChannel) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const __m512 sc = _mm512_loadu_ps(reinterpret_cast<const float*>(w_scales + j * ps));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) facc[i][j] = _mm512_mul_ps(sc, facc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(C + i * ldc + j * pcs, facc[i][j]);
}

// kQ8PTiles<C>[(mr - 1) * kQ8PNp + np - 1] = q8p_tile<mr, np, C>.
template <bool kChannel, int... I>
constexpr auto make_q8p_tiles(std::integer_sequence<int, I...>) {
  return std::array<Q8PTileFn, sizeof...(I)>{q8p_tile<I / kQ8PNp + 1, I % kQ8PNp + 1, kChannel>...};
}
template <bool kChannel>
constexpr auto kQ8PTiles = make_q8p_tiles<kChannel>(std::make_integer_sequence<int, kQ8PMr * kQ8PNp>{});

// Rows of A a panel group is reused over (panel_split.h, drive_q8_panels).
// The chunk keeps a group's rows of A in L1 beside it: one thread,
// bench_kernels avx512/gemm_nt_q8p16_stream (Zen 4, GOP/s), all rows at once
// -> 16 at a time: M32 N1536 K512 287 -> 310, M48 282 -> 319, M32 N512 K1536
// 302 -> 319; M16 and W in cache unchanged (8 rows at a time: the same
// within 3%).
constexpr int64_t kQ8PRowChunk = 16;

}  // namespace

// This file's PreparedGemm (kernels.h): the rows prepared above, the driver
// (x86/q8_drive.h) with this file's tiles.
int64_t q8_row_bytes_avx512vnni(int64_t K) {
  return K / 32 * kQ8ActBytes;
}
void prepare_q8_avx512vnni(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_q8_cols(M, K, 0, K, A, lda, P, kQ8ActBytes, prepare_groups_q8);
}
void prepare_q8_cols_avx512vnni(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P) {
  prepare_q8_cols(M, K, k0, k1, A, lda, P, kQ8ActBytes, prepare_groups_q8);
}
template <Prefetch Pf>
void gemm_q8_prepared_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                 int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  gemm_q8_drive(kTiling<Pf>, M, n0, n1, K, P, static_cast<const uint8_t*>(W), C, ldc, [](int64_t mr, int64_t nr) {
    return nr > kQ8Nr ? Q8TileFn{q8_tile<Pf, 1, kQ8FarNr1<Pf>>} : kQ8Tiles<Pf>[(mr - 1) * kQ8Nr + nr - 1];
  });
}
template <Prefetch Pf>
void gemm_nt_q8_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                           float* C, int64_t ldc) {
  gemm_prepared_chunks<q8_row_bytes_avx512vnni, prepare_q8_avx512vnni, gemm_q8_prepared_avx512vnni<Pf>>(
      M, n0, n1, K, A, lda, W, 0, C, ldc);
}
// The int8 panel GEMMs (kernels.h, gemm_nt_q8p16; kChannel: gemm_nt_q8cp16,
// one multiply a block fewer) on the same prepared rows;
// a thread's share that cuts a panel computes it whole on the stack
// (panel_split.h). Independent of the prefetch level: its tiles prefetch
// into L2 as the f32 panel tiles do.
template <bool kChannel>
void gemm_q8p_prepared_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                  int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  gemm_q8_panels_prepared<kQ8PRowChunk, kQ8PMr, kQ8PNp, kChannel>(
      M, n0, n1, K, P, K / 32 * kQ8ActBytes, static_cast<const uint8_t*>(W), C, ldc,
      [](int64_t mr, int64_t np) { return kQ8PTiles<kChannel>[(mr - 1) * kQ8PNp + np - 1]; });
}
// The whole GEMM on rows of A, rounded a chunk at a time (prepared_chunks.h).
template <bool kChannel>
void gemm_nt_q8p_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                            float* C, int64_t ldc) {
  gemm_prepared_chunks<q8_row_bytes_avx512vnni, prepare_q8_avx512vnni, gemm_q8p_prepared_avx512vnni<kChannel>>(
      M, n0, n1, K, A, lda, W, 0, C, ldc);
}
template void gemm_q8p_prepared_avx512vnni<false>(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*,
                                                  int64_t, float*, int64_t);
template void gemm_q8p_prepared_avx512vnni<true>(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*,
                                                 int64_t, float*, int64_t);
template void gemm_nt_q8p_avx512vnni<false>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint8_t*,
                                            float*, int64_t);
template void gemm_nt_q8p_avx512vnni<true>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint8_t*,
                                           float*, int64_t);
template void gemm_q8_prepared_avx512vnni<Prefetch::kL1>(int64_t, int64_t, int64_t, int64_t, const uint8_t*,
                                                         const void*, int64_t, float*, int64_t);
template void gemm_q8_prepared_avx512vnni<Prefetch::kL2>(int64_t, int64_t, int64_t, int64_t, const uint8_t*,
                                                         const void*, int64_t, float*, int64_t);
template void gemm_nt_q8_avx512vnni<Prefetch::kL1>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                                                   const uint8_t*, float*, int64_t);
template void gemm_nt_q8_avx512vnni<Prefetch::kL2>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                                                   const uint8_t*, float*, int64_t);

}  // namespace k3::kernels
