// Tests for profile/sysinfo: measurements are sane (never timed against a
// threshold), JSON round-trips and rejects malformed input, and the per-machine
// cache is reused, ignored when it belongs to another machine, and rewritten
// when corrupt.
#include "profile/sysinfo.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace k3::profile {
namespace {

// Small arrays (cache-resident) and short peak runs: a whole measurement
// takes a fraction of a second, and every code path still runs.
MeasureOptions small_options(int threads = 2) {
  MeasureOptions o;
  o.max_threads = threads;
  o.bytes_per_array = int64_t{4} << 20;
  o.repetitions = 3;
  o.peak_seconds = 0.002;
  o.peak_runs = 2;
  return o;
}

bool positive_finite(double v) {
  return std::isfinite(v) && v > 0;
}

TEST(SysInfo, MeasuresPositiveFiniteNumbers) {
  auto s = measure_sysinfo(small_options());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->cpu.empty());
  EXPECT_GE(s->hardware_threads, 1);
  EXPECT_EQ(s->kernel_isa, std::string(kernels::isa_name(kernels::best_table().isa)));
  EXPECT_EQ(s->cpu_isa.rfind(std::string(kernels::isa_name(kernels::detect_isa())), 0), 0u) << s->cpu_isa;
  EXPECT_GE(s->l1d_bytes, 0);
  EXPECT_GE(s->l2_bytes, 0);
  EXPECT_GE(s->l3_bytes, 0);

  // Every (threads, streams) pair for 1..2 threads and 1, 2, 4, 8 streams.
  ASSERT_EQ(s->read.size(), 8u);
  for (const auto& p : s->read) {
    EXPECT_TRUE(p.threads == 1 || p.threads == 2);
    EXPECT_TRUE(p.streams_per_thread == 1 || p.streams_per_thread == 2 || p.streams_per_thread == 4 ||
                p.streams_per_thread == 8);
    EXPECT_TRUE(positive_finite(p.gb_per_s)) << p.threads << "x" << p.streams_per_thread << ": " << p.gb_per_s;
  }
  ASSERT_EQ(s->copy.size(), 2u);
  ASSERT_EQ(s->triad.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(s->copy[i].first, i + 1);
    EXPECT_EQ(s->triad[i].first, i + 1);
    EXPECT_TRUE(positive_finite(s->copy[i].second));
    EXPECT_TRUE(positive_finite(s->triad[i].second));
  }
  EXPECT_EQ(s->max_measured_threads(), 2);
  EXPECT_EQ(s->bytes_per_measurement, int64_t{8} << 20);
  EXPECT_EQ(s->repetitions, 3);
  EXPECT_FALSE(s->measured_at.empty());

  EXPECT_TRUE(positive_finite(s->fp32_gflops_per_core));
  EXPECT_TRUE(positive_finite(s->fp32_gflops_total));

  // Present exactly when the CPU has the instruction; never invented.
  __builtin_cpu_init();
  EXPECT_EQ(s->bf16_gflops_per_core.has_value(), static_cast<bool>(__builtin_cpu_supports("avx512bf16")));
  // The int8 product peak wherever an int8 kernel runs on SIMD: vpdpbusd
  // with AVX512-VNNI, AVX2's vpmaddubsw sequence otherwise.
  EXPECT_EQ(s->int8_gops_per_core.has_value(), kernels::detect_isa() >= kernels::Isa::kAvx2);
  EXPECT_EQ(profile::int8_dot_instruction() != nullptr, s->int8_gops_per_core.has_value());
  // Measured with 2 threads (small_options), positive and finite.
  ASSERT_TRUE(s->core_round_trip_ns.has_value());
  EXPECT_TRUE(positive_finite(*s->core_round_trip_ns));
  if (s->bf16_gflops_per_core) {
    EXPECT_TRUE(positive_finite(*s->bf16_gflops_per_core));
  }
  if (s->int8_gops_per_core) {
    EXPECT_TRUE(positive_finite(*s->int8_gops_per_core));
  }
  // The AMX peak exactly where the amx kernel table exists.
  EXPECT_EQ(s->amx_bf16_gflops_per_core.has_value(), kernels::table_for(kernels::Isa::kAmx) != nullptr);
  if (s->amx_bf16_gflops_per_core) {
    EXPECT_TRUE(positive_finite(*s->amx_bf16_gflops_per_core));
  }
  // The int8 tile peak only with the tiles (and AMX-INT8 among them).
  if (!s->amx_bf16_gflops_per_core) {
    EXPECT_FALSE(s->amx_int8_gops_per_core.has_value());
  }
  if (s->amx_int8_gops_per_core) {
    EXPECT_TRUE(positive_finite(*s->amx_int8_gops_per_core));
  }
}

