// sysinfo: measures this machine's bandwidth and compute limits, reads its
// caches and CPU identity, and caches the result per machine in JSON.
//
// Bandwidth is measured the way decode uses memory: threads each stream a
// contiguous share of arrays far larger than the caches, pages faulted in
// beforehand, warm-up pass first, median of several timed passes. Compute
// peaks come from register-resident loops in the per-ISA files (x86/).
#include "profile/sysinfo.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cpuid.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>
#include <type_traits>

#include "kernels/kernels.h"
#include "runtime/thread_pool.h"

namespace k3::profile {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStreamCounts[] = {1, 2, 4, 8};
// Read kernels take whole 512-byte blocks per stream (see sysinfo.h).
constexpr int64_t kReadBlock = 512;
// Copy/triad kernels take whole 64-float blocks.
constexpr int64_t kFloatBlock = 64;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c) && c != '\0'; };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

// Brand string plus the CPUID signature: hypervisors often shorten the brand
// (this machine's says just "AMD EPYC"), and the family/model tells CPU
// generations apart so a cache entry is not reused across them.
std::string cpu_model_uncached() {
  std::string brand;
  unsigned regs[12] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char text[49] = {};
    std::memcpy(text, regs, 48);
    brand = trim(text);
  }
  if (brand.empty()) {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("model name", 0) == 0) {
        const auto p = line.find(':');
        if (p != std::string::npos) brand = trim(line.substr(p + 1));
        break;
      }
  }
  if (brand.empty()) brand = "unknown CPU";
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    // Family and model as Linux computes them (the extended fields count
    // only for family 0xF, and for model also family 6).
    const unsigned base_family = (eax >> 8) & 0xF, base_model = (eax >> 4) & 0xF;
    const unsigned family = base_family == 0xF ? base_family + ((eax >> 20) & 0xFF) : base_family;
    const unsigned model = base_family == 0xF || base_family == 6 ? base_model + (((eax >> 16) & 0xF) << 4) : base_model;
    brand += " (family " + std::to_string(family) + " model " + std::to_string(model) + " stepping " + std::to_string(eax & 0xF) + ")";
  }
  return brand;
}

const std::string& cpu_model() {
  static const std::string model = cpu_model_uncached();
  return model;
}

bool cpu_has_bf16() {
  __builtin_cpu_init();
  return kernels::detect_isa() >= kernels::Isa::kAvx512 && __builtin_cpu_supports("avx512bf16");
}

bool cpu_has_amx() {
  return kernels::detect_isa() == kernels::Isa::kAmx;
}

bool cpu_has_amx_int8() {
  __builtin_cpu_init();
  return cpu_has_amx() && __builtin_cpu_supports("amx-int8");
}

bool cpu_has_vnni() {
  __builtin_cpu_init();
  return kernels::detect_isa() >= kernels::Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
}

// The int8 product the kernels run here (SysInfo::int8_gops_per_core): the
// loop that times it and its instructions; {nullptr, nullptr} on the
// scalar table.
using Int8Loop = int32_t (*)(int64_t, double*);
struct Int8Dot {
  Int8Loop loop;
  const char* name;
};
Int8Dot int8_dot() {
  if (cpu_has_vnni()) return {detail::dpbusd_loop_avx512, "vpdpbusd"};
  if (kernels::detect_isa() >= kernels::Isa::kAvx2) return {detail::maddubs_loop_avx2, "vpmaddubsw + vpmaddwd"};
  return {nullptr, nullptr};
}

// The level the kernels can reach plus the extensions that matter for
// low-precision kernels (present or future), so a report says at a glance
// whether bf16/int8 paths are possible here.
std::string cpu_isa_string() {
  __builtin_cpu_init();
  std::string s(kernels::isa_name(kernels::detect_isa()));
  if (__builtin_cpu_supports("avx512bf16")) s += " +avx512bf16";
  if (__builtin_cpu_supports("avx512vnni")) s += " +avx512vnni";
  if (__builtin_cpu_supports("avx512fp16")) s += " +avx512fp16";
  if (__builtin_cpu_supports("avxvnni")) s += " +avxvnni";
  if (__builtin_cpu_supports("amx-bf16")) s += " +amx-bf16";
  if (__builtin_cpu_supports("amx-int8")) s += " +amx-int8";
  return s;
}

// "48K" / "1024K" / "32M" -> bytes; 0 if unparsable.
int64_t parse_cache_size(const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || v <= 0) return 0;
  switch (*end) {
    case 'K':
      return v << 10;
    case 'M':
      return v << 20;
    case 'G':
      return v << 30;
    default:
      return v;
  }
}

std::string read_first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

