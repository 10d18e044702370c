// AVX2/FMA measurement loops for sysinfo: streaming read/copy/triad and the
// register-resident fp32 FMA peak, for CPUs without AVX-512 (built with
// K3_AVX2_FLAGS; sysinfo.cc checks CPUID before calling).
#include <immintrin.h>

#include "profile/sysinfo.h"

namespace k3::profile::detail {
namespace {

// One 32-byte vector from each of S streams in turn, U per stream per
// iteration, so each iteration has at least eight independent loads (four
// cache lines) in flight whatever S is.
template <int S>
uint64_t read_streams(const void* const* ptrs, int64_t n_bytes) {
  constexpr int kU = S >= 8 ? 1 : 8 / S;
  const char* p[S];
  for (int s = 0; s < S; ++s) p[s] = static_cast<const char*>(ptrs[s]);
  __m256i acc[S * kU];
  for (int k = 0; k < S * kU; ++k) acc[k] = _mm256_setzero_si256();
  for (int64_t i = 0; i < n_bytes; i += 32 * kU)
    for (int s = 0; s < S; ++s)
      for (int u = 0; u < kU; ++u)
        acc[s * kU + u] = _mm256_add_epi64(acc[s * kU + u], _mm256_load_si256(reinterpret_cast<const __m256i*>(p[s] + i + 32 * u)));
  __m256i total = acc[0];
  for (int k = 1; k < S * kU; ++k) total = _mm256_add_epi64(total, acc[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace

uint64_t read_streams_avx2(const void* const* ptrs, int streams, int64_t n_bytes) {
  switch (streams) {
    case 1:
      return read_streams<1>(ptrs, n_bytes);
    case 2:
      return read_streams<2>(ptrs, n_bytes);
    case 4:
      return read_streams<4>(ptrs, n_bytes);
    default:
      return read_streams<8>(ptrs, n_bytes);
  }
}

// Ordinary (write-allocate) stores, as the runtime's kernels use.
void copy_avx2(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 32)
    for (int u = 0; u < 4; ++u) _mm256_store_ps(dst + i + 8 * u, _mm256_load_ps(src + i + 8 * u));
}

void triad_avx2(float* a, const float* b, const float* c, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  for (int64_t i = 0; i < n; i += 32)
    for (int u = 0; u < 4; ++u)
      _mm256_store_ps(a + i + 8 * u, _mm256_fmadd_ps(vs, _mm256_load_ps(c + i + 8 * u), _mm256_load_ps(b + i + 8 * u)));
}

// 12 independent accumulators cover FMA latency (4-5 cycles) times two pipes
// and, with the two constants, stay within the 16 ymm registers.
float fma_loop_avx2(int64_t iters, double* ops) {
  constexpr int kAcc = 12;
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  __m256 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  __m256 total = acc[0];
  for (int k = 1; k < kAcc; ++k) total = _mm256_add_ps(total, acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  *ops = static_cast<double>(iters) * kAcc * 8 * 2;
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace k3::profile::detail