TEST(SysInfo, MeasuresEveryThreadCount) {
  // A result per thread count, positive and finite. How they compare is a
  // property of the machine and its load at the moment, so it is reported
  // by `k3 sysinfo`, not asserted here (no timing in unit tests).
  auto s = measure_sysinfo(small_options());
  ASSERT_TRUE(s.ok()) << s.status().message();
  for (int t = 1; t <= 2; ++t) {
    const double gb = s->best_read_gb_per_s(t);
    EXPECT_GT(gb, 0) << t << " threads";
    EXPECT_TRUE(std::isfinite(gb)) << t << " threads";
  }
}

// The per-ISA loops do the work they are timed for: every byte read, every
// element copied or computed, the op counts as documented.
TEST(SysInfoLoops, ComputeWhatTheyClaim) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = kernels::detect_isa() >= kernels::Isa::kAvx512;
  if (!avx2) {
    GTEST_SKIP() << "no AVX2 on this CPU";
  }

  constexpr int64_t kBytes = 4096;  // per stream, a multiple of 512
  std::vector<uint64_t> words(8 * kBytes / 8 + 8);
  uint64_t* base = words.data();
  while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
  for (int64_t i = 0; i < 8 * kBytes / 8; ++i) base[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  for (int streams : {1, 2, 4, 8}) {
    const void* ptrs[8];
    uint64_t expected = 0;
    for (int s = 0; s < streams; ++s) {
      const uint64_t* p = base + s * (kBytes / 8);
      ptrs[s] = p;
      for (int64_t i = 0; i < kBytes / 8; ++i) expected += p[i];
    }
    EXPECT_EQ(detail::read_streams_avx2(ptrs, streams, kBytes), expected) << streams << " streams";
    if (avx512) {
      EXPECT_EQ(detail::read_streams_avx512(ptrs, streams, kBytes), expected) << streams << " streams";
    }
  }

  constexpr int64_t kN = 256;  // a multiple of 64
  std::vector<float> storage(3 * kN + 16);
  float* a = storage.data();
  while (reinterpret_cast<uintptr_t>(a) % 64 != 0) ++a;
  float* b = a + kN;
  float* c = b + kN;
  using CopyFn = void (*)(const float*, float*, int64_t);
  using TriadFn = void (*)(float*, const float*, const float*, float, int64_t);
  std::vector<std::pair<CopyFn, TriadFn>> impls = {{detail::copy_avx2, detail::triad_avx2}};
  if (avx512) impls.emplace_back(detail::copy_avx512, detail::triad_avx512);
  for (const auto& [copy, triad] : impls) {
    for (int64_t i = 0; i < kN; ++i) {
      a[i] = static_cast<float>(i);
      b[i] = 0;
      c[i] = static_cast<float>(2 * i);
    }
    copy(a, b, kN);
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(b[i], static_cast<float>(i));
    triad(a, b, c, 0.5f, kN);
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(a[i], static_cast<float>(2 * i));
  }

  double ops = 0;
  EXPECT_TRUE(std::isfinite(detail::fma_loop_avx2(100, &ops)));
  EXPECT_EQ(ops, 100.0 * 12 * 8 * 2);
  {
    // 4 accumulators starting at k in each of their 8 lanes; accumulator k
    // adds 4 products of activation {3, -5}[k / 2] and weight {-2, 4}[k % 2]
    // per step in each lane.
    const int32_t r = detail::maddubs_loop_avx2(100, &ops);
    EXPECT_EQ(ops, 100.0 * 4 * 64);
    int32_t per_step = 0;
    for (int k = 0; k < 4; ++k) per_step += 4 * std::array{3, -5}[k / 2] * std::array{-2, 4}[k % 2];
    EXPECT_EQ(r, 8 * (0 + 3) * 4 / 2 + 8 * 100 * per_step);
  }
  if (avx512) {
    EXPECT_TRUE(std::isfinite(detail::fma_loop_avx512(100, &ops)));
    EXPECT_EQ(ops, 100.0 * 16 * 16 * 2);
  }
  if (avx512 && __builtin_cpu_supports("avx512bf16")) {
    EXPECT_TRUE(std::isfinite(detail::dpbf16_loop_avx512(100, &ops)));
    EXPECT_EQ(ops, 100.0 * 16 * 64);
  }
  if (avx512 && __builtin_cpu_supports("avx512vnni")) {
    // 16 accumulators starting at k, each lane adding 4 * (3 * -2) per step.
    const int32_t r = detail::dpbusd_loop_avx512(100, &ops);
    EXPECT_EQ(ops, 100.0 * 16 * 128);
    EXPECT_EQ(r, 16 * (0 + 15) * 16 / 2 + 16 * 16 * 100 * 4 * (3 * -2));
  }
}

