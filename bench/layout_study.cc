// Layout study: the two weight layouts `k3 compile --weight-layout` offers,
// kernel against kernel. rows: row-major W, gemm_nt's 4x3 dot tile ending in
// a horizontal sum. panels: k-major panels of 16 rows (util/panel.h),
// gemm_nt_p16, one broadcast A element against 16 columns, each output a
// single FMA chain over k, no horizontal sums, 12 FMAs per 2 weight loads.
//
// Prints, per shape and M, the median GFLOP/s of both for f32 and bf16
// weights, measured in turn in one process (one thread, the best table this
// CPU runs), which keeps the ratios steady on a noisy host. "hot" reuses one W
// (in L2/L3); "stream" rotates through > 64 MiB of copies so W comes from
// DRAM, as in decode. Before timing it checks that both agree and that a
// panel row does not depend on M. docs/performance.md quotes its output.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ir/dtype.h"
#include "kernels/kernels.h"
#include "util/panel.h"

namespace {

using k3::kernels::Isa;
using k3::kernels::KernelTable;

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);  // inputs are bf16-exact: truncation is exact
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Weights {
  std::vector<float> rows;       // [copies][N][K]
  std::vector<uint16_t> rows16;  // same, bf16
  std::vector<float> panels;     // [copies][N / 16][K][16]
  std::vector<uint16_t> panels16;
};

// Random bf16-exact weights, so the f32 and bf16 runs compute the same products.
Weights make_weights(int64_t copies, int64_t N, int64_t K) {
  Weights w;
  const size_t n = static_cast<size_t>(copies * N * K);
  w.rows.resize(n);
  w.rows16.resize(n);
  w.panels.resize(n);
  w.panels16.resize(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = bf16_bits(dist(rng));
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(&w.rows[i], &u, 4);
    w.rows16[i] = h;
  }
  // N is a multiple of 16 here, so a packed copy has the rows' size.
  for (int64_t c = 0; c < copies; ++c) {
    const size_t off = static_cast<size_t>(c * N * K);
    k3::pack_panels(w.rows.data() + off, N, K, w.panels.data() + off);
    k3::pack_panels(w.rows16.data() + off, N, K, w.panels16.data() + off);
  }
  return w;
}

bool check(const KernelTable& t, int64_t N, int64_t K) {
  const int64_t M = 37;
  const Weights w = make_weights(1, N, K);
  std::vector<float> A(static_cast<size_t>(M * K));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : A) x = dist(rng);
  std::vector<float> dot(static_cast<size_t>(M * N)), pan(dot.size()), pan16(dot.size()), row(static_cast<size_t>(N));
  t.gemm_nt(M, 0, N, K, A.data(), K, w.rows.data(), K, dot.data(), N);
  t.gemm_nt_p16(M, 0, N, K, A.data(), K, w.panels.data(), pan.data(), N, {});
  t.gemm_nt_bf16p16(M, 0, N, K, A.data(), K, w.panels16.data(), pan16.data(), N, {});
  t.gemm_nt_p16(1, 0, N, K, A.data() + 30 * K, K, w.panels.data(), row.data(), N, {});
  double max_rel = 0;
  for (size_t i = 0; i < dot.size(); ++i)
    max_rel = std::max(max_rel, std::fabs(dot[i] - pan[i]) / (1.0 + std::fabs(dot[i])));
  const bool same16 = std::memcmp(pan.data(), pan16.data(), pan.size() * 4) == 0;
  const bool m_invariant = std::memcmp(row.data(), pan.data() + 30 * N, row.size() * 4) == 0;
  std::printf(
      "check N%ld K%ld: panels vs rows max rel diff %.2e, bf16 == f32 panels %s, "
      "row 30 alone == row 30 of M=37 %s\n",
      static_cast<long>(N), static_cast<long>(K), max_rel, same16 ? "yes" : "NO", m_invariant ? "yes" : "NO");
  return max_rel < 1e-4 && same16 && m_invariant;
}

void run(const KernelTable& t, int64_t N, int64_t K, bool stream) {
  const int64_t copies = stream ? (int64_t{64} << 20) / (N * K * 2) + 1 : 1;
  const Weights w = make_weights(copies, N, K);
  const int64_t max_m = 128;
  std::vector<float> A(static_cast<size_t>(max_m * K), 0.5f), C(static_cast<size_t>(max_m * N));
  std::printf("\n%s N%ld K%ld (GFLOP/s, median of 31, one thread, %s)\n", stream ? "stream" : "hot",
              static_cast<long>(N), static_cast<long>(K), k3::kernels::isa_name(t.isa).data());
  std::printf("%5s %10s %10s %7s %10s %10s %7s\n", "M", "rows f32", "panel f32", "ratio", "rows bf16", "panel bf16",
              "ratio");
  for (int64_t M : {1, 4, 8, 32, 128}) {
    std::vector<double> secs[4];
    int64_t call = 0;
    for (int rep = 0; rep < 31; ++rep) {
      for (int v = 0; v < 4; ++v) {
        const size_t off = static_cast<size_t>((call++ % copies) * N * K);
        const double t0 = seconds();
        switch (v) {
          case 0:
            t.gemm_nt(M, 0, N, K, A.data(), K, w.rows.data() + off, K, C.data(), N);
            break;
          case 1:
            t.gemm_nt_p16(M, 0, N, K, A.data(), K, w.panels.data() + off, C.data(), N, {});
            break;
          case 2:
            t.gemm_nt_bf16(M, 0, N, K, A.data(), K, w.rows16.data() + off, K, C.data(), N);
            break;
          default:
            t.gemm_nt_bf16p16(M, 0, N, K, A.data(), K, w.panels16.data() + off, C.data(), N, {});
            break;
        }
        secs[v].push_back(seconds() - t0);
      }
    }
    double gf[4];
    for (int v = 0; v < 4; ++v) {
      std::sort(secs[v].begin(), secs[v].end());
      gf[v] = 2.0 * static_cast<double>(M * N * K) / secs[v][secs[v].size() / 2] / 1e9;
    }
    std::printf("%5ld %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f\n", static_cast<long>(M), gf[0], gf[1], gf[1] / gf[0],
                gf[2], gf[3], gf[3] / gf[2]);
  }
}

}  // namespace

int main() {
  const KernelTable& t = k3::kernels::best_table();  // K3_ISA=scalar|avx2|avx512|amx caps it
  bool ok = true;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1536, 512}, {512, 1536}}) ok = check(t, n, k) && ok;
  if (!ok) {
    std::fprintf(stderr, "layout_study: the panel kernel disagrees with the row kernel\n");
    return 1;
  }
  for (bool stream : {false, true})
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1536, 512}, {512, 1536}}) run(t, n, k, stream);
  return 0;
}
