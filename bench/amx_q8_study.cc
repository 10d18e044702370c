// int8 on the tile unit: what bounds an AMX-INT8 product over the kQ8
// format (util/quant.h: a scale per weight row and block of 32, and one per
// activation row and block). Every block's 16 x 16 dot products must leave
// the tile unit on their own (TILESTORED) and be scaled and added on the
// vector units, so a block of 32 costs, per 16 x 16 outputs, one tile
// product, one 1 KiB tile store and 16 rows of convert, scale and add.
// One thread, everything in L1; the loops (amx_q8_study_loops.cc):
//   products k64   4 TDPBSSD on resident tiles, 64 k each: the unit's rate
//   products k32   the same with a block's 32 k: half the work per product
//   blocks         per block: zero 4 tiles, load 2 A and 2 B tiles, 4
//                  TDPBSSD of k 32, store the 4 results
//   blocks+sums    ... and the scaled sums of an earlier block's 4 results
//   sums           those sums alone (64 rows of 16: convert, scale, fma)
// Prints GOP/s (2 per multiply-add), best of 9 runs; compare with `k3
// sysinfo`'s int8 dot peak per core (vpdpbusd). docs/performance.md ("int8
// on the tile unit") has the figures and what they mean.
#include <cstdint>
#include <cstdio>

#include "amx_q8_study.h"
#include "best_rate.h"
#include "kernels/kernels.h"

int main() {
  using k3::bench::best_gops;
  // kAmx: CPUID has the tiles and the OS granted them (kernels/dispatch.cc).
  if (k3::kernels::detect_isa() != k3::kernels::Isa::kAmx || !__builtin_cpu_supports("amx-int8")) {
    std::printf("amx_q8_study: this CPU (or OS) offers no AMX-INT8; nothing to measure\n");
    return 0;
  }
  namespace s = k3::amx_study;
  s::init();
  constexpr int64_t kIters = 200000;
  constexpr double kMacs = 4.0 * 16 * 16;  // per k, per iteration
  float sink = 0;
  std::printf("%-14s %8s\n", "loop", "GOP/s");
  std::printf("%-14s %8.0f\n", "products k64",
              best_gops(2 * kMacs * 64 * kIters, [&] { sink += s::loop_products(kIters, 64); }));
  std::printf("%-14s %8.0f\n", "products k32",
              best_gops(2 * kMacs * 32 * kIters, [&] { sink += s::loop_products(kIters, 32); }));
  std::printf("%-14s %8.0f\n", "blocks", best_gops(2 * kMacs * 32 * kIters, [&] { sink += s::loop_blocks(kIters); }));
  std::printf("%-14s %8.0f\n", "blocks+sums",
              best_gops(2 * kMacs * 32 * kIters, [&] { sink += s::loop_blocks_sums(kIters); }));
  std::printf("%-14s %8.0f\n", "sums", best_gops(2 * kMacs * 32 * kIters, [&] { sink += s::loop_sums(kIters); }));
  return sink == 12345.0f ? 1 : 0;  // never: keeps the results live
}
