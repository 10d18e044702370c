// Accessors for the per-ISA kernel tables, shared by dispatch.cc and the x86
// translation units that define them. Only declarations live here, so this
// header compiles with baseline flags; call an accessor only after CPUID says
// the ISA is usable (dispatch.cc does).
#pragma once

#include "kernels/kernels.h"

namespace k3::kernels {

const KernelTable& avx2_table();    // defined in x86/avx2.cc   (AVX2 + FMA)
const KernelTable& avx512_table();  // defined in x86/avx512.cc (AVX-512 F/BW/DQ/VL)

// The AVX2 table's rounding of one activation row to int16 per block of 32
// (x86/avx2.cc; kernels.h, gemm_nt_q8, has the semantics), also used by the
// AVX-512 int8 GEMM: qa[K] values, qs[K/32] scales.
void quantize_row_q16_avx2(const float* a, int64_t K, int16_t* qa, float* qs);

}  // namespace k3::kernels
