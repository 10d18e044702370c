// Scalar reference kernels: the oracle every SIMD table is tested against,
// and the fallback table on CPUs without AVX2. Written for obviousness, not
// speed: plain loops, float arithmetic (double only for the norms' long
// sums), one element at a time.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/kernels.h"
#include "kernels/tiles_via_rows.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/quant.h"

namespace k3::kernels {

static_assert(kQ8MaxK == ir::kQ8MaxCols, "the shape rules and the int8 kernels must agree on the longest q8 row");
static_assert(kQ8GroupBytes == ir::kQ8GroupBytes, "the int8 kernels must read the kQ8 row groups util/quant.h writes");
static_assert(kBf16DotMaxK == ir::kBF16DotMaxCols,
              "the shape rules and the bf16 dot-product kernels must agree on the longest bf16dot row");

namespace {

// C[m, n] = sum_k A[m, k] * W[n, k] for m < M, n0 <= n < n1.
// A: [M, K] (lda), W: [N, K] (ldw), C: [M, N] (ldc). Each element is one
// sequential float sum over k, so the result never depends on M or [n0, n1).
void gemm_nt(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W, int64_t ldw,
             float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += A[m * lda + k] * W[n * ldw + k];
      C[m * ldc + n] = acc;
    }
  }
}

// gemm_nt with W in bf16 (uint16_t bits): each weight widened exactly to
// float, then the same sequential sum.
void gemm_nt_bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                  int64_t ldw, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += A[m * lda + k] * bf16_to_f32(W[n * ldw + k]);
      C[m * ldc + n] = acc;
    }
  }
}

// gemm_nt_bf16 with each activation rounded to bf16 first (the products are
// exact), then the same sequential sum.
void gemm_nt_bf16dot(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                     int64_t ldw, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += bf16_to_f32(f32_to_bf16(A[m * lda + k])) * bf16_to_f32(W[n * ldw + k]);
      C[m * ldc + n] = acc;
    }
  }
}

// gemm_nt with W in a panel layout (kernels.h, util/panel.h): each element
// one std::fma chain in k order, which is what the SIMD lanes compute.
template <class WT>
void gemm_nt_panels(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const WT* W, float* C,
                    int64_t ldc) {
  constexpr bool kBf16 = sizeof(WT) == 2;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const WT w = W[panel_index(n, k, K, kBf16)];
        float wf;
        if constexpr (kBf16)
          wf = bf16_to_f32(w);
        else
          wf = w;
        acc = std::fma(A[m * lda + k], wf, acc);
      }
      C[m * ldc + n] = acc;
    }
  }
}
void gemm_nt_p16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W, float* C,
                 int64_t ldc, ReadNext next) {
  (void)next;
  gemm_nt_panels(M, n0, n1, K, A, lda, W, C, ldc);
}
void gemm_nt_bf16p16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                     float* C, int64_t ldc, ReadNext next) {
  (void)next;
  gemm_nt_panels(M, n0, n1, K, A, lda, W, C, ldc);
}

// gemm_nt with W in the int8 block format (kernels.h, util/quant.h):
// activations rounded to int8 per block of 32 exactly as the SIMD tables do,
// integer block dot products, scaled and summed in f32 block by block.
// Prepared rows (kernels.h, PreparedGemm): the K int8 values in natural
// order, then the K / 32 f32 block scales.
int64_t q8_prepared_row_bytes(int64_t K) {
  return K + K / ir::kQ8Block * 4;
}
// Columns [k0, k1) of M prepared rows (prepare_cols; blocks of 32 are
// rounded on their own), the whole rows with k0 0, k1 K (prepare).
void prepare_q8_cols(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P) {
  const int64_t rb = q8_prepared_row_bytes(K);
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* row = P + m * rb;
    quantize_a8_row(A + m * lda + k0, k1 - k0, reinterpret_cast<int8_t*>(row + k0),
                    reinterpret_cast<float*>(row + K) + k0 / ir::kQ8Block);
  }
}
void prepare_q8(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_q8_cols(M, K, 0, K, A, lda, P);
}
void gemm_q8_prepared(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* Wv,
                      int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  const auto* W = static_cast<const uint8_t*>(Wv);
  const auto row_bytes = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  const int64_t rb = q8_prepared_row_bytes(K);
  for (int64_t m = 0; m < M; ++m) {
    const auto* qa = reinterpret_cast<const int8_t*>(P + m * rb);
    const auto* qs = reinterpret_cast<const float*>(P + m * rb + K);
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = W + n * row_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < K / ir::kQ8Block; ++b) {
        int32_t dot = 0;
        for (int64_t i = b * ir::kQ8Block; i < (b + 1) * ir::kQ8Block; ++i)
          dot += static_cast<int32_t>(static_cast<int8_t>(row[q8_offset(i, K)])) * qa[i];
        acc += q8_scale(row, K, b) * qs[b] * static_cast<float>(dot);
      }
      C[m * ldc + n] = acc;
    }
  }
}
// One row at a time through a stack buffer: this table is also the fallback
// on CPUs without AVX2, where decode must not allocate either. kGemm: the
// layout's product on prepared rows.
using PreparedProduct = void (*)(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                 int64_t ldw, float* C, int64_t ldc);
template <PreparedProduct kGemm>
void gemm_nt_q8_rowwise(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                        float* C, int64_t ldc) {
  alignas(64) uint8_t row[kQ8MaxK + kQ8MaxK / ir::kQ8Block * 4];
  for (int64_t m = 0; m < M; ++m) {
    prepare_q8(1, K, A + m * lda, lda, row);
    kGemm(1, n0, n1, K, row, W, 0, C + m * ldc, ldc);
  }
}
void gemm_nt_q8(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W, float* C,
                int64_t ldc) {
  gemm_nt_q8_rowwise<gemm_q8_prepared>(M, n0, n1, K, A, lda, W, C, ldc);
}

