// The AMX tile configuration (palette 1 of the Intel SDM's LDTILECFG) and
// loading it, for the code built with the AMX flags: kernels/x86/avx512_amx.cc,
// profile/x86/peak_amx.cc and bench/amx_q8_study_loops.cc. Intrinsics: include
// only from those translation units; an anonymous namespace, as in
// avx512_util.h.
#pragma once

#include <cstdint>

#include "kernels/x86/avx512_util.h"  // <immintrin.h>, with GCC 12's false warnings off

namespace k3::kernels {
namespace {

// 64 bytes: tile t has rows[t] rows of colsb[t] bytes (0: unused).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// LDTILECFG. GCC 12 does not treat it as reading its operand and drops the
// stores that filled cfg as dead; the barrier makes them happen first.
inline void load_tile_config(const TileConfig& cfg) {
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace
}  // namespace k3::kernels
