// Measured limits of this machine: memory bandwidth, compute peaks, caches.
//
// These are the denominators of every performance claim K3 makes (decode is
// bandwidth-bound, so "% of streaming read bandwidth" is the number that says
// how close a decode step is to the machine's limit). Measuring takes a few
// seconds, so results are cached per machine in a JSON file that `k3 bench`
// and `k3 profile` reuse via load_or_measure_sysinfo().
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace k3 {
class ThreadPool;
}

namespace k3::profile {

// Bumped whenever what is measured, or how, changes: older cache entries are
// then re-measured instead of being trusted.
inline constexpr int kSysInfoFormatVersion = 1;

struct BandwidthPoint {
  int threads = 0;
  int streams_per_thread = 0;  // interleaved sequential streams each thread reads
  double gb_per_s = 0;         // 1e9 bytes per second
};

struct SysInfo {
  std::string cpu;  // brand string plus CPUID family/model/stepping
  int hardware_threads = 0;
  std::string kernel_isa;  // what kernels::best_table() uses (K3_ISA may cap it)
  std::string cpu_isa;     // what the CPU supports, e.g. "avx512 +avx512bf16 +avx512vnni"
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // 0 = unknown

  std::vector<BandwidthPoint> read;                // every (threads, streams) measured
  std::vector<std::pair<int, double>> copy, triad;  // (threads, GB/s), bytes counted as STREAM does

  double fp32_gflops_per_core = 0;
  double fp32_gflops_total = 0;  // all measured threads at once
  std::optional<double> bf16_gflops_per_core;  // vdpbf16ps; nullopt: the CPU lacks it
  // TDPBF16PS (the amx kernel table's bf16 GEMM); nullopt: no AMX-BF16, or
  // the OS does not grant the tile registers.
  std::optional<double> amx_bf16_gflops_per_core;
  // TDPBSSD (AMX-INT8), which no kernel uses (docs/performance.md, "int8 on
  // the tile unit"): the machine's int8 peak. nullopt: no AMX-INT8.
  std::optional<double> amx_int8_gops_per_core;
  // The int8 product the int8 kernels run: vpdpbusd (AVX512-VNNI), else
  // AVX2's vpsignb + vpmaddubsw + vpmaddwd + vpaddd (int8_dot_instruction);
  // nullopt: neither (the scalar table).
  std::optional<double> int8_gops_per_core;
  // Two threads handing a cache line back and forth: ns per round trip
  // (measure_round_trip_ns); nullopt with one thread. 50-65 and 300-400 in
  // the two placements of the host in docs/performance.md (read as cores
  // sharing an L3 or not); the second slowed two-thread prefill by ~40%.
  std::optional<double> core_round_trip_ns;

  int64_t bytes_per_measurement = 0;  // bytes one read measurement streams
  int repetitions = 0;                // bandwidth numbers are the median of this many
  std::string measured_at;            // UTC, ISO 8601

  // Largest thread count with a read measurement (0 if none).
  int max_measured_threads() const;
  // Best read bandwidth over stream counts at `threads`, or at the nearest
  // measured thread count (the lower one on a tie); 0 if nothing was measured.
  double best_read_gb_per_s(int threads) const;

  nlohmann::json to_json() const;
  // Never throws: malformed or mistyped input is an error Status.
  static StatusOr<SysInfo> from_json(const nlohmann::json& j);
};

// What a measurement does; the defaults are what `k3 sysinfo` uses (a few
// seconds on a 2-core machine). Tests shrink the arrays and the peak runs.
struct MeasureOptions {
  int max_threads = 0;  // measure 1..max_threads threads; <= 0: hardware threads
  // Each of the three bandwidth arrays; a read measurement streams two of
  // them. 0: default_bytes_per_array(). Small sizes measure cache, not memory.
  int64_t bytes_per_array = 0;
  int repetitions = 5;        // timed passes per bandwidth number (median)
  double peak_seconds = 0.01;  // one timed compute-peak run
  int peak_runs = 10;          // compute peaks are the best of this many runs
};

// The arrays' default size: 128 MiB, or the last-level cache's size where
// that is more, so a read pass (two arrays) streams at least twice the LLC
// and measures memory, not cache. On a host with a 480 MiB L3, 2 threads
// read a 256 MiB pass at 44.3 GB/s and 1-2 GiB ones at 34.3-34.6 (`k3
// sysinfo --read-mib N`; docs/performance.md, "the read probe and the L3").
// Capped at 1/16 of physical memory per array (but not below 128 MiB).
int64_t default_bytes_per_array();

StatusOr<SysInfo> measure_sysinfo(const MeasureOptions& options);
StatusOr<SysInfo> measure_sysinfo(int max_threads);
StatusOr<SysInfo> measure_sysinfo(int max_threads, int64_t bytes_per_array);

// The instruction SysInfo::int8_gops_per_core times on this CPU, as text
// ("vpdpbusd", "vpmaddubsw + vpmaddwd"); nullptr: none.
const char* int8_dot_instruction();

// The cache file: $K3_CACHE_DIR/sysinfo.json, else $XDG_CACHE_HOME/k3/...,
// else ~/.cache/k3/...; empty if none of those variables is set.
std::string sysinfo_cache_path();

// Returns this machine's cached entry if there is one (same format version,
// CPU and hardware thread count) that covers the request (at least
// max_threads threads, arrays at least as large); otherwise, or with
// `refresh`, measures and stores the result. The file keeps one entry per
// machine, so a home directory shared between hosts works. A corrupt or
// unwritable cache never fails the call: it is re-measured and rewritten
// where possible. kernel_isa is always the current process's (K3_ISA can
// change it between runs).
StatusOr<SysInfo> load_or_measure_sysinfo(int max_threads, bool refresh);
StatusOr<SysInfo> load_or_measure_sysinfo(const MeasureOptions& options, bool refresh);

// A quick re-measurement of the best read bandwidth, for tools that time
// their own work on a machine whose bandwidth drifts (a shared VM here
// measured 24 GB/s and 16 GB/s an hour apart): `k3 bench` probes between its
// timed runs so "% of read bandwidth" compares two numbers taken minutes, not
// hours, apart. It holds sysinfo's three arrays (3 x bytes_per_array, of
// which a read streams two) and a thread pool of its own for its lifetime.
class ReadProbe {
 public:
  // bytes_per_array 0: default_bytes_per_array().
  static StatusOr<std::unique_ptr<ReadProbe>> create(int threads, int64_t bytes_per_array = 0);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;

