// Run-time choice of kernel table: CPUID decides what the CPU can run, and
// the K3_ISA environment variable can cap it (to test or compare the slower
// paths on one machine).
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "kernels/kernels.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

Isa detect_uncached() {
  __builtin_cpu_init();
  // libgcc's checks include OS support (XCR0) for the wider register state.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("fma");
  if (avx512) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}

// K3_ISA=scalar|avx2|avx512 -> cap; unset or unrecognised -> no cap.
Isa isa_cap() {
  const char* env = std::getenv("K3_ISA");
  if (env == nullptr || *env == '\0') return Isa::kAvx512;
  const std::string_view value(env);
  if (value == "scalar") return Isa::kScalar;
  if (value == "avx2") return Isa::kAvx2;
  if (value == "avx512") return Isa::kAvx512;
  std::fprintf(stderr, "k3: ignoring unknown K3_ISA=%s (want scalar|avx2|avx512)\n", env);
  return Isa::kAvx512;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa detect_isa() {
  static const Isa isa = detect_uncached();
  return isa;
}

const KernelTable* table_for(Isa isa) {
  // Isa values are ordered by capability, so "can run" is a comparison.
  if (static_cast<int>(isa) > static_cast<int>(detect_isa())) return nullptr;
  switch (isa) {
    case Isa::kScalar:
      return &scalar_table();
    case Isa::kAvx2:
      return &avx2_table();
    case Isa::kAvx512: {
      static const bool vnni = __builtin_cpu_supports("avx512vnni");
      static const bool bf16 = __builtin_cpu_supports("avx512bf16");
      return &avx512_table(vnni, bf16);
    }
  }
  return nullptr;
}

const KernelTable& best_table() {
  static const KernelTable& table = []() -> const KernelTable& {
    const Isa cap = isa_cap();
    const Isa hw = detect_isa();
    const Isa use = static_cast<int>(cap) < static_cast<int>(hw) ? cap : hw;
    return *table_for(use);
  }();
  return table;
}

}  // namespace k3::kernels
