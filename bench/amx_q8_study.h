// The measured loops of amx_q8_study (bench/amx_q8_study.cc says what each
// does); defined in amx_q8_study_loops.cc, built with the AMX flags.
#pragma once

#include <cstdint>

namespace k3::amx_study {

void init();
// Each runs `iters` iterations and returns a value computed from the
// results, so that nothing is optimized away.
float loop_products(int64_t iters, int k);  // 4 TDPBSSD, 16 x 16 x k each, on resident tiles
float loop_blocks(int64_t iters);           // a block of 32: zero, load, 4 TDPBSSD, store the 4 results
float loop_blocks_sums(int64_t iters);      // ... and the scaled sums of an earlier block's results
float loop_sums(int64_t iters);             // the scaled sums alone

}  // namespace k3::amx_study
