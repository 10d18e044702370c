// CachedAttention: append this step's keys/values to the fixed-slot cache,
// then attend each query row over its own slot's positions 0..p.
//
// Writing every row first and reading up to each row's own position makes a
// prefill chunk causal with no mask: a row never reads positions past its own.
// The cache is f32 or bf16 (k3 compile --kv-dtype): bf16 rows are rounded to
// nearest even as they are written and widened exactly as they are read.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/ops/fast_ops.h"
#include "util/half.h"

namespace k3::runtime {
namespace {

// One cache row from hd f32 values.
void write_row(const float* src, int64_t hd, float* dst) {
  std::memcpy(dst, src, static_cast<size_t>(hd) * 4);
}
void write_row(const float* src, int64_t hd, uint16_t* dst) {
  for (int64_t i = 0; i < hd; ++i) dst[i] = f32_to_bf16(src[i]);
}

// cached: the rows are in cache (kernels.h, attend_cached); the same bits.
void attend(const kernels::KernelTable* kt, bool cached, const float* q, const float* k, const float* v, int64_t len,
            int64_t hd, float scale, float* out) {
  (cached ? kt->attend_cached : kt->attend)(q, k, v, len, hd, hd, scale, out);
}
void attend(const kernels::KernelTable* kt, bool cached, const float* q, const uint16_t* k, const uint16_t* v,
            int64_t len, int64_t hd, float scale, float* out) {
  (cached ? kt->attend_bf16_cached : kt->attend_bf16)(q, k, v, len, hd, hd, scale, out);
}

// Bytes at the start of the next row's K and of its V that a thread
// prefetches into L2 before attending its current row. The kernel prefetches
// 16 positions ahead within a row, so each call began with a cold block;
// warmed during the row before, k3-base int8 batch-8 decode at context 128
// spent 2.2-2.7 ms a step in CachedAttention instead of 2.6-3.1 (k3 profile,
// 7 rounds in turn, Zen 4). At 64 positions (16 KiB f32, hd 64) the gain is
// as at 128; 16 gave less, and L1 (locality 3) was slower than 0. Context
// 1024 measured the same either way: the cold block is 1/64 of a row there.
constexpr int64_t kNextRowPrefetchBytes = 16 * 1024;

// Prefetches the first min(bytes, kNextRowPrefetchBytes) of p into L2, one
// hint per 64-byte line (__builtin_prefetch: no intrinsics in the runtime).
void prefetch_start(const void* p, int64_t bytes) {
  const char* b = static_cast<const char*>(p);
  const int64_t n = std::min(bytes, kNextRowPrefetchBytes);
  for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(b + o, 0, 2);
}

template <class T>
void run_cached_attention(const OpCall& c) {
  // q [T, Hq*hd], k/v [T, Hkv*hd], positions/slots [T], caches [S, Hkv, L, hd]
  const int64_t hq = c.node->attr_int("n_heads"), hkv = c.node->attr_int("n_kv_heads"), hd = c.node->attr_int("head_dim");
  const int64_t rows = c.in[0].rows, max_seq = c.in[5].dim(2), group = hq / hkv;
  const int32_t* pos = c.in[3].i32();
  const int32_t* slot = c.in[4].i32();
  T* kc = static_cast<T*>(c.in[5].data);
  T* vc = static_cast<T*>(c.in[6].data);
  auto row = [&](T* cache, int64_t s, int64_t h) { return cache + (s * hkv + h) * max_seq * hd; };

  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < hkv; ++h) {
      write_row(c.in[1].f32() + (t * hkv + h) * hd, hd, row(kc, slot[t], h) + pos[t] * hd);
      write_row(c.in[2].f32() + (t * hkv + h) * hd, hd, row(vc, slot[t], h) + pos[t] * hd);
    }

  // The scale attr (e.g. Granite's attention_multiplier) or 1/sqrt(hd).
  const double scale_attr = c.node->attr_float("scale", 0.0);
  const float scale = scale_attr > 0.0 ? static_cast<float>(scale_attr) : 1.0f / std::sqrt(static_cast<float>(hd));
  // Rows (token, head) last first: in a prefill chunk a later token attends
  // more positions, so the threads claim the longest rows first and the
  // short ones even out the end (a thread that took the first quarter of
  // the rows in order finished long before the one with the last).
  const int64_t n = rows * hq;
  c.pool->parallel_for(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = n - 1 - r;
      const int64_t t = i / hq, h = i % hq, g = h / group;
      // A row whose positions a later token of the same slot read just
      // before (rows go last first) finds them in cache, as a prefill
      // chunk's rows do: prefetch hints only cost there. One thread, k3-base
      // int8 prefill of 128 tokens (k3 profile --phase prefill -t 1, 3
      // rounds in turn), CachedAttention: 14.9 -> 10.3 ms without this op's
      // next-row hints, then 10.5 -> 8.4 ms with the kernel's own left out
      // (attend_cached).
      auto in_cache = [&](int64_t tok) { return tok + 1 < rows && slot[tok + 1] == slot[tok]; };
      // This chunk's next row, (token, head) i - 1.
      const int64_t t1 = (i - 1) / hq, g1 = (i - 1) % hq / group;
      if (r + 1 < e && !in_cache(t1)) {
        const int64_t bytes = (pos[t1] + 1) * hd * static_cast<int64_t>(sizeof(T));
        prefetch_start(row(kc, slot[t1], g1), bytes);
        prefetch_start(row(vc, slot[t1], g1), bytes);
      }
      attend(c.kt, in_cache(t), c.in[0].f32() + i * hd, row(kc, slot[t], g), row(vc, slot[t], g), pos[t] + 1, hd, scale,
             c.out[0].f32() + i * hd);
    }
  });
}

}  // namespace

void run_CachedAttention(const OpCall& c) {
  if (c.in[5].value->dtype == ir::DType::kBF16)
    run_cached_attention<uint16_t>(c);
  else
    run_cached_attention<float>(c);
}

}  // namespace k3::runtime