// gemm_nt_q8 on the int8 panel layouts (kernels.h, gemm_nt_q8p16 and
// gemm_nt_q8cp16; util/q8_panel.h): the prepared rows above, and each output
// one fma chain over the blocks, scaled per block by the weight's and the
// activation's scales (q8p16) or by the activation's alone and then once by
// the row's weight scale (kChannel: q8cp16).
template <bool kChannel>
void gemm_q8_panels_prepared(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* Wv,
                             int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  const auto* W = static_cast<const uint8_t*>(Wv);
  const int64_t rb = q8_prepared_row_bytes(K), pb = kChannel ? q8c_panel_bytes(K) : q8_panel_bytes(K);
  for (int64_t m = 0; m < M; ++m) {
    const auto* qa = reinterpret_cast<const int8_t*>(P + m * rb);
    const auto* qs = reinterpret_cast<const float*>(P + m * rb + K);
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* panel = W + n / ir::kPanelRows * pb;
      float acc = 0.0f;
      for (int64_t b = 0; b < K / ir::kQ8Block; ++b) {
        int32_t dot = 0;
        for (int64_t i = b * ir::kQ8Block; i < (b + 1) * ir::kQ8Block; ++i)
          dot += static_cast<int32_t>(q8_panel_value(panel, n % ir::kPanelRows, i)) * qa[i];
        const float s = kChannel ? qs[b] : q8_panel_scale(panel, K, n % ir::kPanelRows, b) * qs[b];
        acc = std::fma(s, static_cast<float>(dot), acc);
      }
      C[m * ldc + n] = kChannel ? q8c_panel_scale(panel, K, n % ir::kPanelRows) * acc : acc;
    }
  }
}

// bf16 dot products in two steps: prepared rows are A rounded to bf16, kept
// as K floats; the product is gemm_nt_bf16 on them (gemm_nt_bf16dot's sums).
int64_t bf16dot_prepared_row_bytes(int64_t K) {
  return 4 * K;
}
// Columns [k0, k1) of the rows, any range (prepare_cols; col_group 16:
// whole lines), the whole rows with k0 0, k1 K (prepare).
void prepare_bf16dot_cols(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P) {
  auto* out = reinterpret_cast<float*>(P);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = k0; k < k1; ++k) out[m * K + k] = bf16_to_f32(f32_to_bf16(A[m * lda + k]));
}
void prepare_bf16dot(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_bf16dot_cols(M, K, 0, K, A, lda, P);
}
// The same rows against bf16 panels (kernels.h, bf16dotp16_prepared).
void gemm_bf16dot_panels_prepared(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                  int64_t ldw, float* C, int64_t ldc) {
  (void)ldw;
  gemm_nt_bf16p16(M, n0, n1, K, reinterpret_cast<const float*>(P), K, static_cast<const uint16_t*>(W), C, ldc, {});
}
void gemm_bf16dot_prepared(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                           float* C, int64_t ldc) {
  gemm_nt_bf16(M, n0, n1, K, reinterpret_cast<const float*>(P), K, static_cast<const uint16_t*>(W), ldw, C, ldc);
}

// x, w, b, y: [n]. Two passes: the mean first, then the biased variance of
// the centred values (avoids the cancellation of E[x^2] - E[x]^2). The sums
// are kept in double: a long sequential float sum would make this oracle
// less accurate than the vector code it checks.
void layernorm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  if (n == 0) return;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const float var = static_cast<float>(sq / static_cast<double>(n));
  const float rstd = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
}

// x, w, y: [n]. Sum of squares in double, as in layernorm.
void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* y) {
  if (n == 0) return;
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(x[i]) * x[i];
  const float ms = static_cast<float>(sq / static_cast<double>(n));
  const float rstd = 1.0f / std::sqrt(ms + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rstd * w[i];
}

// x, y: [n]; y may alias x.
void gelu(const float* x, int64_t n, float* y) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
}

