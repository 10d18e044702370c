// CachedAttention: append this step's keys/values to the fixed-slot cache,
// then attend each query row over its own slot's positions 0..p (a long row
// in pieces, which a decode step of few rows spreads over the threads).
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
kernels::AttendStats attend(const kernels::KernelTable* kt, bool cached, const float* q, const float* k, const float* v,
                            int64_t len, int64_t hd, float scale, float* out) {
  return (cached ? kt->attend_cached : kt->attend)(q, k, v, len, hd, hd, scale, out);
}
kernels::AttendStats attend(const kernels::KernelTable* kt, bool cached, const float* q, const uint16_t* k,
                            const uint16_t* v, int64_t len, int64_t hd, float scale, float* out) {
  return (cached ? kt->attend_bf16_cached : kt->attend_bf16)(q, k, v, len, hd, hd, scale, out);
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

// A row of more than kAttendPiece positions is attended in pieces of
// consecutive positions, each by the kernel, and the pieces' outputs are
// merged as one softmax (PieceFold). The pieces depend on the row's length
// alone and are folded in order by one function, so a row's bits are the
// same whoever computed its pieces: a decode step can hand one row's pieces
// to different threads and still give the bits of the prefill chunk that
// attended the same row whole on one thread. k3-base's 5 heads went 3 and 2
// to two threads; in pieces, two-thread bf16 decode at context 2000 spent
// 9-13% less time in this op (Zen 3, docs/performance.md), at 1000 the same
// within noise (both threads share one path to memory there).
constexpr int64_t kAttendPiece = 256;
// At most this many pieces a row (longer rows take longer pieces), which
// bounds the workspace; and pieces only for hd up to kMaxPieceHd, the
// buffer a thread folds a piece through on its stack.
constexpr int64_t kMaxPieces = 16;
constexpr int64_t kMaxPieceHd = 512;
// Steps of fewer (token, head) rows than this whose count the threads do
// not divide hand out pieces instead of rows (a decode step); the rest
// hand out rows, each attended whole by one thread.
constexpr int64_t kMaxPieceRows = 16;

// The pieces of one row: a function of its length (and hd) only.
struct Pieces {
  int64_t len = 0;    // positions of the row
  int64_t count = 1;  // pieces
  int64_t size = 0;   // positions in each, the last one's up to this

  int64_t at(int64_t j) const { return j * size; }  // piece j's first position
  int64_t length(int64_t j) const { return std::min(size, len - at(j)); }
};

Pieces pieces_of(int64_t len, int64_t hd) {
  if (len <= kAttendPiece || hd > kMaxPieceHd) return {len, 1, len};
  const int64_t n = std::min((len + kAttendPiece - 1) / kAttendPiece, kMaxPieces);
  const int64_t size = ((len + n - 1) / n + 15) / 16 * 16;
  return {len, (len + size - 1) / size, size};
}

// The running merge of a row's pieces. Its steps are not inlined, so that
// every caller runs the same instructions (a contraction into FMAs chosen
// per call site would change the bits).
struct PieceFold {
  float max = 0.0f;  // the largest score so far
  float sum = 0.0f;  // sum of exp(score - max) so far

  // acc[hd] = o[hd] * s.sum: the first piece, unnormalised (o and acc may
  // be the same row).
  [[gnu::noinline]] void first(const float* o, kernels::AttendStats s, int64_t hd, float* acc) {
    max = s.max;
    sum = s.sum;
    for (int64_t i = 0; i < hd; ++i) acc[i] = o[i] * s.sum;
  }
  // The next piece: both sides rescaled to the larger max (factors <= 1). A
  // NaN max (a NaN score) fails the comparison, and its exp makes acc NaN.
  [[gnu::noinline]] void next(const float* o, kernels::AttendStats s, int64_t hd, float* acc) {
    const float m = s.max > max ? s.max : max;
    const float a = std::exp(max - m), b = s.sum * std::exp(s.max - m);
    for (int64_t i = 0; i < hd; ++i) acc[i] = acc[i] * a + o[i] * b;
    sum = sum * a + b;
    max = m;
  }
  [[gnu::noinline]] void finish(int64_t hd, float* acc) const {
    for (int64_t i = 0; i < hd; ++i) acc[i] /= sum;
  }
};

// Folds a row's `count` pieces into out[hd] in order. piece(j) returns
// piece j's output and stats, computing it or reading it back, which is
// the only difference between the two schedules.
template <class Piece>
void fold_row(int64_t count, int64_t hd, float* out, Piece&& piece) {
  PieceFold f;
  const auto [o0, s0] = piece(0);
  f.first(o0, s0, hd, out);
  for (int64_t j = 1; j < count; ++j) {
    const auto [o, s] = piece(j);
    f.next(o, s, hd, out);
  }
  f.finish(hd, out);
}

struct PieceOut {
  const float* out;
  kernels::AttendStats stats;
};

// One row whole on the calling thread: its pieces in order, each folded
// into out as soon as it is computed (the first one computed in out).
template <class T>
void attend_row(const kernels::KernelTable* kt, bool cached, const float* q, const T* k, const T* v, int64_t len,
                int64_t hd, float scale, float* out) {
  const Pieces p = pieces_of(len, hd);
  if (p.count == 1) {
    attend(kt, cached, q, k, v, len, hd, scale, out);
    return;
  }
  alignas(64) float o[kMaxPieceHd];
  fold_row(p.count, hd, out, [&](int64_t j) {
    float* dst = j == 0 ? out : o;
    return PieceOut{dst, attend(kt, cached, q, k + p.at(j) * hd, v + p.at(j) * hd, p.length(j), hd, scale, dst)};
  });
}

// The workspace of the piece schedule: how many pieces the last call
// handed out (0: rows) and each piece's stats, then from
// kPieceOutputsOffset each piece's output.
struct PieceSpace {
  int64_t taken;
  kernels::AttendStats stats[kMaxPieceRows * kMaxPieces];
};
constexpr uint64_t kPieceOutputsOffset = (sizeof(PieceSpace) + 63) / 64 * 64;

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
  const int64_t n = rows * hq;
  auto* space = static_cast<PieceSpace*>(c.workspace);
  // A row whose positions a later token of the same slot read just before
  // (rows go last first) finds them in cache, as a prefill chunk's rows do:
  // prefetch hints only cost there. One thread, k3-base int8 prefill of 128
  // tokens (k3 profile --phase prefill -t 1, 3 rounds in turn),
  // CachedAttention: 14.9 -> 10.3 ms without this op's next-row hints, then
  // 10.5 -> 8.4 ms with the kernel's own left out (attend_cached).
  auto in_cache = [&](int64_t tok) { return tok + 1 < rows && slot[tok + 1] == slot[tok]; };

  // Pieces: a step of few rows whose count the threads do not divide (one
  // token's 5 heads on 2 threads) hands out each row's pieces in order,
  // then folds every split row's pieces on the calling thread.
  const int threads = c.pool->size();
  if (space != nullptr && threads > 1 && n < kMaxPieceRows && n % threads != 0) {
    int64_t first[kMaxPieceRows + 1];  // row i's pieces are items first[i] .. first[i + 1]
    first[0] = 0;
    for (int64_t i = 0; i < n; ++i) first[i + 1] = first[i] + pieces_of(pos[i / hq] + 1, hd).count;
    const int64_t items = first[n];
    if (items > n) {
      space->taken = items;
      float* outs = reinterpret_cast<float*>(static_cast<uint8_t*>(c.workspace) + kPieceOutputsOffset);
      c.pool->parallel_for(items, 1, [&](int64_t b, int64_t e) {
        int64_t i = 0;
        for (int64_t it = b; it < e; ++it) {
          while (first[i + 1] <= it) ++i;
          const int64_t t = i / hq, g = i % hq / group, j = it - first[i];
          const Pieces p = pieces_of(pos[t] + 1, hd);
          // A row of one piece is attended straight into the output.
          float* o = p.count == 1 ? c.out[0].f32() + i * hd : outs + it * hd;
          space->stats[it] = attend(c.kt, in_cache(t), c.in[0].f32() + i * hd, row(kc, slot[t], g) + p.at(j) * hd,
                                    row(vc, slot[t], g) + p.at(j) * hd, p.length(j), hd, scale, o);
        }
      });
      for (int64_t i = 0; i < n; ++i)
        if (first[i + 1] - first[i] > 1)
          fold_row(first[i + 1] - first[i], hd, c.out[0].f32() + i * hd, [&](int64_t j) {
            return PieceOut{outs + (first[i] + j) * hd, space->stats[first[i] + j]};
          });
      return;
    }
  }
  if (space != nullptr) space->taken = 0;

  // Rows (token, head) last first: in a prefill chunk a later token attends
  // more positions, so the threads claim the longest rows first and the
  // short ones even out the end (a thread that took the first quarter of
  // the rows in order finished long before the one with the last).
  c.pool->parallel_for(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = n - 1 - r;
      const int64_t t = i / hq, h = i % hq, g = h / group;
      // This chunk's next row, (token, head) i - 1.
      const int64_t t1 = (i - 1) / hq, g1 = (i - 1) % hq / group;
      if (r + 1 < e && !in_cache(t1)) {
        const int64_t bytes = (pos[t1] + 1) * hd * static_cast<int64_t>(sizeof(T));
        prefetch_start(row(kc, slot[t1], g1), bytes);
        prefetch_start(row(vc, slot[t1], g1), bytes);
      }
      attend_row(c.kt, in_cache(t), c.in[0].f32() + i * hd, row(kc, slot[t], g), row(vc, slot[t], g), pos[t] + 1, hd,
                 scale, c.out[0].f32() + i * hd);
    }
  });
}

}  // namespace

uint64_t attention_workspace_bytes(int64_t max_rows, int64_t n_heads, int64_t head_dim) {
  if (head_dim > kMaxPieceHd) return sizeof(PieceSpace);  // pieces_of never splits a row
  const auto rows = static_cast<uint64_t>(std::min(max_rows * n_heads, kMaxPieceRows - 1));
  return kPieceOutputsOffset + rows * kMaxPieces * static_cast<uint64_t>(head_dim) * 4;
}

int64_t attention_pieces_taken(const OpCall& c) {
  return c.workspace != nullptr ? static_cast<const PieceSpace*>(c.workspace)->taken : 0;
}

void run_CachedAttention(const OpCall& c) {
  if (c.in[5].value->dtype == ir::DType::kBF16)
    run_cached_attention<uint16_t>(c);
  else
    run_cached_attention<float>(c);
}

}  // namespace k3::runtime
