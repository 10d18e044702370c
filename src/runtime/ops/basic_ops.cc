// Optimized implementations of the row-wise ops and Linear.
//
// Linear is the bulk of decode time: its output columns (weight rows) are
// split across threads so each thread streams a disjoint part of W once.
#include <algorithm>
#include <cstring>

#include "runtime/ops/fast_ops.h"
#include "runtime/ops/prepared_rows.h"

namespace k3::runtime {
namespace {

// f(begin, end) over rows of `width` values each, split across the threads
// only when there are kParallelValues or more (op_call.h), one share per
// thread as the prefill Linear splits its rows (run_Linear).
template <typename F>
void for_rows(const OpCall& c, int64_t rows, int64_t width, F&& f) {
  if (rows * width < kParallelValues) {
    f(0, rows);
  } else {
    c.pool->parallel_for_even(rows, 1, f);
  }
}

// Clamps n values in place to [-clip, clip]; clip 0 means none.
void clip_in_place(float* y, int64_t n, float clip) {
  if (clip > 0.0f)
    for (int64_t i = 0; i < n; ++i) y[i] = std::clamp(y[i], -clip, clip);
}

// Rows at least this many: a Linear splits its rows across the threads, not
// its columns (run_Linear). Prefill chunks (128 tokens by default) are
// above; batched decode (a row per sequence) is below. Chosen, not tuned.
constexpr int64_t kRowSplitMinRows = 64;

// A Linear's epilogue on columns [lo, hi) of m rows of y (width apart),
// output columns o + lo.. of the weight: (y + bias) * scale, clamped, then
// plus the residual (same rows and width as y), as the unfused ops did.
void linear_epilogue(float* y, int64_t m, int64_t width, int64_t lo, int64_t hi, int64_t o, const float* bias,
                     float scale, float clip, const float* residual, const kernels::KernelTable* kt) {
  const bool affine = bias != nullptr || scale != 1.0f || clip > 0.0f;
  for (int64_t r = 0; affine && r < m; ++r) {
    float* yr = y + r * width;
    for (int64_t j = lo; j < hi; ++j) yr[j] = (yr[j] + (bias ? bias[o + j] : 0.0f)) * scale;
    clip_in_place(yr + lo, hi - lo, clip);
  }
  for (int64_t r = 0; residual != nullptr && r < m; ++r)
    kt->add(y + r * width + lo, residual + r * width + lo, hi - lo, y + r * width + lo);
}

}  // namespace

void run_Embedding(const OpCall& c) {
  // table [V, D], ids [T] -> [T, D]
  const int64_t d = c.out[0].cols();
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  for (int64_t t = 0; t < c.out[0].rows; ++t) {
    float* y = c.out[0].f32() + t * d;
    std::memcpy(y, c.in[0].f32() + static_cast<int64_t>(c.in[1].i32()[t]) * d, static_cast<size_t>(d) * 4);
    if (scale != 1.0f)
      for (int64_t i = 0; i < d; ++i) y[i] *= scale;
  }
}

void run_LayerNorm(const OpCall& c) {
  const int64_t d = c.in[0].cols();
  const float eps = static_cast<float>(c.node->attr_float("eps"));
  for_rows(c, c.in[0].rows, d, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      c.kt->layernorm(c.in[0].f32() + t * d, c.in[1].f32(), c.in[2].f32(), eps, d, c.out[0].f32() + t * d);
  });
}

void run_RmsNorm(const OpCall& c) {
  // Rows of `width` values, normalized in groups of d (d = width unless the
  // group attr asks for per-head norms): a [T, width] input is T*width/d rows.
  const int64_t width = c.in[0].cols(), d = c.node->attr_int("group", width);
  const float eps = static_cast<float>(c.node->attr_float("eps"));
  const float clip = static_cast<float>(c.node->attr_float("clip", 0.0));
  for_rows(c, c.in[0].rows * (width / d), d, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      c.kt->rmsnorm(c.in[0].f32() + t * d, c.in[1].f32(), eps, d, c.out[0].f32() + t * d);
      clip_in_place(c.out[0].f32() + t * d, d, clip);
    }
  });
}

void gemm_prepared_here(const kernels::PreparedGemm& pg, int64_t M, int64_t n0, int64_t n1, int64_t K, const ActRows& x,
                        const uint8_t* w, float* C, int64_t ldc) {
  if (x.prepared != nullptr) {
    pg.gemm(M, n0, n1, K, x.prepared, w, 0, C, ldc);
    return;
  }
  constexpr int64_t kBytes = 131072;
  alignas(64) uint8_t buf[kBytes];
  const int64_t rb = pg.row_bytes(K);
  const int64_t chunk = rb == 0 ? M : kBytes / rb;
  // K beyond the kernels' maximum is refused by the shape rules.
  if (chunk <= 0) __builtin_trap();
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t rows = std::min(chunk, M - m0);
    pg.prepare(rows, K, x.a + m0 * x.lda, x.lda, buf);
    pg.gemm(rows, n0, n1, K, buf, w, 0, C + m0 * ldc, ldc);
  }
}