TEST(SysInfo, RejectsBadOptions) {
  MeasureOptions o = small_options();
  o.bytes_per_array = 1024;
  EXPECT_FALSE(measure_sysinfo(o).ok());
  o = small_options();
  o.repetitions = 0;
  EXPECT_FALSE(measure_sysinfo(o).ok());
  o = small_options();
  o.peak_runs = 0;
  EXPECT_FALSE(measure_sysinfo(o).ok());
  o = small_options();
  o.peak_seconds = 0;
  EXPECT_FALSE(measure_sysinfo(o).ok());
}

// A read pass (two arrays) must stream at least twice the last-level cache,
// or it measures the cache: a 256 MiB pass read 44 GB/s on a host with a
// 480 MiB L3 whose memory gave 34 (docs/performance.md).
TEST(SysInfo, DefaultPassStreamsTwiceTheLastLevelCache) {
  auto info = measure_sysinfo(small_options(1));
  ASSERT_TRUE(info.ok()) << info.status().message();
  const int64_t def = default_bytes_per_array();
  EXPECT_GE(def, int64_t{128} << 20);
  const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  EXPECT_GE(def, std::min(info->l3_bytes, memory / 16 / 4096 * 4096));  // the L3, unless RAM is short
  EXPECT_LE(def, std::max(int64_t{128} << 20, memory / 16));
  EXPECT_EQ(def % 4096, 0);
  EXPECT_EQ(info->bytes_per_measurement, 2 * small_options(1).bytes_per_array);  // an explicit size is kept
}

TEST(ReadProbe, MeasuresAPositiveRateAndRejectsBadOptions) {
  auto probe = ReadProbe::create(2, int64_t{1} << 20);
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ((*probe)->threads(), 2);
  for (int i = 0; i < 2; ++i) {
    const double gb = (*probe)->measure(1);
    EXPECT_TRUE(std::isfinite(gb) && gb > 0) << gb;
  }
  // Two threads hand a line back and forth; one has no one to hand it to.
  const double ns = (*probe)->round_trip_ns();
  EXPECT_TRUE(std::isfinite(ns) && ns > 0 && ns < 1e6) << ns;
  auto one = ReadProbe::create(1, int64_t{1} << 20);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ((*one)->round_trip_ns(), 0.0);
  EXPECT_FALSE(ReadProbe::create(0).ok());
  EXPECT_FALSE(ReadProbe::create(1, 1024).ok());
}