// Per-core (per-instance) cache sizes. sysfs first: glibc's sysconf derives
// them from CPUID and, under a hypervisor, can report the host's whole-socket
// L3 (384 MiB here) instead of what one core can use (32 MiB).
void read_cache_sizes(SysInfo& info) {
  std::error_code ec;
  const std::filesystem::path dir("/sys/devices/system/cpu/cpu0/cache");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind("index", 0) != 0) continue;
    const std::string level = read_first_line(entry.path() / "level");
    const std::string type = read_first_line(entry.path() / "type");
    const int64_t size = parse_cache_size(read_first_line(entry.path() / "size"));
    if (level == "1" && type == "Data") info.l1d_bytes = size;
    if (level == "2" && type != "Instruction") info.l2_bytes = size;
    if (level == "3" && type != "Instruction") info.l3_bytes = size;
  }
  const auto from_sysconf = [](int name) { return std::max<int64_t>(0, sysconf(name)); };
  if (info.l1d_bytes == 0) info.l1d_bytes = from_sysconf(_SC_LEVEL1_DCACHE_SIZE);
  if (info.l2_bytes == 0) info.l2_bytes = from_sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (info.l3_bytes == 0) info.l3_bytes = from_sysconf(_SC_LEVEL3_CACHE_SIZE);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- kernels: the widest ISA the CPU has, or plain loops --------------------

uint64_t read_streams_generic(const void* const* ptrs, int streams, int64_t n_bytes) {
  uint64_t sum = 0;
  const int64_t n = n_bytes / 8;
  for (int64_t i = 0; i < n; ++i)
    for (int s = 0; s < streams; ++s) sum += static_cast<const uint64_t*>(ptrs[s])[i];
  return sum;
}

void copy_generic(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

void triad_generic(float* a, const float* b, const float* c, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

struct Loops {
  uint64_t (*read)(const void* const*, int, int64_t);
  void (*copy)(const float*, float*, int64_t);
  void (*triad)(float*, const float*, const float*, float, int64_t);
  float (*fma)(int64_t, double*);  // nullptr: no SIMD FMA on this CPU
};

Loops loops_for_cpu() {
  switch (kernels::detect_isa()) {
    case kernels::Isa::kAmx:
    case kernels::Isa::kAvx512:
      return {detail::read_streams_avx512, detail::copy_avx512, detail::triad_avx512, detail::fma_loop_avx512};
    case kernels::Isa::kAvx2:
      return {detail::read_streams_avx2, detail::copy_avx2, detail::triad_avx2, detail::fma_loop_avx2};
    default:
      return {read_streams_generic, copy_generic, triad_generic, nullptr};
  }
}

// Results land here so no measured loop is dead code.
std::atomic<uint64_t> g_sink{0};

template <typename T>
void sink(T v) {
  uint64_t bits = 0;
  if constexpr (std::is_floating_point_v<T>)
    bits = std::bit_cast<uint32_t>(static_cast<float>(v));  // a float->int cast of an arbitrary value is UB
  else
    bits = static_cast<uint64_t>(v);
  g_sink.fetch_add(bits, std::memory_order_relaxed);
}

// ---- bandwidth --------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// The three arrays a, b, c (each bytes_per_array) in one block. Ordinary
// pages, as the runtime's weights get: advising transparent huge pages made
// no measurable difference to streaming reads here but multiplied the time to
// fault the block in (0.16 s -> 0.87 s for 384 MiB on this VM).
struct Arrays {
  std::unique_ptr<char, FreeDeleter> block;
  int64_t bytes_per_array = 0;
  char* a() const { return block.get(); }
  char* b() const { return block.get() + bytes_per_array; }
  char* c() const { return block.get() + 2 * bytes_per_array; }
};

StatusOr<Arrays> allocate_arrays(int64_t bytes_per_array, ThreadPool& pool) {
  constexpr int64_t kAlign = 4096;
  Arrays arrays;
  arrays.bytes_per_array = bytes_per_array;
  const int64_t total = (3 * bytes_per_array + kAlign - 1) / kAlign * kAlign;
  arrays.block.reset(static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(total))));
  if (!arrays.block) return internal_error("cannot allocate " + std::to_string(total >> 20) + " MiB for the bandwidth arrays");
  // Fault every page in (in parallel, as the measurements will touch them)
  // with values triad can work on without denormals or overflow.
  float* f = reinterpret_cast<float*>(arrays.block.get());
  pool.parallel_for(total / 4, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f[i] = 1.0f + static_cast<float>(i & 7);
  });
  return arrays;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs body(t, nt) on every thread of the pool and returns the seconds from
