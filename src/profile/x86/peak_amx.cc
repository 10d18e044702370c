// The AMX peaks for sysinfo and k3 profile: TDPBF16PS (the ceiling of the
// amx kernel table's bf16 GEMM, kernels/x86/avx512_amx.cc) and TDPBSSD (the
// int8 unit no kernel uses: docs/performance.md), on tiles that stay in
// the tile registers. Built with K3_AMX_FLAGS; callers check that
// kernels::detect_isa() is kAmx (CPUID and the OS's grant of the tiles).
#include <cstdint>

#include "kernels/x86/amx_tile_config.h"  // the intrinsics, via avx512_util.h
#include "profile/sysinfo.h"

namespace k3::profile::detail {

namespace {

// Tiles 0-3: 16 x 16 accumulators, zeroed; tiles 4-7: 16 rows of 64 bytes,
// all loaded from the same 1 KiB of `ab`. The loops below pair them as
// 0 = 4.6, 1 = 5.6, 2 = 4.7, 3 = 5.7: four independent chains cover the
// instruction's latency.
void start_tiles(const void* ab) {
  kernels::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  kernels::load_tile_config(cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
}

// Reads two accumulators back (so the loop is not dead) and releases the
// tiles; Acc is float for TDPBF16PS, int32_t for TDPBSSD.
template <typename Acc>
float finish_tiles() {
  alignas(64) Acc out[256];
  _tile_stored(0, out, 64);
  auto sum = static_cast<float>(out[0]);
  _tile_stored(3, out, 64);
  sum += static_cast<float>(out[255]);
  _tile_release();
  return sum;
}

}  // namespace

// Each TDPBF16PS is 16 x 16 x 32 multiply-adds (16384 flops).
float tdpbf16_loop_amx(int64_t iters, double* ops) {
  alignas(64) uint16_t ab[512];
  for (uint16_t& x : ab) x = 0x3f00;  // bf16 0.5
  start_tiles(ab);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  *ops = static_cast<double>(iters) * 4 * 16 * 16 * 32 * 2;
  return finish_tiles<float>();
}

// Each TDPBSSD is 16 x 16 x 64 multiply-adds (32768 ops). With inputs of 1
// an accumulator grows by 64 per iteration; if iters passes 2^25 it wraps,
// which the hardware does without fault and the sum only guards liveness.
float tdpbssd_loop_amx(int64_t iters, double* ops) {
  alignas(64) int8_t ab[1024];
  for (int8_t& x : ab) x = 1;
  start_tiles(ab);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 5, 6);
    _tile_dpbssd(2, 4, 7);
    _tile_dpbssd(3, 5, 7);
  }
  *ops = static_cast<double>(iters) * 4 * 16 * 16 * 64 * 2;
  return finish_tiles<int32_t>();
}

}  // namespace k3::profile::detail
