// The overlap study's loops (bench/overlap_study.cc), in their own
// translation unit because they are compiled with the AVX-512 flags; the
// driver checks the CPU before calling them.
#include "overlap_study.h"

#include <immintrin.h>

namespace k3::bench {
namespace {

// One pass over `bytes` of each of S streams (stream s at b + s * spacing),
// a 64-byte line of every stream per step, C FMAs per line into 16
// independent sums, so the loop's compute per byte is fixed by C.
template <int S, int C>
void pass(const char* b, int64_t spacing, int64_t bytes, __m512 (&acc)[16]) {
  const __m512 x = _mm512_set1_ps(1.0001f);
  for (int64_t l = 0; l < bytes; l += 64) {
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      const __m512 v = _mm512_loadu_ps(reinterpret_cast<const float*>(b + s * spacing + l));
      if constexpr (C == 0) acc[s] = _mm512_add_ps(acc[s], v);
#pragma GCC unroll 16
      for (int k = 0; k < C; ++k) acc[(s * C + k) % 16] = _mm512_fmadd_ps(v, x, acc[(s * C + k) % 16]);
    }
  }
}

template <int S, int C>
float run(const char* b, int64_t spacing, int64_t stream_bytes, int64_t chunk, int passes) {
  __m512 acc[16];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (int64_t c = 0; c + chunk <= stream_bytes; c += chunk)
    for (int p = 0; p < passes; ++p) pass<S, C>(b + c, spacing, chunk, acc);
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  // Lane by lane (GCC 12 warns inside _mm512_reduce_add_ps).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float v : lanes) total += v;
  return total;
}

}  // namespace

OverlapFn find_overlap_loop(const OverlapLoop& o) {
  struct Built {
    int streams, fmas;
    OverlapFn fn;
  };
  static constexpr Built kBuilt[] = {{1, 0, run<1, 0>},   {1, 4, run<1, 4>}, {1, 8, run<1, 8>}, {1, 12, run<1, 12>},
                                     {1, 16, run<1, 16>}, {4, 4, run<4, 4>}, {4, 8, run<4, 8>}};
  for (const Built& l : kBuilt)
    if (l.streams == o.streams && l.fmas == o.fmas) return l.fn;
  return nullptr;
}

}  // namespace k3::bench
