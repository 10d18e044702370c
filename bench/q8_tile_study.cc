// int8 tile study: what bounds the VNNI int8 prefill tile (x86/avx512_vnni.cc)
// on this core. Inline-assembly loops, one thread, data in L1, each the one
// before plus one piece of the kernel's work (docs/performance.md, "What
// bounds the int8 tile"):
//   register   16 independent vpdpbusd, no memory: the instruction's rate
//   tile       a 4 x 4 tile of the kernel's shape: per 64-byte k step 4 W
//              loads (xor 0x80), 4 A loads, 16 vpdpbusd; accumulators run on
//   +restart   accumulators reloaded every 8 steps (a 16-block group)
//   +convert   ... and converted to f32 and stored (vcvtdq2ps)
//   +fma       ... and folded with a scale into f32 sums (the kernel's tail)
//   magic      +fma with the convert done as an FP subtract of 1.5 * 2^23
//              from integers offset by it
// and, for comparison, the kernel itself (the table's q8_prepared.gemm) on
// 4 rows x 4 W rows of K 512, all in L1. Prints GOP/s (2 per multiply-add),
// best of 9 runs.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "best_rate.h"
#include "kernels/kernels.h"
#include "util/quant.h"

namespace {

alignas(4096) uint8_t g_buf[1 << 20];

// W rows 544 bytes apart (an int8 row of K 512 with its scales), A rows 640
// (a prepared VNNI row), accumulators' reload area at 196608, f32 sums at
// 262144, constants at 327680: the 0x80 bytes, a scale, 1.5 * 2^23.
#define K3_W                                                                      \
  "vpxord 0(%[p],%%rax),%%zmm31,%%zmm0\n vpxord 544(%[p],%%rax),%%zmm31,%%zmm1\n" \
  "vpxord 1088(%[p],%%rax),%%zmm31,%%zmm2\n vpxord 1632(%[p],%%rax),%%zmm31,%%zmm3\n"
#define K3_ROW(off, a, b, c, d)                                                                                  \
  "vmovdqu64 " #off "(%[p],%%rax),%%zmm4\n vpdpbusd %%zmm4,%%zmm0,%%zmm" #a "\n vpdpbusd %%zmm4,%%zmm1,%%zmm" #b \
  "\n vpdpbusd %%zmm4,%%zmm2,%%zmm" #c "\n vpdpbusd %%zmm4,%%zmm3,%%zmm" #d "\n"
#define K3_STEP                                                                                \
  K3_W K3_ROW(65536, 8, 9, 10, 11) K3_ROW(66176, 12, 13, 14, 15) K3_ROW(66816, 16, 17, 18, 19) \
      K3_ROW(67456, 20, 21, 22, 23)
#define K3_ACCS(op) \
  op(8) op(9) op(10) op(11) op(12) op(13) op(14) op(15) op(16) op(17) op(18) op(19) op(20) op(21) op(22) op(23)
#define K3_RELOAD(r) "vmovdqa64 196608+64*(" #r "-8)(%[p]),%%zmm" #r "\n"
#define K3_CVT(r) "vcvtdq2ps %%zmm" #r ",%%zmm" #r "\n vmovaps %%zmm" #r ",262144+64*(" #r "-8)(%[p])\n"
#define K3_CVT_FMA(r)                                                                                                 \
  "vcvtdq2ps %%zmm" #r ",%%zmm" #r "\n vfmadd213ps 262144+64*(" #r "-8)(%[p]),%%zmm30,%%zmm" #r "\n vmovaps %%zmm" #r \
  ",262144+64*(" #r "-8)(%[p])\n"
#define K3_SUB_FMA(r)                                                                                \
  "vsubps %%zmm29,%%zmm" #r ",%%zmm" #r "\n vfmadd213ps 262144+64*(" #r "-8)(%[p]),%%zmm30,%%zmm" #r \
  "\n vmovaps "                                                                                      \
  "%%zmm" #r ",262144+64*(" #r "-8)(%[p])\n"
#define K3_CLOBBERS                                                                                               \
  "rax", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",    \
      "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm29", "xmm30", \
      "xmm31"
// One group (8 k steps of 64 bytes) per outer iteration; `before` and
// `after` run around it.
#define K3_LOOP(before, after)                                                                         \
  asm volatile(                                                                                        \
      "vpbroadcastd 327680(%[p]),%%zmm31\n vbroadcastss 327684(%[p]),%%zmm30\n"                        \
      "vbroadcastss 327688(%[p]),%%zmm29\n"                                                            \
      "1:\n" before "xor %%rax,%%rax\n 2:\n" K3_STEP "add $64,%%rax\n cmp $512,%%rax\n jne 2b\n" after \
      "dec %[n]\n jnz 1b\n"                                                                            \
      : [n] "+r"(n)                                                                                    \
      : [p] "r"(g_buf)                                                                                 \
      : K3_CLOBBERS)

#define K3_DP_REG(r) "vpdpbusd %%zmm0,%%zmm1,%%zmm" #r "\n"
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void register_only(int64_t n) {
  asm volatile("1:\n" K3_ACCS(K3_DP_REG) "dec %[n]\n jnz 1b\n" : [n] "+r"(n) : : K3_CLOBBERS);
}
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void tile(int64_t n) {
  K3_LOOP("", "");
}
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void tile_restart(int64_t n) {
  K3_LOOP(K3_ACCS(K3_RELOAD), "");
}
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void tile_convert(int64_t n) {
  K3_LOOP(K3_ACCS(K3_RELOAD), K3_ACCS(K3_CVT));
}
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void tile_fma(int64_t n) {
  K3_LOOP(K3_ACCS(K3_RELOAD), K3_ACCS(K3_CVT_FMA));
}
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void tile_magic(int64_t n) {
  K3_LOOP(K3_ACCS(K3_RELOAD), K3_ACCS(K3_SUB_FMA));
}

}  // namespace

