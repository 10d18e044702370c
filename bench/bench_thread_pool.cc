// Thread pool microbenchmark (Google Benchmark): what a parallel region costs
// the decode loop, measured the way decode uses the pool.
//
// - bm_empty_region: a region whose chunks do nothing. Its time is the pool's
//   own cost per region (publish, claims, the caller's wait).
// - bm_gemv_region: one region per iteration doing what a decode Linear does,
//   a bf16 GEMV [1, K] x [N, K]^T split over N, each iteration on the next
//   matrix of a ring larger than the last-level cache, so every region
//   streams its weights from DRAM as decode does. Reported as bytes/s; the
//   same bytes in bigger regions show what the short ones lose.
//
// A k3-base decode step runs about 190 regions of 0.1-0.3 MB each
// (docs/performance.md), so per-region costs of a microsecond are a few
// percent of the step.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/thread_pool.h"

namespace {

void bm_empty_region(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  k3::ThreadPool pool(threads);
  int64_t sink = 0;
  for (auto _ : state) {
    pool.parallel_for(2048, 16, [&](int64_t b, int64_t) { benchmark::DoNotOptimize(sink += b); });
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bm_empty_region)->Arg(1)->Arg(2)->UseRealTime();

// Ring of bf16 matrices [N, K] totalling 1 GiB or twice the last-level cache,
// whichever is more, so that no matrix is still cached when its turn comes
// again (this project's hosts have had up to 480 MiB of L3).
void bm_gemv_region(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = state.range(1), k = 512;
  const int64_t matrix = n * k;
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 30, llc > 0 ? 2 * static_cast<int64_t>(llc) : 0);
  const int64_t ring = std::max<int64_t>(4, bytes / (matrix * 2));
  std::vector<uint16_t> w(static_cast<size_t>(matrix * ring), 0x3f80);  // 1.0
  std::vector<float> x(static_cast<size_t>(k), 0.5f), y(static_cast<size_t>(n));
  const k3::kernels::KernelTable& kt = k3::kernels::best_table();
  k3::ThreadPool pool(threads);
  int64_t next = 0;
  for (auto _ : state) {
    const uint16_t* wm = w.data() + next * matrix;
    pool.parallel_for(n, 16,
                      [&](int64_t b, int64_t e) { kt.gemm_nt_bf16(1, b, e, k, x.data(), k, wm, k, y.data(), n); });
    next = next + 1 == ring ? 0 : next + 1;
  }
  benchmark::DoNotOptimize(y.data());
  state.SetBytesProcessed(state.iterations() * matrix * 2);
}
// N 64 .. 8192 at K 512: 64 KiB .. 8 MiB of bf16 per region (k3-base's
// projections are 0.3-1.5 MiB in bf16).
BENCHMARK(bm_gemv_region)
    ->ArgsProduct({{1, 2}, {64, 256, 1024, 4096, 8192}})
    ->ArgNames({"threads", "N"})
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
