// Accessors for the per-ISA kernel tables, shared by dispatch.cc and the x86
// translation units that define them. Only declarations live here, so this
// header compiles with baseline flags; call an accessor only after CPUID says
// the ISA is usable (dispatch.cc does).
#pragma once

#include "kernels/kernels.h"

namespace k3::kernels {

const KernelTable& avx2_table();    // defined in x86/avx2.cc   (AVX2 + FMA)
const KernelTable& avx512_table();  // defined in x86/avx512.cc (AVX-512 F/BW/DQ/VL)

}  // namespace k3::kernels
