// The AMX bf16 peak for sysinfo and k3 profile: TDPBF16PS on tiles that stay
// in the tile registers, the ceiling of the amx kernel table's bf16 GEMM
// (kernels/x86/avx512_amx.cc). Built with K3_AMX_FLAGS; callers check that
// kernels::detect_isa() is kAmx (CPUID and the OS's grant of the tiles).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/x86/amx_tile_config.h"
#include "profile/sysinfo.h"

namespace k3::profile::detail {

// Four 16 x 16 f32 accumulators, each TDPBF16PS 16 x 16 x 32 multiply-adds
// (16384 flops); four independent chains cover the instruction's latency.
float tdpbf16_loop_amx(int64_t iters, double* ops) {
  kernels::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  alignas(64) uint16_t ab[512];
  for (uint16_t& x : ab) x = 0x3f00;  // bf16 0.5
  kernels::load_tile_config(cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[256];
  _tile_stored(0, out, 64);
  float sum = out[0] + out[255];
  _tile_stored(3, out, 64);
  sum += out[0];
  _tile_release();
  *ops = static_cast<double>(iters) * 4 * 16 * 16 * 32 * 2;
  return sum;
}

}  // namespace k3::profile::detail