TEST(PeakProbe, MeasuresThePeaksThisCpuHasAndRejectsBadOptions) {
  auto probe = PeakProbe::create(2);
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ((*probe)->threads(), 2);
  auto now = (*probe)->measure(0.002, 2);
  ASSERT_TRUE(now.ok()) << now.status().message();
  EXPECT_TRUE(std::isfinite(now->fp32_gflops) && now->fp32_gflops > 0) << now->fp32_gflops;
  // The dot-product peaks exist exactly where sysinfo finds the units.
  auto si = measure_sysinfo(small_options());
  ASSERT_TRUE(si.ok()) << si.status().message();
  EXPECT_EQ(now->bf16_gflops > 0, si->bf16_gflops_per_core.has_value());
  EXPECT_EQ(now->int8_gops > 0, si->int8_gops_per_core.has_value());
  EXPECT_EQ(now->amx_bf16_gflops > 0, si->amx_bf16_gflops_per_core.has_value());
  EXPECT_FALSE((*probe)->measure(0.0, 2).ok());
  EXPECT_FALSE((*probe)->measure(0.002, 0).ok());
  EXPECT_FALSE(PeakProbe::create(0).ok());
  // Two threads handing a line back and forth take some time, and far less
  // than a second; one thread has no one to hand it to.
  EXPECT_TRUE(std::isfinite(now->round_trip_ns) && now->round_trip_ns > 0 && now->round_trip_ns < 1e9)
      << now->round_trip_ns;
  const double rt = (*probe)->round_trip_ns();
  EXPECT_TRUE(rt > 0 && rt < 1e9) << rt;
  auto one = PeakProbe::create(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->round_trip_ns(), 0.0);
}

TEST(SysInfo, BestReadUsesNearestMeasuredThreadCount) {
  SysInfo s;
  EXPECT_EQ(s.best_read_gb_per_s(1), 0.0);
  EXPECT_EQ(s.max_measured_threads(), 0);
  s.read = {{1, 1, 10.0}, {1, 4, 12.0}, {4, 1, 30.0}, {4, 8, 35.0}};
  EXPECT_EQ(s.best_read_gb_per_s(1), 12.0);
  EXPECT_EQ(s.best_read_gb_per_s(2), 12.0);  // 1 is nearer than 4
  EXPECT_EQ(s.best_read_gb_per_s(3), 35.0);
  EXPECT_EQ(s.best_read_gb_per_s(4), 35.0);
  EXPECT_EQ(s.best_read_gb_per_s(64), 35.0);
  EXPECT_EQ(s.best_read_gb_per_s(0), 12.0);
  s.read = {{1, 1, 10.0}, {3, 1, 20.0}};
  EXPECT_EQ(s.best_read_gb_per_s(2), 10.0);  // tie: the lower count
  EXPECT_EQ(s.max_measured_threads(), 3);
}

SysInfo sample(bool with_low_precision) {
  SysInfo s;
  s.cpu = "Test CPU (family 1 model 2 stepping 3)";
  s.hardware_threads = 4;
  s.kernel_isa = "avx2";
  s.cpu_isa = "avx512 +avx512bf16";
  s.l1d_bytes = 49152;
  s.l2_bytes = 1 << 20;
  s.l3_bytes = int64_t{32} << 20;
  s.read = {{1, 1, 12.5}, {1, 4, 17.25}, {2, 1, 25.0}, {2, 4, 35.125}};
  s.copy = {{1, 11.0}, {2, 20.5}};
  s.triad = {{1, 12.0}, {2, 22.75}};
  s.fp32_gflops_per_core = 130.5;
  s.fp32_gflops_total = 260.25;
  if (with_low_precision) {
    s.bf16_gflops_per_core = 255.0;
    s.int8_gops_per_core = 810.0;
    s.amx_bf16_gflops_per_core = 3449.5;
    s.amx_int8_gops_per_core = 6898.25;
    s.core_round_trip_ns = 51.5;
  }
  s.bytes_per_measurement = int64_t{256} << 20;
  s.repetitions = 5;
  s.measured_at = "2025-01-02T03:04:05Z";
  return s;
}

