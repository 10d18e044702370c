// Overlap study: can one core stream weights from DRAM while its vector unit
// is busy, and what stops it (docs/performance.md, "The second row tile").
// Loops read 64-byte lines and do a fixed number of FMAs per line
// (overlap_study_loops.cc); each configuration prints GB/s, the median of 5
// runs. Part 1, one stream: the rate from DRAM against the same loop on a
// buffer in L2 (its compute rate) and the loop without FMAs (the memory
// rate). Part 2, four streams read side by side as the decode tiles read
// four far-apart W rows, at several spacings, each line used once (8 FMAs)
// or in two passes over 2 KiB chunks (4 FMAs each, the second from L1: two
// row tiles sharing a W tile). Run it pinned: taskset -c 0 overlap_study.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "overlap_study.h"

namespace {

using k3::bench::OverlapLoop;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kBuffer = 512 * kMiB;

float g_sink = 0.0f;

// GB/s of `bytes` read per call, the median of 5 calls (each `reps` loops).
double median_rate(const OverlapLoop& o, const char* b, int reps) {
  const k3::bench::OverlapFn fn = k3::bench::find_overlap_loop(o);
  if (fn == nullptr) {  // the tables below ask only for built loops
    std::fprintf(stderr, "overlap_study: no loop for %d streams and %d FMAs a line\n", o.streams, o.fmas);
    std::exit(1);
  }
  std::vector<double> rates;
  const double bytes = static_cast<double>(o.stream_bytes) * o.streams * reps;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) g_sink += fn(b, o.spacing, o.stream_bytes, o.chunk, o.passes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(bytes / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[2];
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "overlap_study: this CPU has no AVX-512\n");
    return 1;
  }
  char* b = static_cast<char*>(::operator new (static_cast<size_t>(kBuffer), std::align_val_t{4096}));
  std::memset(b, 0, static_cast<size_t>(kBuffer));

  std::printf("one stream, FMAs per 64-byte line: GB/s from L2 (256 KiB), from DRAM (512 MiB)\n");
  std::printf("%6s %10s %10s\n", "FMAs", "L2", "DRAM");
  for (int fmas : {0, 4, 8, 12, 16}) {
    const double l2 = median_rate({1, fmas, 0, 256 * 1024, 256 * 1024, 1}, b, 2000);
    const double dram = median_rate({1, fmas, 0, kBuffer, kBuffer, 1}, b, 1);
    std::printf("%6d %10.1f %10.1f\n", fmas, l2, dram);
  }

  std::printf("\nfour streams from DRAM, 120 MiB each: GB/s by the spacing of their starts\n");
  std::printf("%-22s %14s %18s\n", "spacing", "1 pass, 8 FMAs", "2 passes, 4 FMAs");
  const struct {
    const char* name;
    int64_t spacing;
  } spacings[] = {{"128 MiB", 128 * kMiB},
                  {"128 MiB - 4 KiB", 128 * kMiB - 4096},
                  {"128 MiB - 16 KiB", 128 * kMiB - 16384},
                  {"128 MiB - 1 MiB", 127 * kMiB},
                  {"125 MiB + 12 KiB", 125 * kMiB + 12288}};
  for (const auto& s : spacings) {
    const double one = median_rate({4, 8, s.spacing, 120 * kMiB, 2048, 1}, b, 1);
    const double two = median_rate({4, 4, s.spacing, 120 * kMiB, 2048, 2}, b, 1);
    std::printf("%-22s %14.1f %18.1f\n", s.name, one, two);
  }
  const double one_stream = median_rate({1, 4, 0, kBuffer, 2048, 2}, b, 1);
  std::printf("%-22s %14s %18.1f\n", "(one stream)", "", one_stream);
  std::printf("(checksum %g)\n", static_cast<double>(g_sink) * 0.0);
  ::operator delete (b, std::align_val_t{4096});
  return 0;
}
