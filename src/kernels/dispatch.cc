// Run-time choice of kernel table: CPUID decides what the CPU can run, and
// the K3_ISA environment variable can cap it (to test or compare the slower
// paths on one machine).
#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/kernels.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

// Linux hands out the AMX tile registers (1 KiB each, 8 KiB of state) only
// to processes that ask: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
// (kernel 5.16+). Without it the first tile instruction kills the process.
bool os_grants_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

Isa detect_uncached() {
  __builtin_cpu_init();
  // libgcc's checks include OS support (XCR0) for the wider register state.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("fma");
  if (avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-tile") &&
      __builtin_cpu_supports("amx-bf16") && os_grants_amx())
    return Isa::kAmx;
  if (avx512) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}

// K3_ISA=scalar|avx2|avx512|amx -> cap; unset or unrecognised -> avx512.
// The amx table is opt-in: it made bf16 prefill 2.8x faster on the one AMX
// host measured (3.0x with --weight-layout tiles), but decodes 9-17% slower
// (5-10% with tiles), and an engine keeps one table for all its steps,
// because prefill and decode must give the same bits (docs/performance.md).
Isa isa_cap() {
  const char* env = std::getenv("K3_ISA");
  Isa cap = Isa::kAvx512;
  if (env == nullptr || *env == '\0') return cap;
  if (!parse_isa(env, &cap))
    std::fprintf(stderr, "k3: ignoring unknown K3_ISA=%s (want scalar|avx2|avx512|amx)\n", env);
  return cap;
}

// AMD family 19h: Zen 3 and Zen 4 (only Zen 4 has AVX-512, and was
// measured). Its streaming tiles ran faster with the next weights
// prefetched into L2 (docs/performance.md, "Prefetch into
// L1 or L2"); Zen 5 (family 1Ah) and the Intel cores measured ran faster
// into L1.
Prefetch prefetch_uncached() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return Prefetch::kL1;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  if (std::strcmp(vendor, "AuthenticAMD") != 0 || __get_cpuid(1, &a, &b, &c, &d) == 0) return Prefetch::kL1;
  unsigned family = (a >> 8) & 0xf;
  if (family == 0xf) family += (a >> 20) & 0xff;
  return family == 0x19 ? Prefetch::kL2 : Prefetch::kL1;
}

// K3_PREFETCH=l1|l2 -> that level; unset or unrecognised -> the CPU's.
Prefetch prefetch_choice() {
  static const Prefetch p = [] {
    const char* env = std::getenv("K3_PREFETCH");
    Prefetch chosen = prefetch_for_cpu();
    if (env == nullptr || *env == '\0') return chosen;
    if (!parse_prefetch(env, &chosen)) std::fprintf(stderr, "k3: ignoring unknown K3_PREFETCH=%s (want l1|l2)\n", env);
    return chosen;
  }();
  return p;
}

// The AVX-512 table with the AMX bf16 dot-product GEMM (x86/avx512_amx.cc);
// it rounds A with the avx512bf16 prepare, so its prepared rows are those.
KernelTable make_amx_table(Prefetch prefetch) {
  KernelTable t = avx512_table(__builtin_cpu_supports("avx512vnni"), true, prefetch);
  t.isa = Isa::kAmx;
  t.gemm_nt_bf16dot = gemm_nt_bf16dot_amx;
  t.bf16dot_prepared = {bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16, gemm_bf16dot_prepared_amx,
                        prepare_bf16dot_cols_avx512bf16, kBf16DotPrepareColGroup};
  t.bf16dot_tiles_prepared = {bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16, gemm_bf16dot_tiles_amx,
                              prepare_bf16dot_cols_avx512bf16, kBf16DotPrepareColGroup};
  return t;
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
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

bool parse_isa(std::string_view name, Isa* isa) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (name == isa_name(i)) {
      *isa = i;
      return true;
    }
  }
  return false;
}

std::string_view prefetch_name(Prefetch p) {
  return p == Prefetch::kL2 ? "l2" : "l1";
}

bool parse_prefetch(std::string_view name, Prefetch* p) {
  for (Prefetch i : {Prefetch::kL1, Prefetch::kL2}) {
    if (name == prefetch_name(i)) {
      *p = i;
      return true;
    }
  }
  return false;
}

Prefetch prefetch_for_cpu() {
  static const Prefetch p = prefetch_uncached();
  return p;
}

std::string_view table_prefetch(const KernelTable& t) {
  return t.isa == Isa::kAvx512 || t.isa == Isa::kAmx ? prefetch_name(t.prefetch) : std::string_view{};
}

std::string table_label(const KernelTable& t) {
  std::string s(isa_name(t.isa));
  if (const std::string_view p = table_prefetch(t); !p.empty()) s += " (prefetch " + std::string(p) + ")";
  return s;
}

Isa detect_isa() {
  static const Isa isa = detect_uncached();
  return isa;
}

const KernelTable* table_for(Isa isa, Prefetch prefetch) {
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
      return &avx512_table(vnni, bf16, prefetch);
    }
    case Isa::kAmx: {
      static const KernelTable amx[2] = {make_amx_table(Prefetch::kL1), make_amx_table(Prefetch::kL2)};
      return &amx[prefetch == Prefetch::kL2 ? 1 : 0];
    }
  }
  return nullptr;
}

const KernelTable* table_for(Isa isa) {
  return table_for(isa, prefetch_choice());
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
