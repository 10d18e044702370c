// The loops of amx_q8_study (its header says what each measures), in their
// own translation unit because they are compiled with the AMX flags
// (cmake/isa.cmake): call them only after the study has checked CPUID and
// the OS.
#include "amx_q8_study.h"

#include <cstdint>

#include "kernels/x86/amx_tile_config.h"

namespace k3::amx_study {
namespace {

// C tiles 0-3: 16 x 16 int32; A tiles 4, 5: 16 rows of k bytes; B tiles 6,
// 7: k / 4 rows of 64 bytes (16 columns x 4 bytes).
void configure(int k) {
  kernels::TileConfig cfg;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = static_cast<uint16_t>(k);
  }
  for (int t = 6; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(k / 4);
    cfg.colsb[t] = 64;
  }
  kernels::load_tile_config(cfg);
}

alignas(64) int8_t g_a[2][16 * 64];
alignas(64) int8_t g_b[2][16 * 64];
// Results of 4 blocks x 4 tiles (16 KiB: stays in L1); one block's 4 KiB
// per iteration, cycling.
alignas(64) int32_t g_d[4][4][256];
alignas(64) float g_sw[16][16];
alignas(64) float g_sa[32];

// The sums of one block's 4 result tiles (64 rows of 16): per row
// acc = fma(w_scale * a_scale, float(D), acc), the kernel's tail.
inline void epilogue(const int32_t (*d)[256], int64_t block, __m512* acc) {
  const __m512 w = _mm512_load_ps(g_sw[block & 15]);
  for (int t = 0; t < 4; ++t)
    for (int r = 0; r < 16; ++r) {
      const __m512 s = _mm512_mul_ps(w, _mm512_set1_ps(g_sa[r + 16 * (t >> 1)]));
      acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_load_si512(d[t] + 16 * r)), acc[t]);
    }
}

inline void block_products(int32_t (*d)[256]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, g_a[0], 64);
  _tile_loadd(5, g_a[1], 64);
  _tile_loadd(6, g_b[0], 64);
  _tile_loadd(7, g_b[1], 64);
  _tile_dpbssd(0, 4, 6);
  _tile_dpbssd(1, 4, 7);
  _tile_dpbssd(2, 5, 6);
  _tile_dpbssd(3, 5, 7);
  _tile_stored(0, d[0], 64);
  _tile_stored(1, d[1], 64);
  _tile_stored(2, d[2], 64);
  _tile_stored(3, d[3], 64);
}

float checksum(const __m512* acc) {
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

}  // namespace

void init() {
  for (int i = 0; i < 16 * 64; ++i) {
    g_a[0][i] = g_a[1][i] = static_cast<int8_t>(i % 7 - 3);
    g_b[0][i] = g_b[1][i] = static_cast<int8_t>(i % 5 - 2);
  }
  for (int i = 0; i < 256; ++i) g_sw[i / 16][i % 16] = 1e-3f;
  for (float& s : g_sa) s = 1e-2f;
}

float loop_products(int64_t iters, int k) {
  configure(k);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, g_d[0][0], 64);
  _tile_release();
  return static_cast<float>(g_d[0][0][0]);
}

float loop_blocks(int64_t iters) {
  configure(32);
  for (int64_t i = 0; i < iters; ++i) block_products(g_d[i & 3]);
  _tile_release();
  return static_cast<float>(g_d[0][0][0]);
}

float loop_blocks_sums(int64_t iters) {
  configure(32);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < iters; ++i) {
    block_products(g_d[i & 3]);
    // The block stored 2 iterations before: its stores have long retired.
    epilogue(g_d[(i + 2) & 3], i, acc);
  }
  _tile_release();
  return checksum(acc);
}

float loop_sums(int64_t iters) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < iters; ++i) epilogue(g_d[i & 3], i, acc);
  return checksum(acc);
}

}  // namespace k3::amx_study