void expect_same(const SysInfo& a, const SysInfo& b) {
  EXPECT_EQ(a.cpu, b.cpu);
  EXPECT_EQ(a.hardware_threads, b.hardware_threads);
  EXPECT_EQ(a.kernel_isa, b.kernel_isa);
  EXPECT_EQ(a.cpu_isa, b.cpu_isa);
  EXPECT_EQ(a.l1d_bytes, b.l1d_bytes);
  EXPECT_EQ(a.l2_bytes, b.l2_bytes);
  EXPECT_EQ(a.l3_bytes, b.l3_bytes);
  ASSERT_EQ(a.read.size(), b.read.size());
  for (size_t i = 0; i < a.read.size(); ++i) {
    EXPECT_EQ(a.read[i].threads, b.read[i].threads);
    EXPECT_EQ(a.read[i].streams_per_thread, b.read[i].streams_per_thread);
    EXPECT_EQ(a.read[i].gb_per_s, b.read[i].gb_per_s);
  }
  EXPECT_EQ(a.copy, b.copy);
  EXPECT_EQ(a.triad, b.triad);
  EXPECT_EQ(a.fp32_gflops_per_core, b.fp32_gflops_per_core);
  EXPECT_EQ(a.fp32_gflops_total, b.fp32_gflops_total);
  EXPECT_EQ(a.bf16_gflops_per_core, b.bf16_gflops_per_core);
  EXPECT_EQ(a.int8_gops_per_core, b.int8_gops_per_core);
  EXPECT_EQ(a.amx_bf16_gflops_per_core, b.amx_bf16_gflops_per_core);
  EXPECT_EQ(a.amx_int8_gops_per_core, b.amx_int8_gops_per_core);
  EXPECT_EQ(a.core_round_trip_ns, b.core_round_trip_ns);
  EXPECT_EQ(a.bytes_per_measurement, b.bytes_per_measurement);
  EXPECT_EQ(a.repetitions, b.repetitions);
  EXPECT_EQ(a.measured_at, b.measured_at);
}

TEST(SysInfoJson, RoundTripsThroughText) {
  for (bool low : {true, false}) {
    const SysInfo s = sample(low);
    const nlohmann::json j = s.to_json();
    if (!low) {
      EXPECT_TRUE(j["bf16_gflops_per_core"].is_null());
      EXPECT_TRUE(j["int8_gops_per_core"].is_null());
      EXPECT_TRUE(j["amx_bf16_gflops_per_core"].is_null());
      EXPECT_TRUE(j["amx_int8_gops_per_core"].is_null());
    }
    auto back = SysInfo::from_json(nlohmann::json::parse(j.dump()));
    ASSERT_TRUE(back.ok()) << back.status().message();
    expect_same(s, *back);
  }
}

// Caches written before the AMX peaks (and the round trip) existed still
// load, without them.
TEST(SysInfoJson, ReadsACacheWithoutTheAmxPeaks) {
  {
    nlohmann::json j = sample(true).to_json();
    j.erase("core_round_trip_ns");
    auto back = SysInfo::from_json(j);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_FALSE(back->core_round_trip_ns.has_value());
    j["core_round_trip_ns"] = "near";
    EXPECT_FALSE(SysInfo::from_json(j).ok());
  }
  for (const char* key : {"amx_bf16_gflops_per_core", "amx_int8_gops_per_core"}) {
    nlohmann::json j = sample(true).to_json();
    j.erase(key);
    auto back = SysInfo::from_json(j);
    ASSERT_TRUE(back.ok()) << key << ": " << back.status().message();
    EXPECT_EQ(back->amx_bf16_gflops_per_core.has_value(), std::string(key) != "amx_bf16_gflops_per_core");
    EXPECT_EQ(back->amx_int8_gops_per_core.has_value(), std::string(key) != "amx_int8_gops_per_core");
    EXPECT_EQ(back->bf16_gflops_per_core, 255.0);
    j[key] = "fast";
    EXPECT_FALSE(SysInfo::from_json(j).ok()) << key;
  }
}