// the moment all threads are running to the moment the last one finishes.
// The start barrier keeps thread wake-up latency (futex wake, and on a busy
// machine waiting for a core) out of the measurement: it is the memory system
// being timed, not the scheduler.
template <typename Body>
double timed_run(ThreadPool& pool, Body& body) {
  std::atomic<int> arrived{0};
  Clock::time_point t0;
  pool.run_on_each_thread([&](int t, int nt) {
    arrived.fetch_add(1, std::memory_order_acq_rel);
    for (int spins = 0; arrived.load(std::memory_order_acquire) < nt; ++spins) {
      __builtin_ia32_pause();
      if (spins > 1000) std::this_thread::yield();  // more threads than cores
    }
    if (t == 0) t0 = Clock::now();
    body(t, nt);
  });
  return seconds_since(t0);
}

}  // namespace

const char* int8_dot_instruction() {
  return int8_dot().name;
}

double measure_round_trip_ns(ThreadPool& pool, int trips) {
  if (pool.size() < 2 || trips < 5) return 0;
  struct alignas(64) Line {
    std::atomic<int> v{0};
  } ball;
  const int per = trips / 5;
  // Threads 0 and 1 throw the ball (an increasing count) back and forth;
  // the others return at once. Past a few thousand spins a waiting thread
  // yields (two threads on one core would otherwise spin away whole time
  // slices).
  auto body = [&](int t, int) {
    if (t > 1) return;
    auto wait_for = [&](int want) {
      for (int spins = 0; ball.v.load(std::memory_order_acquire) != want; ++spins) {
        __builtin_ia32_pause();
        if (spins > 4000) std::this_thread::yield();
      }
    };
    for (int n = 0; n < 2 * per; n += 2) {
      if (t == 0) {
        ball.v.store(n + 1, std::memory_order_release);
        wait_for(n + 2);
      } else {
        wait_for(n + 1);
        ball.v.store(n + 2, std::memory_order_release);
      }
    }
  };
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    ball.v.store(0, std::memory_order_relaxed);  // the region's start publishes it to the worker
    batches.push_back(timed_run(pool, body) * 1e9 / per);
  }
  return median(std::move(batches));
}

namespace {

// GB/s of `bytes` moved by pass() on the pool: one warm-up pass (page
// mappings, prefetcher training, clock ramp), then the median of `reps`.
template <typename Pass>
double median_gb_per_s(ThreadPool& pool, double bytes, int reps, Pass&& pass) {
  timed_run(pool, pass);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) rates.push_back(bytes / timed_run(pool, pass) / 1e9);
  return median(std::move(rates));
}

// Read: the first two arrays (2 * bytes_per_array) as one range, split into
// a contiguous share per thread; each share is read as `streams` equal
// sub-ranges interleaved, like a kernel reading several weight rows at once.
double measure_read(ThreadPool& pool, const Loops& loops, const Arrays& arrays, int streams, int reps) {
  const int64_t unit = kReadBlock * streams;
  const int64_t units = 2 * arrays.bytes_per_array / unit;
  const char* base = arrays.a();
  auto pass = [&](int t, int nt) {
    int64_t begin, end;
    ThreadPool::split_range(units, 1, t, nt, begin, end);
    if (begin >= end) return;
    const int64_t len = (end - begin) * kReadBlock;  // bytes per stream
    const void* ptrs[8];
    for (int s = 0; s < streams; ++s) ptrs[s] = base + begin * unit + s * len;
    sink(loops.read(ptrs, streams, len));
  };
  return median_gb_per_s(pool, static_cast<double>(units * unit), reps, pass);
}

// STREAM copy c = a (2 words moved per element) and triad a = b + s * c (3).
double measure_copy(ThreadPool& pool, const Loops& loops, const Arrays& arrays, int reps) {
  const int64_t n = arrays.bytes_per_array / 4 / kFloatBlock * kFloatBlock;
  const float* src = reinterpret_cast<const float*>(arrays.a());
  float* dst = reinterpret_cast<float*>(arrays.c());
  auto pass = [&](int t, int nt) {
    int64_t begin, end;
    ThreadPool::split_range(n, kFloatBlock, t, nt, begin, end);
    if (begin < end) loops.copy(src + begin, dst + begin, end - begin);
  };
  return median_gb_per_s(pool, 2.0 * 4.0 * static_cast<double>(n), reps, pass);
}

double measure_triad(ThreadPool& pool, const Loops& loops, const Arrays& arrays, int reps) {
  const int64_t n = arrays.bytes_per_array / 4 / kFloatBlock * kFloatBlock;
  float* a = reinterpret_cast<float*>(arrays.a());
  const float* b = reinterpret_cast<const float*>(arrays.b());
  const float* c = reinterpret_cast<const float*>(arrays.c());
  auto pass = [&](int t, int nt) {
    int64_t begin, end;
    ThreadPool::split_range(n, kFloatBlock, t, nt, begin, end);
    if (begin < end) loops.triad(a + begin, b + begin, c + begin, 0.5f, end - begin);
  };
  return median_gb_per_s(pool, 3.0 * 4.0 * static_cast<double>(n), reps, pass);
}

