// AVX2/FMA measurement loops for sysinfo: streaming read/copy/triad and the
// register-resident fp32 FMA and int8 product peaks, for CPUs without
// AVX-512 or without its VNNI (built with
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

// AVX2's exact int8 product, the int8 kernels' step (kernels/x86/avx2.cc):
// 32 signed byte products summed into 8 int32 lanes by vpsignb, vpmaddubsw
// (the activations' magnitudes against the weights carrying their signs),
// vpmaddwd by ones and vpaddd, 64 operations. 4 independent chains, one per
// pair of 2 weight and 2 activation vectors, so no two share a product; the
// weights pass through an empty asm every iteration, as loads would give
// them, so the compiler cannot hoist the products out of the loop. Each
// chain waits only on its vpaddd; with 6 chains (or an array of them) GCC 12
// spilled accumulators to the stack.
int32_t maddubs_loop_avx2(int64_t iters, double* ops) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i a0 = _mm256_set1_epi8(3), a1 = _mm256_set1_epi8(-5);
  const __m256i m0 = _mm256_sign_epi8(a0, a0), m1 = _mm256_sign_epi8(a1, a1);
  __m256i w0 = _mm256_set1_epi8(-2), w1 = _mm256_set1_epi8(4);
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2), c3 = _mm256_set1_epi32(3);
  auto step = [&](__m256i c, __m256i m, __m256i a, __m256i w) {
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(w, a)), ones));
  };
  for (int64_t i = 0; i < iters; ++i) {
    asm volatile("" : "+x"(w0), "+x"(w1));
    c0 = step(c0, m0, a0, w0);
    c1 = step(c1, m0, a0, w1);
    c2 = step(c2, m1, a1, w0);
    c3 = step(c3, m1, a1, w1);
  }
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  *ops = static_cast<double>(iters) * 4 * 64;
  int32_t sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

}  // namespace k3::profile::detail