// g, u, y: [n]; y may alias g or u. exp(-g) overflows to inf for g < -88,
// which gives g / inf = -0: the correct limit.
void silu_mul(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// a, b, y: [n]; y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// x, y: [n].
void axpy(float alpha, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// x: [n]. The reference: one pass, a value replaces the best only when
// strictly larger (ties keep the lower index; NaN compares false).
int64_t argmax(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
  return best < 0 ? 0 : best;
}

// x: [n] -> out: [count]. The reference: one compare per value.
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t base, int32_t* out) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= t) out[c++] = base + static_cast<int32_t>(i);
  return c;
}

// x, p: [n]. libm's expf; the sum in double, rounded once.
float exp_shifted(const float* x, int64_t n, float mx, float inv_t, float* p) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = (x[i] - mx) * inv_t;
    p[i] = d >= kExpShiftedMin ? std::exp(d) : 0.0f;
    sum += p[i];
  }
  return static_cast<float>(sum);
}

inline float cache_value(float x) {
  return x;
}
inline float cache_value(uint16_t x) {
  return bf16_to_f32(x);
}

// q: [hd]; k, v: [len, hd] with row stride `stride` elements (f32, or bf16
// widened as read); out: [hd].
// Two passes over the cache instead of an online softmax, so this oracle is
// independent of the tricks the SIMD versions use: pass 1 finds the maximum
// score, pass 2 recomputes each score and accumulates exp(s - max) * V[j].
// len == 0 yields zeros (an empty weighted sum).
template <class T>
AttendStats attend_rows(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                        float* out) {
  auto score = [&](int64_t j) {
    float dot = 0.0f;
    for (int64_t i = 0; i < hd; ++i) dot += q[i] * cache_value(k[j * stride + i]);
    return scale * dot;
  };
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  if (len == 0) return {-std::numeric_limits<float>::infinity(), 0.0f};
  float max_s = score(0);
  for (int64_t j = 1; j < len; ++j) max_s = std::fmax(max_s, score(j));
  float sum = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    const float p = std::exp(score(j) - max_s);
    sum += p;
    for (int64_t i = 0; i < hd; ++i) out[i] += p * cache_value(v[j * stride + i]);
  }
  for (int64_t i = 0; i < hd; ++i) out[i] /= sum;
  return {max_s, sum};
}

constexpr KernelTable kTable = {
    .isa = Isa::kScalar,
    .gemm_nt = gemm_nt,
    .gemm_nt_bf16 = gemm_nt_bf16,
    .gemm_nt_bf16dot = gemm_nt_bf16dot,
    .gemm_nt_q8 = gemm_nt_q8,
    .q8_prepared = {q8_prepared_row_bytes, prepare_q8, gemm_q8_prepared, prepare_q8_cols, ir::kQ8Block},
    .bf16dot_prepared = {bf16dot_prepared_row_bytes, prepare_bf16dot, gemm_bf16dot_prepared, prepare_bf16dot_cols, 16},
    .bf16dot_tiles_prepared = {bf16dot_prepared_row_bytes, prepare_bf16dot, gemm_tiles_via_rows<gemm_bf16dot_prepared>,
                               prepare_bf16dot_cols, 16},
    .gemm_nt_p16 = gemm_nt_p16,
    .gemm_nt_bf16p16 = gemm_nt_bf16p16,
    .bf16dotp16_prepared = {bf16dot_prepared_row_bytes, prepare_bf16dot, gemm_bf16dot_panels_prepared,
                            prepare_bf16dot_cols, 16},
    .gemm_nt_q8p16 = gemm_nt_q8_rowwise<gemm_q8_panels_prepared<false>>,
    .q8p16_prepared = {q8_prepared_row_bytes, prepare_q8, gemm_q8_panels_prepared<false>, prepare_q8_cols,
                       ir::kQ8Block},
    .gemm_nt_q8cp16 = gemm_nt_q8_rowwise<gemm_q8_panels_prepared<true>>,
    .q8cp16_prepared = {q8_prepared_row_bytes, prepare_q8, gemm_q8_panels_prepared<true>, prepare_q8_cols,
                        ir::kQ8Block},
    .layernorm = layernorm,
    .rmsnorm = rmsnorm,
    .gelu = gelu,
    .silu_mul = silu_mul,
    .add = add,
    .axpy = axpy,
    .argmax = argmax,
    .indices_at_least = indices_at_least,
    .exp_shifted = exp_shifted,
    .attend = attend_rows<float>,
    .attend_bf16 = attend_rows<uint16_t>,
    .attend_cached = attend_rows<float>,  // nothing to leave out: no software prefetch
    .attend_bf16_cached = attend_rows<uint16_t>,
};

}  // namespace

const KernelTable& scalar_table() {
  return kTable;
}

}  // namespace k3::kernels