int main() {
  using k3::bench::best_gops;
  if (!__builtin_cpu_supports("avx512vnni")) {
    std::printf("q8_tile_study: this CPU has no AVX-512 VNNI; nothing to measure\n");
    return 0;
  }
  const uint32_t bias = 0x80808080u;
  const float scale = 1e-3f, magic = 12582912.0f;
  std::memcpy(g_buf + 327680, &bias, 4);
  std::memcpy(g_buf + 327684, &scale, 4);
  std::memcpy(g_buf + 327688, &magic, 4);
  constexpr int64_t kGroups = 400000;
  constexpr double kTileOps = 16.0 * 8 * 128 * kGroups;  // 16 vpdpbusd x 8 steps x 128 ops per group
  std::printf("%-10s %8s\n", "loop", "GOP/s");
  std::printf("%-10s %8.0f\n", "register", best_gops(16.0 * 128 * 4000000, [] { register_only(4000000); }));
  std::printf("%-10s %8.0f\n", "tile", best_gops(kTileOps, [] { tile(kGroups); }));
  std::printf("%-10s %8.0f\n", "+restart", best_gops(kTileOps, [] { tile_restart(kGroups); }));
  std::printf("%-10s %8.0f\n", "+convert", best_gops(kTileOps, [] { tile_convert(kGroups); }));
  std::printf("%-10s %8.0f\n", "+fma", best_gops(kTileOps, [] { tile_fma(kGroups); }));
  std::printf("%-10s %8.0f\n", "magic", best_gops(kTileOps, [] { tile_magic(kGroups); }));
  // The kernel: 4 prepared rows x 4 W rows, K 512, repeatedly (all in L1).
  const k3::kernels::KernelTable& t = k3::kernels::best_table();
  constexpr int64_t K = 512, kCalls = 200000;
  std::vector<float> a(4 * K), w(4 * K), c(16);
  for (size_t i = 0; i < a.size(); ++i) a[i] = w[i] = static_cast<float>(i % 13) * 0.1f - 0.6f;
  std::vector<uint8_t> wq(4 * static_cast<size_t>(k3::ir::q8_row_bytes(K)));
  for (int64_t r = 0; r < 4; ++r)
    k3::quantize_q8_row(w.data() + r * K, K, wq.data() + r * static_cast<int64_t>(k3::ir::q8_row_bytes(K)));
  t.q8_prepared.prepare(4, K, a.data(), K, g_buf);
  std::printf("%-10s %8.0f\n", "kernel", best_gops(2.0 * 16 * K * kCalls, [&] {
                for (int64_t i = 0; i < kCalls; ++i) t.q8_prepared.gemm(4, 0, 4, K, g_buf, wq.data(), 0, c.data(), 4);
              }));
  return 0;
}