// ---- compute peaks ----------------------------------------------------------

// Ops per second of loop(iters) run on every thread of the pool at once.
// Iterations are calibrated so a run takes about `seconds`; the best of
// several runs is reported, since interference from other processes can only
// slow a register-resident loop, never speed it up. Many short runs rather
// than a few long ones: on a shared machine a 10 ms run often fits between
// two preemptions, a 40 ms run rarely does.
template <typename Loop>
double peak_ops_per_s(ThreadPool& pool, double seconds, int runs, Loop loop) {
  std::vector<double> ops(static_cast<size_t>(pool.size()));
  int64_t run_iters = 0;
  auto body = [&](int t, int) {
    double o = 0;
    const auto r = loop(run_iters, &o);
    ops[static_cast<size_t>(t)] = o;
    sink(r);
  };
  auto run_all = [&](int64_t iters) {
    run_iters = iters;
    return timed_run(pool, body);
  };
  int64_t iters = 1 << 12;
  for (;;) {  // calibrate: grow until a run is long enough to time reliably
    const double dt = run_all(iters);
    if (dt >= seconds / 4 || iters >= (int64_t{1} << 40)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(dt, 1e-9)));
      break;
    }
    iters *= 8;
  }
  run_all(iters);  // warm-up at full length (clock ramp, wide-vector power-up)
  double best = 0;
  for (int r = 0; r < runs; ++r) {
    const double dt = run_all(iters);
    double total = 0;
    for (double o : ops) total += o;
    best = std::max(best, total / dt);
  }
  return best;
}

// Scalar fallback for CPUs without AVX2/FMA: 8 independent chains of a*b+c
// (the compiler emits mulss/addss at baseline x86-64).
float scalar_fma_loop(int64_t iters, double* ops) {
  float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int64_t i = 0; i < iters; ++i)
    for (float& v : acc) v = v * 0.999999f + 1e-6f;
  *ops = static_cast<double>(iters) * 8 * 2;
  float sum = 0;
  for (float v : acc) sum += v;
  return sum;
}

// ---- JSON helpers -----------------------------------------------------------

// Each returns an error naming the key when it is missing or mistyped.
Status get_number(const nlohmann::json& j, const char* key, double& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return data_loss(std::string("sysinfo: \"") + key + "\" missing or not a number");
  out = it->get<double>();
  if (!std::isfinite(out) || out < 0) return data_loss(std::string("sysinfo: \"") + key + "\" is not a finite non-negative number");
  return Status::ok_status();
}

template <typename Int>
Status get_int(const nlohmann::json& j, const char* key, Int& out, int64_t min_value = std::numeric_limits<Int>::min()) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return data_loss(std::string("sysinfo: \"") + key + "\" missing or not an integer");
  const bool too_big = it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t v = too_big ? 0 : it->get<int64_t>();
  if (too_big || v < min_value || v > static_cast<int64_t>(std::numeric_limits<Int>::max()))
    return data_loss(std::string("sysinfo: \"") + key + "\" out of range");
  out = static_cast<Int>(v);
  return Status::ok_status();
}

Status get_string(const nlohmann::json& j, const char* key, std::string& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return data_loss(std::string("sysinfo: \"") + key + "\" missing or not a string");
  out = it->get<std::string>();
  return Status::ok_status();
}

Status get_optional_number(const nlohmann::json& j, const char* key, std::optional<double>& out) {
  const auto it = j.find(key);
  if (it != j.end() && it->is_null()) {
    out.reset();
    return Status::ok_status();
  }
  double v = 0;
  K3_RETURN_IF_ERROR(get_number(j, key, v));
  out = v;
  return Status::ok_status();
}

Status get_thread_series(const nlohmann::json& j, const char* key, std::vector<std::pair<int, double>>& out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return data_loss(std::string("sysinfo: \"") + key + "\" missing or not an array");
  out.clear();
  for (const auto& e : *it) {
    if (!e.is_object()) return data_loss(std::string("sysinfo: \"") + key + "\" entry is not an object");
    int threads = 0;
    double gb = 0;
    K3_RETURN_IF_ERROR(get_int(e, "threads", threads, 1));
    K3_RETURN_IF_ERROR(get_number(e, "gb_per_s", gb));
    out.emplace_back(threads, gb);
  }
  return Status::ok_status();
}