void run_Linear(const OpCall& c) {
  // x [M, K] . W[N, K]^T -> [M, N]; threads split N in multiples of 16 rows.
  // With attr splits the N columns go to several outputs, [M, N_i] each,
  // output i holding columns o_i .. o_i + N_i; a thread's chunk may cover
  // parts of two.
  const int64_t m = c.in[0].rows, k = c.in[0].cols(), n = c.in[1].dim(0);
  const float* x = c.in[0].f32();
  const auto n_out = static_cast<int64_t>(c.node->outputs.size());
  // Optional bias, output scale and clamp, applied to each thread's columns
  // while they are still in cache.
  const float* bias = ir::linear_has_bias(*c.node) ? c.in[2].f32() : nullptr;
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  const float clip = static_cast<float>(c.node->attr_float("clip", 0.0));
  // The residual (fuse-residual-add; one output only), added after the rest.
  const int res = ir::residual_input(*c.node);
  const float* residual = res >= 0 ? c.in[res].f32() : nullptr;
  const ir::DType dt = c.in[1].value->dtype;
  // Prefill: each thread takes a share of the rows (tokens) and all the
  // columns, rounding its own rows for the int8 / bf16 dot kernels. The
  // rows it reads and writes are then the ones the ops before and after
  // (norms, rope, the MoE's combine) give the same thread; each thread
  // streams the whole weight, which prefill's many rows amortize. Same
  // bits as the column split (a product's element does not depend on M or
  // on its column range).
  if (m >= kRowSplitMinRows && c.pool->size() > 1) {
    const kernels::PreparedGemm* pg = prepared_gemm(c.kt, dt);
    c.pool->parallel_for_even(m, 4, [&](int64_t b, int64_t e) {
      const ActRows xa = prepare_rows_here(pg, b, e, k, x, k, static_cast<uint8_t*>(c.workspace));
      int64_t o = 0;  // first column of output i
      for (int64_t i = 0; i < n_out; o += c.out[i].cols(), ++i) {
        const int64_t width = c.out[i].cols();
        float* y = c.out[i].f32() + b * width;
        gemm_weight(c.kt, e - b, 0, width, k, xa, c.in[1], y, width, o);
        linear_epilogue(y, e - b, width, 0, width, o, bias, scale, clip, residual ? residual + b * width : nullptr,
                        c.kt);
      }
    });
    return;
  }
  // Decode: threads split the columns. int8 and bf16 dot kernels round x
  // first: once here, not per thread.
  const ActRows xa = prepare_rows(c, dt, m, k, x, k, static_cast<uint8_t*>(c.workspace));
  c.pool->parallel_for(n, 16, [&](int64_t b, int64_t e) {
    int64_t o = 0;  // first column of output i
    for (int64_t i = 0; i < n_out && o < e; o += c.out[i].cols(), ++i) {
      const int64_t width = c.out[i].cols();
      const int64_t lo = std::max(b, o) - o, hi = std::min(e, o + width) - o;  // this chunk's columns of output i
      if (lo >= hi) continue;
      float* y = c.out[i].f32();
      gemm_weight(c.kt, m, lo, hi, k, xa, c.in[1], y, width, o);
      linear_epilogue(y, m, width, lo, hi, o, bias, scale, clip, residual, c.kt);
    }
  });
}

void run_Add(const OpCall& c) {
  const int64_t n = c.out[0].rows * c.out[0].cols();
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  if (scale == 1.0f) {
    c.kt->add(c.in[0].f32(), c.in[1].f32(), n, c.out[0].f32());
    return;
  }
  const float* a = c.in[0].f32();
  const float* b = c.in[1].f32();
  for (int64_t i = 0; i < n; ++i) c.out[0].f32()[i] = a[i] + scale * b[i];
}

void run_Rope(const OpCall& c) {
  // x [T, H*hd], rotate-half per head with the precomputed tables [L, hd/2].
  const int64_t width = c.in[0].cols(), hd = c.node->attr_int("head_dim"), half = hd / 2;
  for_rows(c, c.in[0].rows, width, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t p = c.in[1].i32()[t];
      const float* cs = c.in[2].f32() + p * half;
      const float* sn = c.in[3].f32() + p * half;
      for (int64_t h = 0; h < width / hd; ++h) {
        const float* u = c.in[0].f32() + t * width + h * hd;
        float* o = c.out[0].f32() + t * width + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = u[i], hi = u[i + half];
          o[i] = lo * cs[i] - hi * sn[i];
          o[i + half] = hi * cs[i] + lo * sn[i];
        }
      }
    }
  });
}

void run_GatherRows(const OpCall& c) {
  const int64_t d = c.out[0].cols();
  for (int64_t r = 0; r < c.out[0].rows; ++r)
    std::memcpy(c.out[0].f32() + r * d, c.in[0].f32() + static_cast<int64_t>(c.in[1].i32()[r]) * d,
                static_cast<size_t>(d) * 4);
}

}  // namespace k3::runtime
