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
// - bm_q8_schedule: the same streams of int8 weights in a step's schedules
//   (regions of 1, 8 or 32 matrices; rows in two chunks a thread, one, or
//   whole matrices a thread), each run with the round trip between the
//   threads, which says where the host had placed them.
//
// A k3-base decode step runs about 190 regions of 0.1-0.3 MB each
// (docs/performance.md), so per-region costs of a microsecond are a few
// percent of the step.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ir/dtype.h"
#include "kernels/kernels.h"
#include "profile/sysinfo.h"
#include "runtime/thread_pool.h"
#include "util/aligned_buffer.h"

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

// What a step's structure costs the memory streams: the int8 decode tile at
// M 2 (an expert's rows at batch-8 decode) over a ring of [1024, 512] int8
// matrices (557 KB, an expert's up projection in k3-base), 32 matrices per
// iteration, grouped `per_region` matrices to a parallel region (a barrier
// after each group). `split` says how the threads share a region:
// - 0: the rows of each matrix in parallel_for's chunks, two a thread, as
//   the decode Linears (per_region 1) and the MoE's expert regions (8) do;
// - 1: the rows in one chunk a thread (parallel_for_even);
// - 2: whole matrices, each thread its own (per_region 32 only).
// Against the best of them, what barriers, chunk claims and two cores
// reading halves of the same matrices cost. Where the two vCPUs sit on
// different L3s, regions of one matrix streamed 5-15% slower than regions
// of 32; where they share one, every schedule measured the same
// (docs/performance.md, "What the far placement costs a step").
// rt_before_ns / rt_after_ns: the round trip between the threads around the
// timed loop (sysinfo.h), which says where they sat.
void bm_q8_schedule(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t per_region = state.range(1);
  const int64_t split = state.range(2);
  constexpr int64_t n = 1024, k = 512, m = 2, per_iter = 32;
  const auto row_bytes = static_cast<int64_t>(k3::ir::q8_row_bytes(k));
  const int64_t matrix = n * row_bytes;
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 30, llc > 0 ? 2 * static_cast<int64_t>(llc) : 0);
  const int64_t ring = std::max<int64_t>(2 * per_iter, bytes / matrix) / per_iter * per_iter;
  // In 2 MiB pages, as a .k3m's weights are (util/mapped_file.h); the values
  // are 1 and every f16 scale 0.
  k3::AlignedBuffer w, prep;
  if (!w.allocate(static_cast<uint64_t>(matrix * ring))) {
    state.SkipWithError("out of memory");
    return;
  }
  for (int64_t r = 0; r < n * ring; ++r) std::memset(w.data() + r * row_bytes, 1, static_cast<size_t>(k));
  const k3::kernels::PreparedGemm& pg = k3::kernels::best_table().q8_prepared;
  if (!prep.allocate(static_cast<uint64_t>(m * pg.row_bytes(k)))) {
    state.SkipWithError("out of memory");
    return;
  }
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(threads * m * n));
  pg.prepare(m, k, x.data(), k, prep.data());
  k3::ThreadPool pool(threads);
  const double rt_before = k3::profile::measure_round_trip_ns(pool);
  int64_t next = 0;  // the iteration's first matrix in the ring
  // Rows [b, e) of the iteration's matrix j into out ([m, n]).
  auto rows = [&](int64_t j, int64_t b, int64_t e, float* out) {
    pg.gemm(m, b, e, k, prep.data(), w.data() + (next + j) * matrix, 0, out, n);
  };
  for (auto _ : state) {
    for (int64_t g = 0; g < per_iter; g += per_region) {
      if (split == 2) {
        pool.parallel_for_even(per_region, 1, [&](int64_t b, int64_t e) {
          float* out = y.data() + b * threads / per_region * m * n;  // each thread its own rows of y
          for (int64_t j = g + b; j < g + e; ++j) rows(j, 0, n, out);
        });
        continue;
      }
      auto chunk = [&](int64_t b, int64_t e) {
        for (int64_t j = g; j < g + per_region; ++j) rows(j, b, e, y.data());
      };
      if (split == 1)
        pool.parallel_for_even(n, 16, chunk);
      else
        pool.parallel_for(n, 16, chunk);
    }
    next = next + per_iter == ring ? 0 : next + per_iter;
  }
  benchmark::DoNotOptimize(y.data());
  state.SetBytesProcessed(state.iterations() * per_iter * matrix);
  if (threads > 1) {
    state.counters["rt_before_ns"] = rt_before;
    state.counters["rt_after_ns"] = k3::profile::measure_round_trip_ns(pool);
  }
}
BENCHMARK(bm_q8_schedule)
    ->ArgsProduct({{1, 2}, {1, 8, 32}, {0, 1}})
    ->Args({1, 32, 2})
    ->Args({2, 32, 2})
    ->ArgNames({"threads", "per_region", "split"})
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