nlohmann::json thread_series_json(const std::vector<std::pair<int, double>>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& [threads, gb] : v) a.push_back({{"threads", threads}, {"gb_per_s", gb}});
  return a;
}

nlohmann::json optional_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

// ---- cache ------------------------------------------------------------------

std::string cache_key(const std::string& cpu, int threads) {
  return "v" + std::to_string(kSysInfoFormatVersion) + "|" + cpu + "|" + std::to_string(threads) + " threads";
}

// The cache file's entries (key -> SysInfo JSON), or an empty object when the
// file is missing, unreadable or not what we wrote.
nlohmann::json read_cache_entries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nlohmann::json::object();
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json file = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded() || !file.is_object()) return nlohmann::json::object();
  const auto it = file.find("entries");
  if (it == file.end() || !it->is_object()) return nlohmann::json::object();
  return *it;
}

// Write-then-rename, so a concurrent reader (or a crash) never sees half a file.
Status write_cache(const std::string& path, const nlohmann::json& entries) {
  std::error_code ec;
  const std::filesystem::path p(path);
  std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return io_error("cannot create " + p.parent_path().string() + ": " + ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return io_error("cannot write " + tmp);
    out << nlohmann::json{{"entries", entries}}.dump(2) << "\n";
    if (!out.flush()) return io_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return io_error("cannot replace " + path);
  }
  return Status::ok_status();
}

}  // namespace

// ---- SysInfo ------------------------------------------------------------------

int SysInfo::max_measured_threads() const {
  int m = 0;
  for (const auto& p : read) m = std::max(m, p.threads);
  return m;
}

double SysInfo::best_read_gb_per_s(int threads) const {
  int nearest = -1;
  for (const auto& p : read) {
    const int d = std::abs(p.threads - threads), dn = std::abs(nearest - threads);
    if (nearest < 0 || d < dn || (d == dn && p.threads < nearest)) nearest = p.threads;
  }
  double best = 0;
  for (const auto& p : read)
    if (p.threads == nearest) best = std::max(best, p.gb_per_s);
  return best;
}

nlohmann::json SysInfo::to_json() const {
  nlohmann::json j;
  j["format_version"] = kSysInfoFormatVersion;
  j["cpu"] = cpu;
  j["hardware_threads"] = hardware_threads;
  j["kernel_isa"] = kernel_isa;
  j["cpu_isa"] = cpu_isa;
  j["l1d_bytes"] = l1d_bytes;
  j["l2_bytes"] = l2_bytes;
  j["l3_bytes"] = l3_bytes;
  nlohmann::json r = nlohmann::json::array();
  for (const auto& p : read) r.push_back({{"threads", p.threads}, {"streams_per_thread", p.streams_per_thread}, {"gb_per_s", p.gb_per_s}});
  j["read"] = std::move(r);
  // Derived, for readers of the file; from_json recomputes it.
  std::vector<std::pair<int, double>> best;
  for (const auto& p : read)
    if (best.empty() || best.back().first != p.threads) best.emplace_back(p.threads, best_read_gb_per_s(p.threads));
  j["read_best"] = thread_series_json(best);
  j["copy"] = thread_series_json(copy);
  j["triad"] = thread_series_json(triad);
  j["fp32_gflops_per_core"] = fp32_gflops_per_core;
  j["fp32_gflops_total"] = fp32_gflops_total;
  j["bf16_gflops_per_core"] = optional_json(bf16_gflops_per_core);
  j["amx_bf16_gflops_per_core"] = optional_json(amx_bf16_gflops_per_core);
  j["amx_int8_gops_per_core"] = optional_json(amx_int8_gops_per_core);
  j["int8_gops_per_core"] = optional_json(int8_gops_per_core);
  j["core_round_trip_ns"] = optional_json(core_round_trip_ns);
  j["bytes_per_measurement"] = bytes_per_measurement;
  j["repetitions"] = repetitions;
  j["measured_at"] = measured_at;
  return j;
}