  // Best over 1, 2, 4 and 8 interleaved streams per thread of the median of
  // `reps` passes each (after one warm-up pass), in GB/s: what sysinfo's
  // best_read_gb_per_s(threads) measures, at this moment.
  double measure(int reps = 3);
  int threads() const;
  // measure_round_trip_ns on the probe's threads (0: one thread): which
  // placement the threads met at this moment (sysinfo.h, core_round_trip_ns).
  double round_trip_ns();

 private:
  struct Impl;
  explicit ReadProbe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Compute peaks measured now, every thread of the probe's pool running the
// register-resident loop at once (as a prefill step uses them), in G(FL)OP/s
// summed over the threads; 0 where this CPU lacks the units. Cores shared
// with other tenants run slower for minutes at a time, so k3 profile --phase
// prefill judges its step against peaks taken right after it rather than
// sysinfo's cached ones. Like ReadProbe it owns its threads: create it
// before anything pins the calling thread.
struct PeaksNow {
  double fp32_gflops = 0;
  double bf16_gflops = 0;  // vdpbf16ps
  double amx_bf16_gflops = 0;  // TDPBF16PS (0: no AMX)
  double int8_gops = 0;    // vpdpbusd
  double round_trip_ns = 0;  // measure_round_trip_ns on the probe's threads (0: one thread)
};

// Median ns for threads 0 and 1 of `pool` to hand one cache line to each
// other and back, over `trips` round trips in 5 batches; 0 if the pool has
// one thread.
double measure_round_trip_ns(ThreadPool& pool, int trips = 20000);

class PeakProbe {
 public:
  static StatusOr<std::unique_ptr<PeakProbe>> create(int threads);
  ~PeakProbe();
  PeakProbe(const PeakProbe&) = delete;
  PeakProbe& operator=(const PeakProbe&) = delete;

  // Best of `runs` runs of about `seconds` each, per precision (sysinfo's
  // method). seconds in (0, 10], runs >= 1.
  StatusOr<PeaksNow> measure(double seconds = 0.01, int runs = 10);
  int threads() const;
  // measure_round_trip_ns on the probe's threads.
  double round_trip_ns();

 private:
  struct Impl;
  explicit PeakProbe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// Per-ISA loops (src/profile/x86/peak_*.cc, built with their own flags; the
// callers check CPUID first). Each returns a value derived from everything it
// computed so the compiler cannot drop the work.

// Sums n_bytes starting at each of `streams` pointers, interleaved (one
// vector from each stream in turn). n_bytes is a multiple of 512; pointers
// are 64-byte aligned; streams is 1, 2, 4 or 8.
uint64_t read_streams_avx2(const void* const* ptrs, int streams, int64_t n_bytes);
uint64_t read_streams_avx512(const void* const* ptrs, int streams, int64_t n_bytes);
// dst[i] = src[i]; and a[i] = b[i] + s * c[i]. n is a multiple of 64.
void copy_avx2(const float* src, float* dst, int64_t n);
void copy_avx512(const float* src, float* dst, int64_t n);
void triad_avx2(float* a, const float* b, const float* c, float s, int64_t n);
void triad_avx512(float* a, const float* b, const float* c, float s, int64_t n);
// Register-resident loops of `iters` iterations; *ops receives the floating
// point (or integer) operations performed, counting a multiply-add as two.
float fma_loop_avx2(int64_t iters, double* ops);
float fma_loop_avx512(int64_t iters, double* ops);
float dpbf16_loop_avx512(int64_t iters, double* ops);  // needs AVX512-BF16
int32_t dpbusd_loop_avx512(int64_t iters, double* ops);  // needs AVX512-VNNI
int32_t maddubs_loop_avx2(int64_t iters, double* ops);   // needs AVX2
float tdpbf16_loop_amx(int64_t iters, double* ops);      // needs kernels::Isa::kAmx
float tdpbssd_loop_amx(int64_t iters, double* ops);      // needs kAmx and amx-int8
}  // namespace detail

}  // namespace k3::profile