TEST(SysInfoJson, RoundTripsAMeasurement) {
  auto s = measure_sysinfo(small_options(1));
  ASSERT_TRUE(s.ok()) << s.status().message();
  auto back = SysInfo::from_json(nlohmann::json::parse(s->to_json().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  expect_same(*s, *back);
}

TEST(SysInfoJson, RejectsMalformedInputWithoutThrowing) {
  const nlohmann::json good = sample(true).to_json();
  EXPECT_FALSE(SysInfo::from_json(nlohmann::json::array()).ok());
  EXPECT_FALSE(SysInfo::from_json(nlohmann::json(42)).ok());
  for (const char* key : {"format_version", "cpu", "hardware_threads", "read", "copy", "triad", "fp32_gflops_per_core",
                          "bf16_gflops_per_core", "measured_at"}) {
    nlohmann::json j = good;
    j.erase(key);
    auto r = SysInfo::from_json(j);
    EXPECT_FALSE(r.ok()) << "accepted without " << key;
  }
  nlohmann::json j = good;
  j["cpu"] = 7;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["read"][0]["gb_per_s"] = "fast";
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["read"][1] = 3;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["hardware_threads"] = 2.5;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["read"][0]["threads"] = 0;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["l3_bytes"] = -1;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["hardware_threads"] = uint64_t{1} << 40;  // does not fit an int
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["fp32_gflops_per_core"] = -3.0;
  EXPECT_FALSE(SysInfo::from_json(j).ok());
  j = good;
  j["format_version"] = kSysInfoFormatVersion + 1;
  auto r = SysInfo::from_json(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("format version"), std::string::npos) << r.status().message();
}

// ---- cache ----------------------------------------------------------------

// Points K3_CACHE_DIR at a fresh temporary directory for one test.
class SysInfoCache : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("K3_CACHE_DIR");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    dir_ = std::filesystem::temp_directory_path() / ("k3_test_sysinfo_" + std::to_string(getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    setenv("K3_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (had_old_)
      setenv("K3_CACHE_DIR", old_.c_str(), 1);
    else
      unsetenv("K3_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string path() const { return (dir_ / "sysinfo.json").string(); }
  nlohmann::json read_file() const {
    std::ifstream in(path());
    std::stringstream text;
    text << in.rdbuf();
    return nlohmann::json::parse(text.str(), nullptr, false);
  }
  void write_file(const std::string& text) const {
    std::filesystem::create_directories(dir_);
    std::ofstream(path()) << text;
  }

  std::filesystem::path dir_;
  std::string old_;
  bool had_old_ = false;
};

constexpr double kSentinel = 12345.5;

TEST_F(SysInfoCache, PathFollowsEnvironment) {
  EXPECT_EQ(sysinfo_cache_path(), path());
}

TEST_F(SysInfoCache, SecondLoadReturnsCachedEntry) {
  auto first = load_or_measure_sysinfo(small_options(), false);
  ASSERT_TRUE(first.ok()) << first.status().message();
  nlohmann::json file = read_file();
  ASSERT_TRUE(file.is_object()) << "cache file not written";
  ASSERT_EQ(file["entries"].size(), 1u);
  // Plant a sentinel that no measurement would produce: seeing it back
  // proves the second call read the cache instead of measuring.
  for (auto& e : file["entries"]) {
    e["fp32_gflops_per_core"] = kSentinel;
    e["kernel_isa"] = "stale";
  }
  write_file(file.dump());
  auto second = load_or_measure_sysinfo(small_options(), false);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->fp32_gflops_per_core, kSentinel);
  // kernel_isa is the current process's, not the cached one.
  EXPECT_EQ(second->kernel_isa, std::string(kernels::isa_name(kernels::best_table().isa)));
  // A request for fewer threads is covered by the cached entry too.
  auto fewer = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(fewer->fp32_gflops_per_core, kSentinel);

  // --refresh re-measures and replaces the entry.
  auto refreshed = load_or_measure_sysinfo(small_options(), true);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status().message();
  EXPECT_NE(refreshed->fp32_gflops_per_core, kSentinel);
  const auto cache = read_file();  // keep the parsed JSON alive for the loop
  for (auto& e : cache["entries"]) EXPECT_NE(e["fp32_gflops_per_core"].get<double>(), kSentinel);
}

TEST_F(SysInfoCache, CorruptFileIsRemeasuredAndRewritten) {
  for (const char* junk :
       {"{ this is not json", "[1, 2, 3]", "{\"entries\": 5}", "", "{\"entries\": {\"x\": {\"cpu\": 1}}}"}) {
    write_file(junk);
    auto s = load_or_measure_sysinfo(small_options(1), false);
    ASSERT_TRUE(s.ok()) << junk << ": " << s.status().message();
    EXPECT_TRUE(positive_finite(s->fp32_gflops_per_core));
    const nlohmann::json file = read_file();
    ASSERT_TRUE(file.is_object()) << "not rewritten after " << junk;
    ASSERT_EQ(file["entries"].size(), 1u) << file.dump();  // malformed entries dropped
    auto back = SysInfo::from_json(file["entries"].begin().value());
    EXPECT_TRUE(back.ok()) << back.status().message();
  }
}

TEST_F(SysInfoCache, OtherMachinesEntryIsIgnoredAndKept) {
  auto first = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(first.ok()) << first.status().message();
  nlohmann::json file = read_file();
  ASSERT_EQ(file["entries"].size(), 1u);
  // Turn this machine's entry into another CPU's, with a sentinel.
  nlohmann::json entry = file["entries"].begin().value();
  entry["cpu"] = "Some Other CPU (family 99 model 1 stepping 0)";
  entry["fp32_gflops_per_core"] = kSentinel;
  file["entries"] = {{"v1|Some Other CPU (family 99 model 1 stepping 0)|2 threads", entry}};
  write_file(file.dump());

  auto s = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_NE(s->fp32_gflops_per_core, kSentinel);
  EXPECT_EQ(s->cpu, first->cpu);
  // Both machines' entries are in the file now.
  EXPECT_EQ(read_file()["entries"].size(), 2u);
}

TEST_F(SysInfoCache, EntryUnderOurKeyWithAnotherCpuIsIgnored) {
  ASSERT_TRUE(load_or_measure_sysinfo(small_options(1), false).ok());
  nlohmann::json file = read_file();
  for (auto& e : file["entries"]) {
    e["cpu"] = "Impostor CPU";
    e["fp32_gflops_per_core"] = kSentinel;
  }
  write_file(file.dump());
  auto s = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s->fp32_gflops_per_core, kSentinel);
}

TEST_F(SysInfoCache, EntryThatDoesNotCoverTheRequestIsRemeasured) {
  ASSERT_TRUE(load_or_measure_sysinfo(small_options(1), false).ok());
  // More threads than were measured.
  auto two = load_or_measure_sysinfo(small_options(2), false);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->max_measured_threads(), 2);
  // Larger arrays than were measured (small ones only measure caches).
  MeasureOptions bigger = small_options(2);
  bigger.bytes_per_array *= 2;
  auto big = load_or_measure_sysinfo(bigger, false);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->bytes_per_measurement, 2 * bigger.bytes_per_array);
}

// An entry from before a peak existed lacks it: on a CPU that has the unit
// it is measured again; elsewhere the entry still answers.
TEST_F(SysInfoCache, EntryMissingAPeakThisCpuHasIsRemeasured) {
  ASSERT_TRUE(load_or_measure_sysinfo(small_options(1), false).ok());
  nlohmann::json file = read_file();
  for (auto& e : file["entries"]) {
    e.erase("amx_int8_gops_per_core");
    e["fp32_gflops_per_core"] = kSentinel;
  }
  write_file(file.dump());
  auto s = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(s.ok()) << s.status().message();
  const bool has_amx_int8 = kernels::table_for(kernels::Isa::kAmx) != nullptr && __builtin_cpu_supports("amx-int8");
  EXPECT_EQ(s->fp32_gflops_per_core != kSentinel, has_amx_int8);
  EXPECT_EQ(s->amx_int8_gops_per_core.has_value(), has_amx_int8);
}

TEST_F(SysInfoCache, UnwritableCacheStillReturnsAMeasurement) {
  // A regular file where the cache directory should be.
  std::filesystem::create_directories(dir_.parent_path());
  std::ofstream(dir_.string()) << "not a directory";
  auto s = load_or_measure_sysinfo(small_options(1), false);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(positive_finite(s->fp32_gflops_per_core));
  std::filesystem::remove(dir_);
}

}  // namespace
}  // namespace k3::profile