StatusOr<SysInfo> SysInfo::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return data_loss("sysinfo: not a JSON object");
  int version = 0;
  K3_RETURN_IF_ERROR(get_int(j, "format_version", version));
  if (version != kSysInfoFormatVersion)
    return data_loss("sysinfo: format version " + std::to_string(version) + ", expected " + std::to_string(kSysInfoFormatVersion));
  SysInfo s;
  K3_RETURN_IF_ERROR(get_string(j, "cpu", s.cpu));
  K3_RETURN_IF_ERROR(get_int(j, "hardware_threads", s.hardware_threads, 1));
  K3_RETURN_IF_ERROR(get_string(j, "kernel_isa", s.kernel_isa));
  K3_RETURN_IF_ERROR(get_string(j, "cpu_isa", s.cpu_isa));
  K3_RETURN_IF_ERROR(get_int(j, "l1d_bytes", s.l1d_bytes, 0));
  K3_RETURN_IF_ERROR(get_int(j, "l2_bytes", s.l2_bytes, 0));
  K3_RETURN_IF_ERROR(get_int(j, "l3_bytes", s.l3_bytes, 0));
  const auto r = j.find("read");
  if (r == j.end() || !r->is_array()) return data_loss("sysinfo: \"read\" missing or not an array");
  for (const auto& e : *r) {
    if (!e.is_object()) return data_loss("sysinfo: \"read\" entry is not an object");
    BandwidthPoint p;
    K3_RETURN_IF_ERROR(get_int(e, "threads", p.threads, 1));
    K3_RETURN_IF_ERROR(get_int(e, "streams_per_thread", p.streams_per_thread, 1));
    K3_RETURN_IF_ERROR(get_number(e, "gb_per_s", p.gb_per_s));
    s.read.push_back(p);
  }
  K3_RETURN_IF_ERROR(get_thread_series(j, "copy", s.copy));
  K3_RETURN_IF_ERROR(get_thread_series(j, "triad", s.triad));
  K3_RETURN_IF_ERROR(get_number(j, "fp32_gflops_per_core", s.fp32_gflops_per_core));
  K3_RETURN_IF_ERROR(get_number(j, "fp32_gflops_total", s.fp32_gflops_total));
  K3_RETURN_IF_ERROR(get_optional_number(j, "bf16_gflops_per_core", s.bf16_gflops_per_core));
  // Added after the first caches were written: absent reads as not measured.
  if (j.contains("amx_bf16_gflops_per_core"))
    K3_RETURN_IF_ERROR(get_optional_number(j, "amx_bf16_gflops_per_core", s.amx_bf16_gflops_per_core));
  if (j.contains("amx_int8_gops_per_core"))
    K3_RETURN_IF_ERROR(get_optional_number(j, "amx_int8_gops_per_core", s.amx_int8_gops_per_core));
  K3_RETURN_IF_ERROR(get_optional_number(j, "int8_gops_per_core", s.int8_gops_per_core));
  if (j.contains("core_round_trip_ns"))
    K3_RETURN_IF_ERROR(get_optional_number(j, "core_round_trip_ns", s.core_round_trip_ns));
  K3_RETURN_IF_ERROR(get_int(j, "bytes_per_measurement", s.bytes_per_measurement, 0));
  K3_RETURN_IF_ERROR(get_int(j, "repetitions", s.repetitions, 0));
  K3_RETURN_IF_ERROR(get_string(j, "measured_at", s.measured_at));
  return s;
}

// ---- measurement --------------------------------------------------------------

int64_t default_bytes_per_array() {
  SysInfo caches;
  read_cache_sizes(caches);
  int64_t bytes = std::max(int64_t{128} << 20, (caches.l3_bytes + 4095) / 4096 * 4096);
  // The three arrays stay within 3/16 of the machine's memory (a reported
  // LLC can be large next to a small VM's RAM), never below 128 MiB each.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    const int64_t cap = static_cast<int64_t>(pages) / 16 * page / 4096 * 4096;
    bytes = std::max(int64_t{128} << 20, std::min(bytes, cap));
  }
  return bytes;
}

