// AVX-512 measurement loops for sysinfo: streaming read/copy/triad and the
// register-resident fp32 FMA, bf16 (vdpbf16ps) and int8 (vpdpbusd) peaks.
//
// This file is built with K3_AVX512_FLAGS (AVX512F/BW/DQ/VL); the BF16 and
// VNNI loops get their extra instruction sets from function attributes only,
// so nothing else here can pick them up on a CPU that lacks them. Callers in
// sysinfo.cc check CPUID before calling anything in this file.
#include <immintrin.h>

#include <cstring>

#include "profile/sysinfo.h"

namespace k3::profile::detail {
namespace {

// Horizontal sums through memory: GCC 12's _mm512_reduce_add_* trip a false
// -Wuninitialized inside its own headers.
template <typename T, typename V>
T sum_lanes(V v) {
  alignas(64) T lanes[64 / sizeof(T)];
  std::memcpy(lanes, &v, 64);
  T sum = 0;
  for (T x : lanes) sum += x;
  return sum;
}

// One 64-byte vector from each of S streams in turn, U vectors per stream per
// iteration, so every iteration has at least four independent loads in flight
// (and the integer adds, 1-cycle latency, never limit a memory-bound loop).
template <int S>
uint64_t read_streams(const void* const* ptrs, int64_t n_bytes) {
  constexpr int kU = S >= 4 ? 1 : 4 / S;
  const char* p[S];
  for (int s = 0; s < S; ++s) p[s] = static_cast<const char*>(ptrs[s]);
  __m512i acc[S * kU];
  for (int k = 0; k < S * kU; ++k) acc[k] = _mm512_setzero_si512();
  for (int64_t i = 0; i < n_bytes; i += 64 * kU)
    for (int s = 0; s < S; ++s)
      for (int u = 0; u < kU; ++u)
        acc[s * kU + u] = _mm512_add_epi64(acc[s * kU + u], _mm512_load_si512(p[s] + i + 64 * u));
  __m512i total = acc[0];
  for (int k = 1; k < S * kU; ++k) total = _mm512_add_epi64(total, acc[k]);
  return sum_lanes<uint64_t>(total);
}

}  // namespace

uint64_t read_streams_avx512(const void* const* ptrs, int streams, int64_t n_bytes) {
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

// Ordinary (write-allocate) stores, as the runtime's kernels use; STREAM's
// byte count does not include the read-for-ownership this causes.
void copy_avx512(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 64)
    for (int u = 0; u < 4; ++u) _mm512_store_ps(dst + i + 16 * u, _mm512_load_ps(src + i + 16 * u));
}

void triad_avx512(float* a, const float* b, const float* c, float s, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 64)
    for (int u = 0; u < 4; ++u)
      _mm512_store_ps(a + i + 16 * u, _mm512_fmadd_ps(vs, _mm512_load_ps(c + i + 16 * u), _mm512_load_ps(b + i + 16 * u)));
}

// 16 independent accumulators: FMA latency (4-5 cycles) times two FMA pipes
// needs at least 10 in flight; 16 leaves slack and fits the 32 registers.
// acc = acc * a + b with a < 1 converges, so no overflow or denormals.
float fma_loop_avx512(int64_t iters, double* ops) {
  constexpr int kAcc = 16;
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  __m512 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  __m512 total = acc[0];
  for (int k = 1; k < kAcc; ++k) total = _mm512_add_ps(total, acc[k]);
  *ops = static_cast<double>(iters) * kAcc * 16 * 2;
  return sum_lanes<float>(total);
}

// vdpbf16ps: 16 lanes x 2 bf16 products each = 32 multiply-adds = 64 flops.
// Its latency is about 6 cycles on current cores, hence 16 accumulators.
__attribute__((target("avx512bf16"))) float dpbf16_loop_avx512(int64_t iters, double* ops) {
  constexpr int kAcc = 16;
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.25f), _mm512_set1_ps(0.25f));
  __m512 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  __m512 total = acc[0];
  for (int k = 1; k < kAcc; ++k) total = _mm512_add_ps(total, acc[k]);
  *ops = static_cast<double>(iters) * kAcc * 64;
  return sum_lanes<float>(total);
}

// vpdpbusd: 16 lanes x 4 u8*s8 products = 64 multiply-adds = 128 ops. The
// int32 accumulators may wrap; that is harmless here.
__attribute__((target("avx512vnni"))) int32_t dpbusd_loop_avx512(int64_t iters, double* ops) {
  constexpr int kAcc = 16;
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  __m512i acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
  __m512i total = acc[0];
  for (int k = 1; k < kAcc; ++k) total = _mm512_add_epi32(total, acc[k]);
  *ops = static_cast<double>(iters) * kAcc * 128;
  return static_cast<int32_t>(sum_lanes<uint32_t>(total));
}

}  // namespace k3::profile::detail