StatusOr<SysInfo> measure_sysinfo(const MeasureOptions& requested) {
  MeasureOptions options = requested;
  if (options.bytes_per_array == 0) options.bytes_per_array = default_bytes_per_array();
  const int max_threads = options.max_threads > 0 ? options.max_threads : hardware_threads();
  if (options.bytes_per_array < (int64_t{64} << 10))
    return invalid_argument("sysinfo: bytes_per_array must be at least 64 KiB, got " + std::to_string(options.bytes_per_array));
  if (options.repetitions < 1 || options.peak_runs < 1) return invalid_argument("sysinfo: repetitions and peak_runs must be at least 1");
  if (!(options.peak_seconds > 0) || options.peak_seconds > 10) return invalid_argument("sysinfo: peak_seconds must be in (0, 10]");

  SysInfo info;
  info.cpu = cpu_model();
  info.hardware_threads = hardware_threads();
  info.kernel_isa = std::string(kernels::isa_name(kernels::best_table().isa));
  info.cpu_isa = cpu_isa_string();
  read_cache_sizes(info);
  info.repetitions = options.repetitions;
  info.measured_at = utc_now();
  const Loops loops = loops_for_cpu();

  {
    // Whole 4 KiB pages per array keeps every per-thread split block-aligned.
    const int64_t bytes_per_array = options.bytes_per_array / 4096 * 4096;
    ThreadPool fill_pool(max_threads);
    K3_ASSIGN_OR_RETURN(Arrays arrays, allocate_arrays(bytes_per_array, fill_pool));
    info.bytes_per_measurement = 2 * bytes_per_array;
    // The first passes over freshly faulted memory ran slower here (22 GB/s,
    // then 38-40) than one per-measurement warm-up pass hides, so the read
    // range is streamed a few times before anything is recorded.
    {
      ThreadPool one(1);
      for (int i = 0; i < 2; ++i) measure_read(one, loops, arrays, 1, 1);
    }
    for (int t = 1; t <= max_threads; ++t) {
      ThreadPool pool(t);
      for (int streams : kStreamCounts)
        info.read.push_back({t, streams, measure_read(pool, loops, arrays, streams, options.repetitions)});
      info.copy.emplace_back(t, measure_copy(pool, loops, arrays, options.repetitions));
      info.triad.emplace_back(t, measure_triad(pool, loops, arrays, options.repetitions));
    }
  }

  // Each peak runs on one thread and on all of them. The all-thread average
  // is a lower bound on what one core can do (threads <= cores: each ran on
  // one; more threads than cores: they shared), so the per-core figure is the
  // larger of the two: on a busy machine the lone thread is often the one
  // sharing its core with someone else.
  ThreadPool one(1), all(max_threads);
  const double n = static_cast<double>(all.size());
  auto peak = [&](auto loop, double* total) {
    const double single = peak_ops_per_s(one, options.peak_seconds, options.peak_runs, loop);
    const double every = all.size() > 1 ? peak_ops_per_s(all, options.peak_seconds, options.peak_runs, loop) : single;
    if (total != nullptr) *total = every / 1e9;
    return std::max(single, every / n) / 1e9;
  };
  info.fp32_gflops_per_core = peak(loops.fma != nullptr ? loops.fma : scalar_fma_loop, &info.fp32_gflops_total);
  if (cpu_has_bf16()) info.bf16_gflops_per_core = peak(detail::dpbf16_loop_avx512, nullptr);
  if (cpu_has_amx()) info.amx_bf16_gflops_per_core = peak(detail::tdpbf16_loop_amx, nullptr);
  if (cpu_has_amx_int8()) info.amx_int8_gops_per_core = peak(detail::tdpbssd_loop_amx, nullptr);
  if (const Int8Loop loop = int8_dot().loop) info.int8_gops_per_core = peak(loop, nullptr);
  if (all.size() > 1) info.core_round_trip_ns = measure_round_trip_ns(all);
  return info;
}

StatusOr<SysInfo> measure_sysinfo(int max_threads) {
  MeasureOptions o;
  o.max_threads = max_threads;
  return measure_sysinfo(o);
}

StatusOr<SysInfo> measure_sysinfo(int max_threads, int64_t bytes_per_array) {
  MeasureOptions o;
  o.max_threads = max_threads;
  o.bytes_per_array = bytes_per_array;
  return measure_sysinfo(o);
}

std::string sysinfo_cache_path() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (const std::string d = env("K3_CACHE_DIR"); !d.empty()) return d + "/sysinfo.json";
  if (const std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/k3/sysinfo.json";
  if (const std::string d = env("HOME"); !d.empty()) return d + "/.cache/k3/sysinfo.json";
  return "";
}

StatusOr<SysInfo> load_or_measure_sysinfo(const MeasureOptions& options, bool refresh) {
  const int want_threads = options.max_threads > 0 ? options.max_threads : hardware_threads();
  const int64_t array_bytes = options.bytes_per_array != 0 ? options.bytes_per_array : default_bytes_per_array();
  const std::string path = sysinfo_cache_path();
  const std::string key = cache_key(cpu_model(), hardware_threads());
  nlohmann::json entries = path.empty() ? nlohmann::json::object() : read_cache_entries(path);
  if (!refresh) {
    const auto it = entries.find(key);
    if (it != entries.end()) {
      auto cached = SysInfo::from_json(*it);
      // Reuse only what answers this request: same machine (checked again
      // inside the entry), enough threads, arrays at least as large, and
      // every peak this CPU has (an entry written before a peak was added
      // lacks it).
      if (cached.ok() && cached->cpu == cpu_model() && cached->hardware_threads == hardware_threads() &&
          cached->max_measured_threads() >= want_threads &&
          cached->bytes_per_measurement >= 2 * (array_bytes / 4096 * 4096) &&
          (cached->amx_bf16_gflops_per_core.has_value() || !cpu_has_amx()) &&
          (cached->amx_int8_gops_per_core.has_value() || !cpu_has_amx_int8()) &&
          (cached->int8_gops_per_core.has_value() || int8_dot().loop == nullptr)) {
        cached->kernel_isa = std::string(kernels::isa_name(kernels::best_table().isa));
        return cached;
      }
    }
  }
  MeasureOptions o = options;
  o.max_threads = want_threads;
  o.bytes_per_array = array_bytes;  // resolved once, above
  K3_ASSIGN_OR_RETURN(SysInfo info, measure_sysinfo(o));
  if (!path.empty()) {
    // Keep other machines' entries (a home directory shared across hosts),
    // drop entries of other format versions and anything malformed.
    nlohmann::json keep = nlohmann::json::object();
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it.key() != key && SysInfo::from_json(it.value()).ok()) keep[it.key()] = it.value();
    keep[key] = info.to_json();
    Status s = write_cache(path, keep);
    if (!s.ok()) std::fprintf(stderr, "k3: warning: sysinfo cache not saved: %s\n", s.message().c_str());
  }
  return info;
}

struct ReadProbe::Impl {
  explicit Impl(int threads) : pool(threads), loops(loops_for_cpu()) {}
  ThreadPool pool;
  Loops loops;
  Arrays arrays;
};

ReadProbe::ReadProbe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReadProbe::~ReadProbe() = default;

StatusOr<std::unique_ptr<ReadProbe>> ReadProbe::create(int threads, int64_t bytes_per_array) {
  if (threads < 1) return invalid_argument("read probe: threads must be at least 1, got " + std::to_string(threads));
  if (bytes_per_array == 0) bytes_per_array = default_bytes_per_array();
  if (bytes_per_array < (int64_t{64} << 10))
    return invalid_argument("read probe: bytes_per_array must be at least 64 KiB, got " +
                            std::to_string(bytes_per_array));
  auto impl = std::make_unique<Impl>(threads);
  K3_ASSIGN_OR_RETURN(impl->arrays, allocate_arrays(bytes_per_array / 4096 * 4096, impl->pool));
  // Freshly faulted memory reads slowly for the first passes (measure_sysinfo).
  for (int i = 0; i < 2; ++i) measure_read(impl->pool, impl->loops, impl->arrays, 1, 1);
  return std::unique_ptr<ReadProbe>(new ReadProbe(std::move(impl)));
}

int ReadProbe::threads() const { return impl_->pool.size(); }

double ReadProbe::round_trip_ns() {
  return measure_round_trip_ns(impl_->pool);
}

double ReadProbe::measure(int reps) {
  double best = 0;
  for (int streams : kStreamCounts)
    best = std::max(best, measure_read(impl_->pool, impl_->loops, impl_->arrays, streams, std::max(1, reps)));
  return best;
}

struct PeakProbe::Impl {
  explicit Impl(int threads) : pool(threads), loops(loops_for_cpu()) {}
  ThreadPool pool;
  Loops loops;
};

PeakProbe::PeakProbe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeakProbe::~PeakProbe() = default;

StatusOr<std::unique_ptr<PeakProbe>> PeakProbe::create(int threads) {
  if (threads < 1) return invalid_argument("peak probe: threads must be at least 1, got " + std::to_string(threads));
  return std::unique_ptr<PeakProbe>(new PeakProbe(std::make_unique<Impl>(threads)));
}

int PeakProbe::threads() const {
  return impl_->pool.size();
}

double PeakProbe::round_trip_ns() {
  return measure_round_trip_ns(impl_->pool);
}

StatusOr<PeaksNow> PeakProbe::measure(double seconds, int runs) {
  if (runs < 1) return invalid_argument("peak probe: runs must be at least 1");
  if (!(seconds > 0) || seconds > 10) return invalid_argument("peak probe: seconds must be in (0, 10]");
  PeaksNow p;
  ThreadPool& pool = impl_->pool;
  p.fp32_gflops =
      peak_ops_per_s(pool, seconds, runs, impl_->loops.fma != nullptr ? impl_->loops.fma : scalar_fma_loop) / 1e9;
  if (cpu_has_bf16()) p.bf16_gflops = peak_ops_per_s(pool, seconds, runs, detail::dpbf16_loop_avx512) / 1e9;
  if (cpu_has_amx()) p.amx_bf16_gflops = peak_ops_per_s(pool, seconds, runs, detail::tdpbf16_loop_amx) / 1e9;
  if (const Int8Loop loop = int8_dot().loop) p.int8_gops = peak_ops_per_s(pool, seconds, runs, loop) / 1e9;
  p.round_trip_ns = measure_round_trip_ns(pool);  // the same threads, right after
  return p;
}

StatusOr<SysInfo> load_or_measure_sysinfo(int max_threads, bool refresh) {
  MeasureOptions o;
  o.max_threads = max_threads;
  return load_or_measure_sysinfo(o, refresh);
}

}  // namespace k3::profile
