// Tests for the kernel tables: every entry of every table the CPU can run
// against the scalar reference on awkward sizes, the gemm_nt bit-exactness
// contract (batched == unbatched, split columns == whole), and attention
// stability with large scores. Buffers are sized exactly so AddressSanitizer
// catches any read or write past the end.
//
// Tolerances (u = 2^-24 ~ 6e-8, float rounding):
//   gemm_nt     |c - ref| <= 1e-5 * sqrt(K) * sum_k |a_k * w_k|   (order of summation differs)
//   gemm_nt_bf16 bit-exact vs the same table's gemm_nt on the widened weights
//   gemm_nt_bf16dot like gemm_nt vs the reference on bf16-rounded A; bit-exact across M and splits
//   gemm_nt_q8  like gemm_nt vs the reference on the dequantized weights; bit-exact across M and splits
//   PreparedGemm (q8, bf16dot) bit-exact vs the same table's one-step kernel, across splits and row ranges
//   gemm_nt_p16, _bf16p16  bit-exact vs the scalar table (one fma chain per element), across M and splits
//   bf16dotp16_prepared  bit-exact vs the scalar gemm_nt_bf16p16 on bf16-rounded A, across M and splits;
//               like gemm_nt vs the row layout's gemm_nt_bf16dot on the same weights
//   gemm_nt_q8p16  bit-exact vs the scalar table (one fma chain over blocks), across M and splits;
//   gemm_nt_q8cp16 the same, for the channel-scale panels;
//               like gemm_nt vs the row layout's gemm_nt_q8 on the same weights
//   gelu, silu  |y - ref| <= 2e-6 * max(1, |ref|)                (erf/exp approximations)
//   norms       |y - ref| <= 1e-5 * max(1, |ref|)                (float vs double sums, n <= 1000)
//   add         bit-exact; axpy |y - ref| <= 1e-6 * max(1, |ref|) (fma vs mul + add)
//   argmax      the reference's index exactly (ties, NaN, infinities, signed zeros)
//   indices_at_least  the reference's indices exactly
//   exp_shifted |p - ref| <= 2e-6 * max(1, |ref|), 0 exactly where ref is 0; sum within 1e-5 relative
//   attend      |o - ref| <= 5e-6 * max|V|                        (online vs two-pass softmax)
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/quant.h"
#include "util/tiles.h"

namespace k3::kernels {

// Lets gtest print a failing parameter as "avx512" instead of raw bytes
// (found by ADL, so it lives in Isa's namespace).
void PrintTo(Isa isa, std::ostream* os) {
  *os << isa_name(isa);
}

namespace {

constexpr int64_t kSizes[] = {0, 1, 3, 15, 16, 17, 31, 33, 64, 100, 257, 1000};

std::vector<float> random_vec(int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Elements of a [rows, cols] matrix with row stride ld, sized exactly.
size_t strided_size(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 ? 0 : static_cast<size_t>((rows - 1) * ld + cols);
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// A table to test: the AVX-512 and amx tables come with their streaming
// tiles prefetching into L1 or into L2 (kernels.h, Prefetch), two sets of
// instantiated tiles that must both match the reference.
struct TableCase {
  Isa isa;
  Prefetch prefetch;
  std::string name() const {
    std::string n(isa_name(isa));
    return prefetch == Prefetch::kL2 ? n + "_l2" : n;
  }
  friend void PrintTo(const TableCase& c, std::ostream* os) { *os << c.name(); }
};

class KernelTest : public ::testing::TestWithParam<TableCase> {
 protected:
  void SetUp() override {
    table_ = table_for(GetParam().isa, GetParam().prefetch);
    if (table_ == nullptr) {
      GTEST_SKIP() << isa_name(GetParam().isa) << " is not supported on this CPU";
    }
  }
  const KernelTable& t() const { return *table_; }
  static const KernelTable& ref() { return scalar_table(); }

 private:
  const KernelTable* table_ = nullptr;
};

// ---- gemm_nt ---------------------------------------------------------------

TEST_P(KernelTest, GemmMatchesReference) {
  std::mt19937 rng(1);
  for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 13}) {
    for (int64_t K : {1, 7, 16, 17, 64, 100, 513}) {
      for (int64_t N : {1, 3, 4, 5, 17, 64}) {
        // Padded strides on odd K exercise lda/ldw/ldc != K/N.
        const int64_t lda = K + (K % 2), ldw = K + (K % 3), ldc = N + 2;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto W = random_vec(static_cast<int64_t>(strided_size(N, K, ldw)), rng);
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), R(C);
        t().gemm_nt(M, 0, N, K, A.data(), lda, W.data(), ldw, C.data(), ldc);
        ref().gemm_nt(M, 0, N, K, A.data(), lda, W.data(), ldw, R.data(), ldc);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[m * lda + k] * W[n * ldw + k]);
            const float tol = 1e-5f * std::sqrt(static_cast<float>(K)) * mag;
            ASSERT_NEAR(C[m * ldc + n], R[m * ldc + n], tol)
                << "M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
          }
          for (int64_t n = N; n < ldc && m * ldc + n < static_cast<int64_t>(C.size()); ++n)
            ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside [0, N)";
        }
      }
    }
  }
}

TEST_P(KernelTest, GemmZeroK) {
  std::vector<float> A(3), W(5), C(3 * 5, 1.0f);
  t().gemm_nt(3, 0, 5, 0, A.data(), 1, W.data(), 1, C.data(), 5);
  for (float c : C) EXPECT_EQ(c, 0.0f);
}

// Batched rows must equal single-row calls bit for bit, and splitting the
// column range must equal one whole call bit for bit.
TEST_P(KernelTest, GemmBitExactAcrossBatchAndSplits) {
  std::mt19937 rng(2);
  constexpr int64_t N = 37;  // odd, so tiles of every width show up
  for (int64_t K : {1, 7, 16, 17, 64, 100, 513}) {
    const auto W = random_vec(N * K, rng);
    for (int64_t M : {7, 8, 13}) {
      const auto A = random_vec(M * K, rng);
      std::vector<float> whole(static_cast<size_t>(M * N));
      t().gemm_nt(M, 0, N, K, A.data(), K, W.data(), K, whole.data(), N);

      // One row at a time (M = 1), as unbatched decode would.
      std::vector<float> single(static_cast<size_t>(N));
      for (int64_t m = 0; m < M; ++m) {
        t().gemm_nt(1, 0, N, K, A.data() + m * K, K, W.data(), K, single.data(), N);
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(bits(single[n]), bits(whole[m * N + n])) << "K=" << K << " M=" << M << " m=" << m << " n=" << n;
      }

      // Column splits at awkward points, as a thread partition might make.
      for (int64_t step : {1, 2, 3, 5, 6, 11}) {
        std::vector<float> split(static_cast<size_t>(M * N), 0.0f);
        for (int64_t n0 = 0; n0 < N; n0 += step) {
          const int64_t n1 = n0 + step < N ? n0 + step : N;
          t().gemm_nt(M, n0, n1, K, A.data(), K, W.data(), K, split.data(), N);
        }
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(bits(split[i]), bits(whole[i])) << "K=" << K << " M=" << M << " step=" << step;
      }
    }
  }
}

// ---- gemm_nt_bf16 ----------------------------------------------------------

// Random bf16 bit patterns: the top halves of random floats (any bf16 will do).
std::vector<uint16_t> random_bf16(int64_t n, std::mt19937& rng) {
  const auto f = random_vec(n, rng);
  std::vector<uint16_t> v(f.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(bits(f[i]) >> 16);
  return v;
}

std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(&f[i], &u, 4);
  }
  return f;
}

// bf16 weights widen exactly, so each table's bf16 product must equal its
// own f32 product on the widened weights bit for bit (same FMA sequence),
// and the scalar reference within the gemm tolerance.
TEST_P(KernelTest, GemmBf16EqualsF32OnWidenedWeights) {
  std::mt19937 rng(3);
  for (int64_t M : {1, 2, 4, 5, 8}) {
    for (int64_t K : {1, 7, 8, 15, 16, 17, 64, 100, 513}) {
      for (int64_t N : {1, 3, 4, 5, 17}) {
        const int64_t lda = K + (K % 2), ldw = K + (K % 3), ldc = N + 1;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto W16 = random_bf16(static_cast<int64_t>(strided_size(N, K, ldw)), rng);
        const auto W = widen(W16);
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), F(C), R(C);
        t().gemm_nt_bf16(M, 0, N, K, A.data(), lda, W16.data(), ldw, C.data(), ldc);
        t().gemm_nt(M, 0, N, K, A.data(), lda, W.data(), ldw, F.data(), ldc);
        ref().gemm_nt_bf16(M, 0, N, K, A.data(), lda, W16.data(), ldw, R.data(), ldc);
        for (size_t i = 0; i < C.size(); ++i)
          ASSERT_EQ(bits(C[i]), bits(F[i])) << "M=" << M << " K=" << K << " N=" << N << " i=" << i;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[m * lda + k] * W[n * ldw + k]);
            ASSERT_NEAR(C[m * ldc + n], R[m * ldc + n], 1e-5f * std::sqrt(static_cast<float>(K)) * mag)
                << "M=" << M << " K=" << K << " N=" << N;
          }
      }
    }
  }
}

// ---- gemm_nt_bf16dot ------------------------------------------------------

// A rounded to bf16 (nearest even, util/half.h): what gemm_nt_bf16dot multiplies.
std::vector<float> round_bf16(const std::vector<float>& a) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(a[i]));
  return r;
}

// Every table against the scalar reference, within the gemm tolerance
// (products of two bf16 are exact; only the summation order differs), with
// K across the 32-wide step and its tail, strided operands and a sentinel
// past each output row.
TEST_P(KernelTest, GemmBf16DotMatchesReference) {
  std::mt19937 rng(11);
  // M 33 and N 37: the AMX table's second row and column tiles and their tails.
  for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 13, 33}) {
    for (int64_t K : {1, 7, 31, 32, 33, 64, 100, 513}) {
      for (int64_t N : {1, 3, 4, 5, 17, 37}) {
        const int64_t lda = K + (K % 2), ldw = K + (K % 3), ldc = N + 1;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto W16 = random_bf16(static_cast<int64_t>(strided_size(N, K, ldw)), rng);
        const auto W = widen(W16);
        const auto Ar = round_bf16(A);
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), R(C);
        t().gemm_nt_bf16dot(M, 0, N, K, A.data(), lda, W16.data(), ldw, C.data(), ldc);
        ref().gemm_nt_bf16dot(M, 0, N, K, A.data(), lda, W16.data(), ldw, R.data(), ldc);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(Ar[m * lda + k] * W[n * ldw + k]);
            ASSERT_NEAR(C[m * ldc + n], R[m * ldc + n], 1e-5f * std::sqrt(static_cast<float>(K)) * mag)
                << "M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
          }
          for (int64_t n = N; n < ldc && m * ldc + n < static_cast<int64_t>(C.size()); ++n)
            ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside [0, N)";
        }
      }
    }
  }
}

// The rounding of A is real, in the full 32-wide steps and in the tail:
// 1 + 2^-9 rounds to 1 in bf16 (8 significant bits) and 1 + 3 * 2^-9 to
// 1 + 2^-7, so with W = 1 every table must give exactly K or K * (1 + 2^-7)
// (the f32-activation kernel gives K * (1 + 2^-9) and K * (1 + 3 * 2^-9)).
// A NaN activation makes its row NaN.
TEST_P(KernelTest, GemmBf16DotRoundsActivations) {
  for (int64_t K : {3, 32, 45, 64}) {
    const std::vector<uint16_t> W(static_cast<size_t>(2 * K), f32_to_bf16(1.0f));
    std::vector<float> A(static_cast<size_t>(3 * K), 1.0f + 0x1p-9f);
    for (int64_t k = 0; k < K; ++k) A[static_cast<size_t>(K + k)] = 1.0f + 3 * 0x1p-9f;
    A[static_cast<size_t>(2 * K + K - 1)] = std::nanf("");
    std::vector<float> C(6, -7.0f);
    t().gemm_nt_bf16dot(3, 0, 2, K, A.data(), K, W.data(), K, C.data(), 2);
    for (int n = 0; n < 2; ++n) {
      EXPECT_EQ(C[static_cast<size_t>(n)], static_cast<float>(K)) << "K=" << K;
      EXPECT_EQ(C[static_cast<size_t>(2 + n)], static_cast<float>(K) * (1.0f + 0x1p-7f)) << "K=" << K;
      EXPECT_TRUE(std::isnan(C[static_cast<size_t>(4 + n)])) << "K=" << K;
    }
  }
}

// Batched rows equal single-row calls bit for bit, and column splits equal
// one whole call, including M large enough at K = 2000 that the rounded
// activations take several chunks of the kernels' stack buffers, and K =
// 4500, which the AMX table sums in three passes over k.
TEST_P(KernelTest, GemmBf16DotBitExactAcrossBatchAndSplits) {
  std::mt19937 rng(12);
  constexpr int64_t N = 37;
  for (int64_t K : {7, 32, 100, 513, 2000, 4500}) {
    const auto W = random_bf16(N * K, rng);
    for (int64_t M : K >= 2000 ? std::vector<int64_t>{70} : std::vector<int64_t>{7, 8, 9, 13, 33}) {
      const auto A = random_vec(M * K, rng);
      std::vector<float> whole(static_cast<size_t>(M * N));
      t().gemm_nt_bf16dot(M, 0, N, K, A.data(), K, W.data(), K, whole.data(), N);
      std::vector<float> single(static_cast<size_t>(N));
      for (int64_t m = 0; m < M; ++m) {
        t().gemm_nt_bf16dot(1, 0, N, K, A.data() + m * K, K, W.data(), K, single.data(), N);
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(bits(single[n]), bits(whole[m * N + n])) << "K=" << K << " M=" << M << " m=" << m << " n=" << n;
      }
      for (int64_t step : {1, 5, 11}) {
        std::vector<float> split(static_cast<size_t>(M * N), 0.0f);
        for (int64_t n0 = 0; n0 < N; n0 += step)
          t().gemm_nt_bf16dot(M, n0, n0 + step < N ? n0 + step : N, K, A.data(), K, W.data(), K, split.data(), N);
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(bits(split[i]), bits(whole[i])) << "K=" << K << " M=" << M << " step=" << step;
      }
    }
  }
}

// ---- gemm_nt_p16 / gemm_nt_bf16p16 (panel layout) ---------------------------

// Every table computes each panel-layout element as one FMA chain in k order
// (the scalar table with std::fma), so all of them agree bit for bit, and
// with the row-major reference within the gemm tolerance (which checks the
// packing itself). Buffers are sized exactly: panel_count(N) * 16 * K. The
// table's calls name the other layout's copy as the weights read next
// (kernels.h, ReadNext), a hint that must change nothing. M covers 1 to 4
// row tiles.
TEST_P(KernelTest, GemmPanelsBitExactVsReference) {
  std::mt19937 rng(11);
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 25, 37}) {
    for (int64_t K : {0, 1, 7, 16, 17, 100, 513}) {
      for (int64_t N : {1, 3, 15, 16, 17, 33, 64, 100}) {
        const int64_t lda = K + (K % 2), ldc = N + 3;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto W16 = random_bf16(N * K, rng);
        const auto W = widen(W16);
        const auto padded = static_cast<size_t>(panel_count(N) * ir::kPanelRows * K);
        std::vector<float> P(padded);
        std::vector<uint16_t> P16(padded);
        pack_panels(W.data(), N, K, P.data());
        pack_panels(W16.data(), N, K, P16.data());
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), C16(C), R(C), Rows(C);
        const auto bytes = static_cast<int64_t>(padded);
        t().gemm_nt_p16(M, 0, N, K, A.data(), lda, P.data(), C.data(), ldc, {P16.data(), bytes * 2});
        t().gemm_nt_bf16p16(M, 0, N, K, A.data(), lda, P16.data(), C16.data(), ldc, {P.data(), bytes * 4});
        ref().gemm_nt_p16(M, 0, N, K, A.data(), lda, P.data(), R.data(), ldc, {});
        ref().gemm_nt(M, 0, N, K, A.data(), lda, W.data(), K, Rows.data(), ldc);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            const int64_t i = m * ldc + n;
            ASSERT_EQ(bits(C[i]), bits(R[i])) << "f32 M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
            ASSERT_EQ(bits(C16[i]), bits(R[i])) << "bf16 M=" << M << " K=" << K << " N=" << N << " m=" << m;
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[m * lda + k] * W[n * K + k]);
            ASSERT_NEAR(C[i], Rows[i], 1e-5f * std::sqrt(static_cast<float>(K)) * mag) << "M=" << M << " K=" << K;
          }
          for (int64_t n = N; n < ldc && m * ldc + n < static_cast<int64_t>(C.size()); ++n) {
            ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside [0, N)";
            ASSERT_EQ(C16[m * ldc + n], -7.0f) << "wrote outside [0, N)";
          }
        }
      }
    }
  }
}

// Batched rows equal single-row calls, and any column split equals one
// whole call, bit for bit, including splits that cut a panel.
TEST_P(KernelTest, GemmPanelsBitExactAcrossBatchAndSplits) {
  std::mt19937 rng(12);
  constexpr int64_t N = 75;  // four whole panels and a partial one
  for (int64_t K : {1, 17, 100, 513}) {
    const auto W16 = random_bf16(N * K, rng);
    std::vector<uint16_t> P16(static_cast<size_t>(panel_count(N) * ir::kPanelRows * K));
    pack_panels(W16.data(), N, K, P16.data());
    for (int64_t M : {5, 8, 13}) {
      const auto A = random_vec(M * K, rng);
      std::vector<float> whole(static_cast<size_t>(M * N));
      t().gemm_nt_bf16p16(M, 0, N, K, A.data(), K, P16.data(), whole.data(), N, {});
      std::vector<float> single(static_cast<size_t>(N));
      for (int64_t m = 0; m < M; ++m) {
        t().gemm_nt_bf16p16(1, 0, N, K, A.data() + m * K, K, P16.data(), single.data(), N, {});
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(bits(single[n]), bits(whole[m * N + n])) << "K=" << K << " M=" << M << " m=" << m << " n=" << n;
      }
      for (int64_t step : {1, 5, 16, 21, 32}) {
        std::vector<float> split(static_cast<size_t>(M * N), 0.0f);
        for (int64_t n0 = 0; n0 < N; n0 += step)
          t().gemm_nt_bf16p16(M, n0, n0 + step < N ? n0 + step : N, K, A.data(), K, P16.data(), split.data(), N, {});
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(bits(split[i]), bits(whole[i])) << "K=" << K << " M=" << M << " step=" << step;
      }
    }
  }
}

TEST(PanelFormat, PackUnpackRoundTripsAndPadsWithZeros) {
  std::mt19937 rng(13);
  for (int64_t N : {1, 15, 16, 17, 40}) {
    const int64_t K = 9;
    const auto W16 = random_bf16(N * K, rng);
    std::vector<uint16_t> P(static_cast<size_t>(panel_count(N) * ir::kPanelRows * K), 0xffff), back(W16.size());
    pack_panels(W16.data(), N, K, P.data());
    unpack_panels(P.data(), N, K, back.data());
    EXPECT_EQ(back, W16) << "N=" << N;
    // Every stored element is either a weight or zero padding: the padding
    // count is exactly (16 * panels - N) * K.
    size_t zeros = 0;
    for (uint16_t v : P) zeros += v == 0;
    size_t weight_zeros = 0;
    for (uint16_t v : W16) weight_zeros += v == 0;
    EXPECT_EQ(zeros - weight_zeros, static_cast<size_t>((panel_count(N) * ir::kPanelRows - N) * K)) << "N=" << N;
    const auto bytes = ir::dtype_bytes(ir::DType::kBF16P16, std::vector<int64_t>{N, K});
    ASSERT_TRUE(bytes.has_value());
    EXPECT_EQ(*bytes, P.size() * 2) << "N=" << N;
  }
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kF32P16, std::vector<int64_t>{4}).has_value()) << "not a matrix";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kF32P16, std::vector<int64_t>{INT64_MAX, 2}).has_value()) << "overflow";
}

TEST(TileFormat, PackUnpackRoundTripsAndPadsWithZeros) {
  std::mt19937 rng(14);
  for (int64_t N : {1, 15, 16, 17, 40}) {
    for (int64_t K : {1, 31, 32, 45}) {
      const auto W16 = random_bf16(N * K, rng);
      const int64_t kp = tile_padded_cols(K);
      std::vector<uint16_t> T(static_cast<size_t>(tile_block_count(N) * 16 * kp), 0xffff), back(W16.size());
      pack_tiles(W16.data(), N, K, T.data());
      unpack_tile_rows(T.data(), 0, N, K, back.data());
      EXPECT_EQ(back, W16) << "N=" << N << " K=" << K;
      // Rows from the middle of a block on their own.
      if (N > 3) {
        std::vector<uint16_t> part(static_cast<size_t>(2 * K));
        unpack_tile_rows(T.data(), N - 2, 2, K, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), W16.begin() + (N - 2) * K)) << "N=" << N << " K=" << K;
      }
      // A tile is 16 rows of 32 contiguous values: W[n, k] one row of 32 after W[n - 1, k].
      if (N > 1) {
        EXPECT_EQ(tile_index(1, 0, K) - tile_index(0, 0, K), 32);
      }
      size_t zeros = 0, weight_zeros = 0;
      for (uint16_t v : T) zeros += v == 0;
      for (uint16_t v : W16) weight_zeros += v == 0;
      EXPECT_EQ(zeros - weight_zeros, T.size() - static_cast<size_t>(N * K)) << "padding is zero";
      const auto bytes = ir::dtype_bytes(ir::DType::kBF16DotT16, std::vector<int64_t>{N, K});
      ASSERT_TRUE(bytes.has_value());
      EXPECT_EQ(*bytes, T.size() * 2) << "N=" << N << " K=" << K;
    }
  }
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kBF16DotT16, std::vector<int64_t>{4}).has_value()) << "not a matrix";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kBF16DotT16, std::vector<int64_t>{2, INT64_MAX}).has_value()) << "overflow";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kBF16DotT16, std::vector<int64_t>{INT64_MAX / 16, 64}).has_value())
      << "overflow";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kBF16DotT16, std::vector<int64_t>{-1, 32}).has_value()) << "negative";
}

// ---- gemm_nt_q8 ------------------------------------------------------------

// [N, K] f32 -> int8 rows (util/quant.h), and back to the f32 the kernels use.
std::vector<uint8_t> quantize(const std::vector<float>& w, int64_t N, int64_t K) {
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  std::vector<uint8_t> q(static_cast<size_t>(N * rb));
  for (int64_t n = 0; n < N; ++n) quantize_q8_row(w.data() + n * K, K, q.data() + n * rb);
  return q;
}
// The same rows with one scale each (`--precision int8-channel`).
std::vector<uint8_t> quantize_channel(const std::vector<float>& w, int64_t N, int64_t K) {
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  std::vector<uint8_t> q(static_cast<size_t>(N * rb));
  for (int64_t n = 0; n < N; ++n) quantize_q8_row_channel(w.data() + n * K, K, q.data() + n * rb);
  return q;
}
std::vector<float> dequantize(const std::vector<uint8_t>& q, int64_t N, int64_t K) {
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) dequantize_q8_row(q.data() + n * rb, K, w.data() + n * K);
  return w;
}

TEST(Q8Format, RoundTripErrorIsAtMostHalfAStep) {
  std::mt19937 rng(5);
  auto w = random_vec(4 * 64, rng, -3.0f, 3.0f);
  for (int i = 64; i < 96; ++i) w[static_cast<size_t>(i)] = 0.0f;  // an all-zero block: scale 0, exact
  w[130] = 1e-30f;                                                 // tiny next to large values
  const auto q = quantize(w, 4, 64);
  ASSERT_EQ(q.size(), 4 * ir::q8_row_bytes(64));
  const auto back = dequantize(q, 4, 64);
  for (int64_t b = 0; b < 8; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(w[static_cast<size_t>(b * 32 + i)]));
    for (int64_t i = 0; i < 32; ++i) {
      const size_t j = static_cast<size_t>(b * 32 + i);
      // |w - q * s| <= s / 2 (plus the rounding of q * s in f32).
      ASSERT_LE(std::fabs(w[j] - back[j]), amax / 127.0f * 0.5f * (1.0f + 1e-6f) + 1e-37f) << j;
    }
  }
  for (int i = 64; i < 96; ++i) EXPECT_EQ(back[static_cast<size_t>(i)], 0.0f);
  // The block's largest magnitude maps to +-127 exactly.
  int max_q = 0;
  for (int64_t i = 0; i < 32; ++i)
    max_q = std::max(max_q, std::abs(static_cast<int>(static_cast<int8_t>(q[static_cast<size_t>(q8_offset(i, 64))]))));
  EXPECT_EQ(max_q, 127);
}

// Scales are f16, rounded up: max|w| / scale <= 127 for any magnitude, so
// no weight is clamped (a scale rounded down would push the largest weight
// past 127), and a tiny block keeps a nonzero (subnormal) scale.
TEST(Q8Format, F16ScalesRoundUpAndNeverClamp) {
  for (float amax : {1.0f, 0.3f, 3.3333f, 1e-3f, 1e-7f, 12345.678f}) {
    std::vector<float> w(32);
    for (int i = 0; i < 32; ++i) w[static_cast<size_t>(i)] = amax * static_cast<float>(i - 16) / 16.0f;  // -amax..
    w[31] = amax;
    std::vector<uint8_t> q(ir::q8_row_bytes(32));
    quantize_q8_row(w.data(), 32, q.data());
    const float scale = q8_scale(q.data(), 32, 0);
    ASSERT_GE(scale, amax / 127.0f) << amax;
    ASSERT_LE(scale, amax / 127.0f * (1.0f + 1.0f / 1024.0f) + 6e-8f) << amax;  // one f16 step up at most
    for (int i = 0; i < 32; ++i) {
      const float back = q8_weight(q.data(), 32, i);
      ASSERT_LE(std::fabs(back - w[static_cast<size_t>(i)]), scale * 0.5f * (1.0f + 1e-6f)) << amax << " " << i;
    }
  }
}

// A block beyond kQ8MaxAbs has no finite f16 scale: it dequantizes to NaN
// (loud), not to zeros; the block at the limit is still exact.
TEST(Q8Format, BlockBeyondTheF16ScaleIsPoisonedNotZeroed) {
  std::vector<float> w(64, 1.0f);
  w[3] = kQ8MaxAbs * 1.001f;  // block 0
  w[40] = kQ8MaxAbs;          // block 1
  std::vector<uint8_t> q(ir::q8_row_bytes(64));
  quantize_q8_row(w.data(), 64, q.data());
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(q8_weight(q.data(), 64, i))) << i;
  EXPECT_EQ(q8_weight(q.data(), 64, 40), kQ8MaxAbs);
}

// The int8 values of a row are interleaved 4 bytes at a time across groups
// of 16 blocks (util/quant.h), the last group holding what is left, and each
// group's f16 scales follow its values: values and scales together cover the
// row's bytes once, each 4-byte piece stays together, and step t of block l
// of a group of r blocks sits at 4 * (t * r + l) from the group's start.
TEST(Q8Format, OffsetsInterleaveFourBytesAcrossSixteenBlockGroupsWithTheirScales) {
  EXPECT_EQ(q8_offset(0, 512), 0);
  EXPECT_EQ(q8_offset(3, 512), 3);
  EXPECT_EQ(q8_offset(4, 512), 64);     // block 0, step 1: after step 0 of all 16 blocks
  EXPECT_EQ(q8_offset(32, 512), 4);     // block 1, step 0
  EXPECT_EQ(q8_offset(511, 512), 511);  // block 15, step 7, byte 3
  EXPECT_EQ(q8_scale_offset(0, 512), 512);
  EXPECT_EQ(q8_scale_offset(15, 512), 512 + 30);
  EXPECT_EQ(q8_offset(4, 96), 12);  // a lone group of 3 blocks: steps of 12 bytes
  EXPECT_EQ(q8_scale_offset(2, 96), 96 + 4);
  EXPECT_EQ(q8_offset(512 + 36, 576), 544 + 4 + 4 * 2 + 0);  // second group of 2 blocks: block 1, step 1
  EXPECT_EQ(q8_scale_offset(16, 576), 544 + 64);             // after the second group's 64 values
  EXPECT_EQ(q8_scale_offset(17, 576), 544 + 66);
  for (int64_t K : {32, 96, 512, 544, 800, 1056, 1536}) {
    const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
    std::vector<int> seen(static_cast<size_t>(rb), 0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t o = q8_offset(k, K);
      ASSERT_TRUE(o >= 0 && o < rb) << K << " " << k;
      ++seen[static_cast<size_t>(o)];
      if (k % 4 != 0) {
        ASSERT_EQ(o, q8_offset(k - 1, K) + 1) << K << " " << k;
      }
      ASSERT_EQ(o / ir::kQ8GroupBytes, k / 512) << "stays in its group";
    }
    for (int64_t b = 0; b < K / 32; ++b) {
      const int64_t o = q8_scale_offset(b, K);
      ASSERT_TRUE(o >= 0 && o + 1 < rb) << K << " " << b;
      ASSERT_EQ(o / ir::kQ8GroupBytes, b / 16) << "in its group";
      ASSERT_GT(o, q8_offset(b * 32 + 31, K)) << "after its values";
      ++seen[static_cast<size_t>(o)];
      ++seen[static_cast<size_t>(o + 1)];
    }
    for (int64_t o = 0; o < rb; ++o) ASSERT_EQ(seen[static_cast<size_t>(o)], 1) << K << " offset " << o;
  }
}

// A NaN or inf weight poisons its block (scale NaN, so the block dequantizes
// to NaN, as f32 arithmetic would) instead of being clamped to +-127: before,
// NaN came out as -127 * scale, a finite wrong weight.
TEST(Q8Format, NonFiniteWeightMakesItsBlockNaN) {
  std::mt19937 rng(6);
  auto w = random_vec(3 * 64, rng);
  w[40] = std::nanf("");                                  // row 0, block 1
  w[64 + 3] = std::numeric_limits<float>::infinity();     // row 1, block 0
  w[128 + 63] = -std::numeric_limits<float>::infinity();  // row 2, block 1
  const auto back = dequantize(quantize(w, 3, 64), 3, 64);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t b = 0; b < 2; ++b) {
      const bool poisoned = (r == 0 && b == 1) || (r == 1 && b == 0) || (r == 2 && b == 1);
      for (int64_t i = 0; i < 32; ++i) {
        const float v = back[static_cast<size_t>(r * 64 + b * 32 + i)];
        EXPECT_EQ(std::isnan(v), poisoned) << "row " << r << " block " << b << " i " << i;
      }
    }
}

// kQ8 rows -> the int8 panel layout (util/q8_panel.h).
std::vector<uint8_t> q8_panels(const std::vector<uint8_t>& rows, int64_t N, int64_t K) {
  std::vector<uint8_t> p(static_cast<size_t>(panel_count(N) * q8_panel_bytes(K)), 0xee);
  pack_q8_panels(rows.data(), N, K, p.data());
  return p;
}
// Channel-scale panels (kQ8CP16) of rows from quantize_channel.
std::vector<uint8_t> q8c_panels(const std::vector<uint8_t>& rows, int64_t N, int64_t K) {
  std::vector<uint8_t> p(static_cast<size_t>(panel_count(N) * q8c_panel_bytes(K)), 0xee);
  pack_q8c_panels(rows.data(), N, K, p.data());
  return p;
}

// The int8 product equals the scalar reference (and so gemm_nt on the
// dequantized matrix) within the gemm tolerance, and is bit-identical
// batched or not and however the columns are split.
TEST_P(KernelTest, GemmQ8MatchesReferenceAndIsBitExactAcrossBatchAndSplits) {
  std::mt19937 rng(4);
  for (int64_t M : {1, 2, 3, 4, 5, 8, 13}) {
    for (int64_t K : {32, 64, 96, 288, 512, 544, 800, 1056}) {
      for (int64_t N : {1, 2, 3, 4, 5, 8, 9, 17, 37}) {
        const int64_t lda = K + 3, ldc = N + 1;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto Q = quantize(random_vec(N * K, rng), N, K);
        const auto W = dequantize(Q, N, K);
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), R(C), S(C);
        t().gemm_nt_q8(M, 0, N, K, A.data(), lda, Q.data(), C.data(), ldc);
        ref().gemm_nt_q8(M, 0, N, K, A.data(), lda, Q.data(), R.data(), ldc);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = N; n < ldc && m * ldc + n < static_cast<int64_t>(C.size()); ++n)
            ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside [0, N)";
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[m * lda + k] * W[n * K + k]);
            ASSERT_NEAR(C[m * ldc + n], R[m * ldc + n], 1e-5f * std::sqrt(static_cast<float>(K)) * mag)
                << "M=" << M << " K=" << K << " N=" << N;
          }
        // Row by row and in awkward column pieces: the same bits.
        for (int64_t m = 0; m < M; ++m) {
          t().gemm_nt_q8(1, 0, N, K, A.data() + m * lda, lda, Q.data(), S.data() + m * ldc, ldc);
          for (int64_t n = 0; n < N; ++n) ASSERT_EQ(bits(S[m * ldc + n]), bits(C[m * ldc + n])) << "row " << m;
        }
        std::vector<float> split(C.size(), -7.0f);
        for (int64_t n0 = 0; n0 < N; n0 += 3)
          t().gemm_nt_q8(M, n0, n0 + 3 < N ? n0 + 3 : N, K, A.data(), lda, Q.data(), split.data(), ldc);
        for (size_t i = 0; i < C.size(); ++i) ASSERT_EQ(bits(split[i]), bits(C[i])) << "split, i=" << i;
      }
    }
  }
}

// With one-hot weight rows (W[n, k] = [k == n]) each output is one block's
// w_scale * a_scale * q: every table must round the activations to the very
// integers of util/quant.h (quantize_a8_row), ties and tiny blocks included,
// so the outputs are bit-identical to the reference's.
TEST_P(KernelTest, GemmQ8RoundsActivationsExactlyLikeTheReference) {
  std::mt19937 rng(8);
  for (int64_t K : {32, 96, 544}) {
    const int64_t M = 3;
    auto A = random_vec(M * K, rng, -4.0f, 4.0f);
    for (int64_t k = 0; k < 32; ++k) A[static_cast<size_t>(k)] = static_cast<float>(k - 16) * 0.5f;  // ties at x.5
    A[static_cast<size_t>(K + 1)] *= 1e-20f;                                                         // one tiny value
    for (int64_t k = 32; k < 64 && k < K; ++k)
      A[static_cast<size_t>(K + k)] = 1e-33f * static_cast<float>(k);  // < 2^-100
    std::vector<float> eye(static_cast<size_t>(K * K), 0.0f);
    for (int64_t n = 0; n < K; ++n) eye[static_cast<size_t>(n * K + n)] = 1.0f;
    const auto Q = quantize(eye, K, K);
    std::vector<float> C(static_cast<size_t>(M * K)), R(C);
    t().gemm_nt_q8(M, 0, K, K, A.data(), K, Q.data(), C.data(), K);
    ref().gemm_nt_q8(M, 0, K, K, A.data(), K, Q.data(), R.data(), K);
    for (size_t i = 0; i < C.size(); ++i) ASSERT_EQ(bits(C[i]), bits(R[i])) << "K " << K << " i " << i;
    if (K >= 64) {
      EXPECT_EQ(R[static_cast<size_t>(K + 40)], 0.0f) << "a block below 2^-100 counts as zero";
    }
  }
}

// A NaN or inf activation makes its row's results NaN, in every table and
// whatever rows share the call (it used to be rounded to int16 as -32768 in
// the SIMD table, and was undefined behaviour in the reference), and leaves
// the other rows' bits alone.
// K 96 is one partial group; K 544 a full group of 16 blocks (rounded 16
// at a time by the VNNI table), then a partial one. The same for the int8
// panel layout (gemm_nt_q8p16), N 19 a whole panel and a padded one.
TEST_P(KernelTest, GemmQ8NonFiniteActivationGivesNaNRow) {
  std::mt19937 rng(7);
  for (const int64_t K : {int64_t{96}, int64_t{544}}) {
    const int64_t M = 4, N = 19;
    auto A = random_vec(M * K, rng);
    A[1 * K + 37] = std::nanf("");
    A[2 * K + 95] = std::numeric_limits<float>::infinity();
    A[3 * K + 0] = -std::numeric_limits<float>::infinity();
    const auto Wf = random_vec(N * K, rng);
    const auto Q = quantize(Wf, N, K);
    const auto P = q8_panels(Q, N, K);
    const auto PC = q8c_panels(quantize_channel(Wf, N, K), N, K);
    for (const KernelTable* table : {&t(), &ref()}) {
      for (const int layout : {0, 1, 2}) {  // rows, panels, channel-scale panels
        std::vector<float> C(static_cast<size_t>(M * N)), alone(static_cast<size_t>(N));
        if (layout == 1) {
          table->gemm_nt_q8p16(M, 0, N, K, A.data(), K, P.data(), C.data(), N);
          table->gemm_nt_q8p16(1, 0, N, K, A.data(), K, P.data(), alone.data(), N);
        } else if (layout == 2) {
          table->gemm_nt_q8cp16(M, 0, N, K, A.data(), K, PC.data(), C.data(), N);
          table->gemm_nt_q8cp16(1, 0, N, K, A.data(), K, PC.data(), alone.data(), N);
        } else {
          table->gemm_nt_q8(M, 0, N, K, A.data(), K, Q.data(), C.data(), N);
          table->gemm_nt_q8(1, 0, N, K, A.data(), K, Q.data(), alone.data(), N);
        }
        const std::string where = std::string(isa_name(table->isa)) + (layout == 1   ? " panels"
                                                                       : layout == 2 ? " channel panels"
                                                                                     : " rows");
        for (int64_t n = 0; n < N; ++n) {
          ASSERT_TRUE(std::isfinite(C[static_cast<size_t>(n)])) << where << " n " << n;
          ASSERT_EQ(bits(C[static_cast<size_t>(n)]), bits(alone[static_cast<size_t>(n)])) << where;
          for (int64_t m = 1; m < M; ++m)
            ASSERT_TRUE(std::isnan(C[static_cast<size_t>(m * N + n)]))
                << where << " K " << K << " m " << m << " n " << n;
        }
      }
    }
  }
}

// ---- PreparedGemm (gemm_nt_q8 and gemm_nt_bf16dot in two steps) -----------

// Exactly n bytes, 64-byte aligned (what PreparedGemm::prepare asks for), so
// AddressSanitizer sees any access past the prepared rows.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t n) : p_(static_cast<uint8_t*>(::operator new (n == 0 ? 1 : n, std::align_val_t{64}))) {}
  ~AlignedBytes() { ::operator delete (p_, std::align_val_t{64}); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* data() const { return p_; }

 private:
  uint8_t* p_;
};

// Rows prepared once and multiplied in column pieces, and in row ranges
// starting inside the prepared block (a MoE's experts), give the unsplit
// kernel's bits; prepared rows stay within the bound callers size buffers by.
// unsplit(M, A, C) runs the one-step kernel on M rows of A (stride K).
template <class Unsplit>
void expect_prepared_matches(const PreparedGemm& pg, int64_t M, int64_t N, int64_t K, int64_t bound,
                             const std::vector<float>& A, const void* W, int64_t ldw, Unsplit unsplit) {
  const int64_t rb = pg.row_bytes(K);
  ASSERT_LE(rb, bound) << "K=" << K;
  std::vector<float> whole(static_cast<size_t>(M * N), -7.0f);
  unsplit(M, A.data(), whole.data());
  AlignedBytes P(static_cast<size_t>(M * rb));
  pg.prepare(M, K, A.data(), K, P.data());
  for (int64_t step : {N, int64_t{5}, int64_t{16}}) {
    std::vector<float> split(whole.size(), -7.0f);
    for (int64_t n0 = 0; n0 < N; n0 += step)
      pg.gemm(M, n0, std::min(N, n0 + step), K, P.data(), W, ldw, split.data(), N);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_EQ(bits(split[static_cast<size_t>(i)]), bits(whole[static_cast<size_t>(i)]))
          << "K=" << K << " M=" << M << " step=" << step << " i=" << i;
  }
  // Rows r0.. of the prepared block on their own.
  const int64_t r0 = M / 3, rows = M - r0;
  std::vector<float> part(static_cast<size_t>(rows * N), -7.0f);
  pg.gemm(rows, 0, N, K, P.data() + r0 * rb, W, ldw, part.data(), N);
  for (int64_t i = 0; i < rows * N; ++i)
    ASSERT_EQ(bits(part[static_cast<size_t>(i)]), bits(whole[static_cast<size_t>(r0 * N + i)]))
        << "K=" << K << " M=" << M << " rows from " << r0;
}

// The int8 layouts: rows (q8_prepared), panels (q8p16_prepared) and
// channel-scale panels (q8cp16_prepared).
TEST_P(KernelTest, PreparedQ8GemmIsTheUnsplitKernelBitForBit) {
  std::mt19937 rng(21);
  constexpr int64_t N = 37;
  for (int64_t K : {32, 320, 544, 2048}) {
    const auto Wf = random_vec(N * K, rng);
    const auto Q = quantize(Wf, N, K);
    const auto P = q8_panels(Q, N, K);
    const auto PC = q8c_panels(quantize_channel(Wf, N, K), N, K);
    for (int64_t M : {1, 3, 8, 9, 70}) {
      const auto A = random_vec(M * K, rng);
      expect_prepared_matches(
          t().q8_prepared, M, N, K, q8_prepared_row_bytes_bound(K), A, Q.data(), 0,
          [&](int64_t m, const float* a, float* c) { t().gemm_nt_q8(m, 0, N, K, a, K, Q.data(), c, N); });
      expect_prepared_matches(
          t().q8p16_prepared, M, N, K, q8_prepared_row_bytes_bound(K), A, P.data(), 0,
          [&](int64_t m, const float* a, float* c) { t().gemm_nt_q8p16(m, 0, N, K, a, K, P.data(), c, N); });
      expect_prepared_matches(
          t().q8cp16_prepared, M, N, K, q8_prepared_row_bytes_bound(K), A, PC.data(), 0,
          [&](int64_t m, const float* a, float* c) { t().gemm_nt_q8cp16(m, 0, N, K, a, K, PC.data(), c, N); });
    }
  }
  EXPECT_LE(t().q8_prepared.row_bytes(kQ8MaxK), q8_prepared_row_bytes_bound(kQ8MaxK));
  EXPECT_LE(t().q8p16_prepared.row_bytes(kQ8MaxK), q8_prepared_row_bytes_bound(kQ8MaxK));
  EXPECT_LE(t().q8cp16_prepared.row_bytes(kQ8MaxK), q8_prepared_row_bytes_bound(kQ8MaxK));
}

// The bf16 dot product over bf16 panels (kernels.h, bf16dotp16_prepared):
// every table rounds the rows to bf16 into K floats and runs its panel
// kernel on them, so each element is the scalar gemm_nt_bf16p16 on the
// rounded rows bit for bit, whatever M or the column split (the panel
// contract; the splits cut panels), and agrees with the row layout's
// gemm_nt_bf16dot (another summation order) within the gemm tolerance.
// Buffers are sized exactly.
TEST_P(KernelTest, GemmBf16DotPanelsBitExactVsReference) {
  std::mt19937 rng(14);
  const PreparedGemm& pg = t().bf16dotp16_prepared;
  for (int64_t K : {1, 7, 16, 17, 100, 513}) {
    // The runtime hands the prepared rows to gemm_nt_bf16p16 as floats
    // (runtime/ops/op_call.h), so this is the contract, not a detail.
    ASSERT_EQ(pg.row_bytes(K), 4 * K);
    for (int64_t N : {1, 16, 17, 75}) {
      const auto W16 = random_bf16(N * K, rng);
      std::vector<uint16_t> P16(static_cast<size_t>(panel_count(N) * ir::kPanelRows * K));
      pack_panels(W16.data(), N, K, P16.data());
      for (int64_t M : {1, 4, 9, 13, 37}) {
        const int64_t lda = K + 3, ldc = N + 1;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng, -3.0f, 3.0f);
        std::vector<float> Ar(static_cast<size_t>(M * K));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < K; ++k) Ar[m * K + k] = bf16_to_f32(f32_to_bf16(A[m * lda + k]));
        AlignedBytes P(static_cast<size_t>(M * K * 4));
        pg.prepare(M, K, A.data(), lda, P.data());
        std::vector<float> C(strided_size(M, N, ldc), -7.0f), R(C), Rows(C), Split(C);
        pg.gemm(M, 0, N, K, P.data(), P16.data(), 0, C.data(), ldc);
        ref().gemm_nt_bf16p16(M, 0, N, K, Ar.data(), K, P16.data(), R.data(), ldc, {});
        ref().gemm_nt_bf16dot(M, 0, N, K, A.data(), lda, W16.data(), K, Rows.data(), ldc);
        for (int64_t n0 = 0; n0 < N; n0 += 5)
          pg.gemm(M, n0, std::min(N, n0 + 5), K, P.data(), P16.data(), 0, Split.data(), ldc);
        for (int64_t m = 0; m < M; ++m) {
          std::vector<float> one(static_cast<size_t>(N));
          pg.gemm(1, 0, N, K, P.data() + m * K * 4, P16.data(), 0, one.data(), N);
          for (int64_t n = 0; n < N; ++n) {
            const int64_t i = m * ldc + n;
            ASSERT_EQ(bits(C[i]), bits(R[i])) << "M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
            ASSERT_EQ(bits(Split[i]), bits(C[i])) << "split M=" << M << " K=" << K << " N=" << N;
            ASSERT_EQ(bits(one[n]), bits(C[i])) << "one row M=" << M << " K=" << K << " N=" << N << " m=" << m;
            float mag = 0.0f;
            for (int64_t k = 0; k < K; ++k) mag += std::fabs(Ar[m * K + k] * bf16_to_f32(W16[n * K + k]));
            ASSERT_NEAR(C[i], Rows[i], 1e-5f * std::sqrt(static_cast<float>(K)) * mag) << "M=" << M << " K=" << K;
          }
          if (m + 1 < M) {  // the last row ends at N
            ASSERT_EQ(C[m * ldc + N], -7.0f) << "wrote outside [0, N)";
          }
        }
      }
    }
  }
}

// prepare_cols, where a layout offers it, writes the bytes prepare writes for
// its columns: rows rounded in column pieces, in either order, are the rows
// rounded whole (a NaN block included). Every byte is compared over two
// fillings of the buffers, so a byte neither call writes, or one only the
// whole call writes, cannot match by chance. The scalar table offers it, so
// the MoE's path that rounds hidden rows per thread runs on every machine.
TEST_P(KernelTest, PreparedColumnPiecesAreTheWholeRowsBytes) {
  std::mt19937 rng(23);
  const PreparedGemm* kinds[] = {&t().q8_prepared,      &t().q8p16_prepared,         &t().q8cp16_prepared,
                                 &t().bf16dot_prepared, &t().bf16dot_tiles_prepared, &t().bf16dotp16_prepared};
  if (GetParam().isa == Isa::kScalar) {
    for (const PreparedGemm* pg : kinds) ASSERT_NE(pg->prepare_cols, nullptr);
  }
  for (const PreparedGemm* pg : kinds) {
    if (pg->prepare_cols == nullptr) continue;
    ASSERT_GT(pg->col_group, 0);
    for (int64_t K : {32, 320, 544, 1024, 1536, 2048}) {
      for (int64_t M : {1, 3}) {
        auto A = random_vec(M * K, rng);
        A[static_cast<size_t>(K - 1)] = std::numeric_limits<float>::quiet_NaN();  // row 0's last block
        const auto rb = static_cast<size_t>(pg->row_bytes(K));
        for (int64_t step : {pg->col_group, 2 * pg->col_group, K}) {
          for (bool reverse : {false, true}) {
            for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}}) {
              AlignedBytes whole(static_cast<size_t>(M) * rb), pieces(static_cast<size_t>(M) * rb);
              std::memset(whole.data(), fill, static_cast<size_t>(M) * rb);
              std::memset(pieces.data(), fill, static_cast<size_t>(M) * rb);
              pg->prepare(M, K, A.data(), K, whole.data());
              std::vector<std::pair<int64_t, int64_t>> ranges;
              for (int64_t k0 = 0; k0 < K; k0 += step) ranges.emplace_back(k0, std::min(K, k0 + step));
              if (reverse) std::reverse(ranges.begin(), ranges.end());
              for (auto [k0, k1] : ranges) pg->prepare_cols(M, K, k0, k1, A.data(), K, pieces.data());
              ASSERT_EQ(std::memcmp(whole.data(), pieces.data(), static_cast<size_t>(M) * rb), 0)
                  << "K=" << K << " M=" << M << " step=" << step << " reverse=" << reverse;
            }
          }
        }
      }
    }
  }
}

// ---- int8 panels (gemm_nt_q8p16, util/q8_panel.h) -------------------------

TEST(Q8PanelFormat, PanelsHoldTheRowsValuesAndScalesAndPadWithZeroWeights) {
  std::mt19937 rng(31);
  for (int64_t N : {1, 15, 16, 17, 40}) {
    for (int64_t K : {32, 96, 544}) {
      const auto Q = quantize(random_vec(N * K, rng), N, K);
      const auto P = q8_panels(Q, N, K);
      const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
      for (int64_t n = 0; n < panel_count(N) * ir::kPanelRows; ++n) {
        const uint8_t* panel = P.data() + n / ir::kPanelRows * q8_panel_bytes(K);
        for (int64_t k = 0; k < K; ++k) {
          const int8_t want = n < N ? static_cast<int8_t>(Q[static_cast<size_t>(n * rb + q8_offset(k, K))]) : 0;
          ASSERT_EQ(q8_panel_q(P.data(), K, n, k), want) << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
        }
        for (int64_t b = 0; b < K / 32; ++b) {
          const float want = n < N ? q8_scale(Q.data() + n * rb, K, b) : 0.0f;
          ASSERT_EQ(bits(q8_panel_scale(panel, K, n % ir::kPanelRows, b)), bits(want)) << "n=" << n << " b=" << b;
        }
      }
      // Stored offset by 128: a padding row's weights are the byte 0x80.
      if (N % ir::kPanelRows != 0) {
        const uint8_t* last = P.data() + (panel_count(N) - 1) * q8_panel_bytes(K);
        for (int64_t k = 0; k < K; ++k)
          ASSERT_EQ(last[q8_panel_offset(ir::kPanelRows - 1, k)], 0x80) << "N=" << N << " k=" << k;
      }
    }
  }
  EXPECT_EQ(q8_panel_bytes(512), static_cast<int64_t>(16 * ir::q8_row_bytes(512)));
  // The size the loaders check: whole padded panels, rows of whole blocks.
  const auto bytes = ir::dtype_bytes(ir::DType::kQ8P16, std::vector<int64_t>{17, 96});
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(*bytes, static_cast<uint64_t>(panel_count(17) * q8_panel_bytes(96)));
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8P16, std::vector<int64_t>{16, 40}).has_value()) << "partial block";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8P16, std::vector<int64_t>{16}).has_value()) << "not a matrix";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8P16, std::vector<int64_t>{INT64_MAX, 32}).has_value()) << "overflow";
}

// Each table's int8 panel product equals the scalar one bit for bit (one
// fma chain over the blocks, kernels.h), lies within the gemm tolerance of
// the row layout's product on the same weights, and writes nothing outside
// [0, N). K: one block, a partial group of blocks (96, 320), a full group,
// a full group and a partial one, several groups.
TEST_P(KernelTest, GemmQ8PanelsBitExactVsScalarAndNearTheRows) {
  std::mt19937 rng(32);
  for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 13, 37}) {
    for (int64_t K : {32, 96, 320, 512, 544, 1056}) {
      for (int64_t N : {1, 3, 15, 16, 17, 33, 64, 100}) {
        const int64_t lda = K + 3, ldc = N + 1;
        const auto A = random_vec(static_cast<int64_t>(strided_size(M, K, lda)), rng);
        const auto Wf = random_vec(N * K, rng);
        for (const bool channel : {false, true}) {
          const auto Q = channel ? quantize_channel(Wf, N, K) : quantize(Wf, N, K);
          const auto P = channel ? q8c_panels(Q, N, K) : q8_panels(Q, N, K);
          const auto W = dequantize(Q, N, K);
          std::vector<float> C(strided_size(M, N, ldc), -7.0f), R(C), Rows(C);
          const auto gemm = channel ? &KernelTable::gemm_nt_q8cp16 : &KernelTable::gemm_nt_q8p16;
          (t().*gemm)(M, 0, N, K, A.data(), lda, P.data(), C.data(), ldc);
          (ref().*gemm)(M, 0, N, K, A.data(), lda, P.data(), R.data(), ldc);
          ref().gemm_nt_q8(M, 0, N, K, A.data(), lda, Q.data(), Rows.data(), ldc);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const int64_t i = m * ldc + n;
              ASSERT_EQ(bits(C[i]), bits(R[i]))
                  << "channel " << channel << " M=" << M << " K=" << K << " N=" << N << " m=" << m << " n=" << n;
              float mag = 0.0f;
              for (int64_t k = 0; k < K; ++k) mag += std::fabs(A[m * lda + k] * W[n * K + k]);
              ASSERT_NEAR(C[i], Rows[i], 1e-5f * std::sqrt(static_cast<float>(K)) * mag)
                  << "channel " << channel << " M=" << M << " K=" << K;
            }
            for (int64_t n = N; n < ldc && m * ldc + n < static_cast<int64_t>(C.size()); ++n)
              ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside [0, N)";
          }
        }
      }
    }
  }
}

// Batched rows equal single-row calls, and any column split (cutting panels
// or not) equals one whole call, bit for bit.
TEST_P(KernelTest, GemmQ8PanelsBitExactAcrossBatchAndSplits) {
  std::mt19937 rng(33);
  constexpr int64_t N = 75;  // four whole panels and a partial one
  for (int64_t K : {32, 320, 1056}) {
    for (const bool channel : {false, true}) {
      const auto Wf = random_vec(N * K, rng);
      const auto P = channel ? q8c_panels(quantize_channel(Wf, N, K), N, K) : q8_panels(quantize(Wf, N, K), N, K);
      const auto gemm = channel ? &KernelTable::gemm_nt_q8cp16 : &KernelTable::gemm_nt_q8p16;
      for (int64_t M : {5, 8, 13}) {
        const auto A = random_vec(M * K, rng);
        std::vector<float> whole(static_cast<size_t>(M * N));
        (t().*gemm)(M, 0, N, K, A.data(), K, P.data(), whole.data(), N);
        std::vector<float> single(static_cast<size_t>(N));
        for (int64_t m = 0; m < M; ++m) {
          (t().*gemm)(1, 0, N, K, A.data() + m * K, K, P.data(), single.data(), N);
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(bits(single[n]), bits(whole[m * N + n])) << "K=" << K << " M=" << M << " m=" << m << " n=" << n;
        }
        for (int64_t step : {1, 5, 16, 21, 32}) {
          std::vector<float> split(static_cast<size_t>(M * N), 0.0f);
          for (int64_t n0 = 0; n0 < N; n0 += step)
            (t().*gemm)(M, n0, n0 + step < N ? n0 + step : N, K, A.data(), K, P.data(), split.data(), N);
          for (int64_t i = 0; i < M * N; ++i)
            ASSERT_EQ(bits(split[i]), bits(whole[i]))
                << "channel " << channel << " K=" << K << " M=" << M << " step=" << step;
        }
      }
    }
  }
}

// ---- int8 with one scale per channel (util/quant.h, util/q8_panel.h) -------

// q8_rows_share_scale reads every group's scales (each group's sit after
// its values, util/quant.h): rows of several groups quantized per channel
// share one, and a single block of a later group with another scale is
// found. (Reading the scales as one run after the values, as .k3m version
// 3 stored them, never matched at K over 512: int8-channel panels were then
// silently not packed.)
TEST(Q8ChannelFormat, ShareScaleReadsEveryGroupsScales) {
  std::mt19937 rng(35);
  constexpr int64_t N = 3, K = 1056;  // groups of 16, 16 and 1 blocks
  const auto w = random_vec(N * K, rng);
  auto Q = quantize_channel(w, N, K);
  EXPECT_TRUE(q8_rows_share_scale(Q.data(), N, K));
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  for (int64_t b : {17, 32}) {  // a block in the second group, the last group's one
    auto bad = Q;
    bad[static_cast<size_t>(2 * rb + q8_scale_offset(b, K))] ^= 1;
    EXPECT_FALSE(q8_rows_share_scale(bad.data(), N, K)) << b;
  }
}

// quantize_q8_row_channel: every block of a row holds the row's scale,
// absmax / 127 rounded up to an f16, so no weight is clamped and each is
// within half a step of its value; a NaN or inf poisons the whole row, an
// all-zero row is scale 0.
TEST(Q8ChannelFormat, OneScalePerRowRoundedUpAndPoisonedWhole) {
  std::mt19937 rng(34);
  constexpr int64_t N = 5, K = 96;
  auto w = random_vec(N * K, rng);
  w[1 * K + 70] = 3.5f;  // row 1's largest, in its last block
  for (int64_t k = 0; k < K; ++k) w[2 * K + k] = 0.0f;
  w[3 * K + 5] = std::nanf("");
  w[4 * K + 40] = -std::numeric_limits<float>::infinity();
  const auto Q = quantize_channel(w, N, K);
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  EXPECT_TRUE(q8_rows_share_scale(Q.data(), N, K));
  EXPECT_FALSE(q8_rows_share_scale(quantize(w, N, K).data(), N, K)) << "block scales differ";
  for (int64_t n = 0; n < 2; ++n) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(w[n * K + k]));
    const float s = q8_scale(Q.data() + n * rb, K, 0);
    EXPECT_GE(s, amax / 127.0f) << "rounded up";
    EXPECT_LT(s, amax / 127.0f * 1.001f) << "to the next f16";
    for (int64_t k = 0; k < K; ++k)
      ASSERT_NEAR(q8_weight(Q.data() + n * rb, K, k), w[n * K + k], 0.5f * s + 1e-7f) << "n " << n << " k " << k;
  }
  EXPECT_EQ(q8_weight(Q.data() + 1 * rb, K, 70), 127.0f * q8_scale(Q.data() + 1 * rb, K, 2));
  EXPECT_EQ(q8_scale(Q.data() + 2 * rb, K, 0), 0.0f);
  for (int64_t n = 3; n < 5; ++n)
    for (int64_t b = 0; b < K / 32; ++b) EXPECT_TRUE(std::isnan(q8_scale(Q.data() + n * rb, K, b))) << n;
}

// pack_q8c_panels keeps the rows' values and their one scale each as f32;
// padding rows are weight 0, scale 0; the loaders' size check.
TEST(Q8ChannelFormat, PanelsHoldTheRowsValuesAndScale) {
  std::mt19937 rng(35);
  for (int64_t N : {1, 16, 17, 40}) {
    for (int64_t K : {32, 544}) {
      const auto Q = quantize_channel(random_vec(N * K, rng), N, K);
      const auto P = q8c_panels(Q, N, K);
      const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
      for (int64_t n = 0; n < panel_count(N) * ir::kPanelRows; ++n) {
        const uint8_t* panel = P.data() + n / ir::kPanelRows * q8c_panel_bytes(K);
        for (int64_t k = 0; k < K; ++k) {
          const int8_t want = n < N ? static_cast<int8_t>(Q[static_cast<size_t>(n * rb + q8_offset(k, K))]) : 0;
          ASSERT_EQ(q8c_panel_q(P.data(), K, n, k), want) << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
          if (n < N) {
            ASSERT_EQ(q8c_panel_weight(P.data(), K, n, k), q8_weight(Q.data() + n * rb, K, k));
          }
        }
        const float want = n < N ? q8_scale(Q.data() + n * rb, K, 0) : 0.0f;
        ASSERT_EQ(bits(q8c_panel_scale(panel, K, n % ir::kPanelRows)), bits(want)) << "n=" << n;
      }
    }
  }
  EXPECT_EQ(q8c_panel_bytes(512) % 64, 0) << "panels stay 64-byte aligned";
  // Rows of no weights (K = 0) have no scale to read: the panel's scales
  // are 0 (ASan would catch a read past the empty rows).
  const std::vector<uint8_t> no_rows;
  std::vector<uint8_t> empty(static_cast<size_t>(q8c_panel_bytes(0)), 0xee);
  pack_q8c_panels(no_rows.data(), 3, 0, empty.data());
  for (int64_t c = 0; c < ir::kPanelRows; ++c) EXPECT_EQ(q8c_panel_scale(empty.data(), 0, c), 0.0f) << c;
  const auto bytes = ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{17, 96});
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(*bytes, static_cast<uint64_t>(panel_count(17) * q8c_panel_bytes(96)));
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{16, 40}).has_value()) << "partial block";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{16, -32}).has_value()) << "negative";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{16}).has_value()) << "not a matrix";
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{INT64_MAX, 32}).has_value()) << "overflow";
  // 5.5e17 rows of 32: the int8 values fit in 64 bits, the scales do not.
  EXPECT_FALSE(ir::dtype_bytes(ir::DType::kQ8CP16, std::vector<int64_t>{550000000000000000, 32}).has_value())
      << "overflow adding the scales";
}

TEST_P(KernelTest, PreparedBf16DotGemmIsTheUnsplitKernelBitForBit) {
  std::mt19937 rng(22);
  constexpr int64_t N = 37;
  for (int64_t K : {1, 17, 33, 320, 1000}) {
    const auto W = random_bf16(N * K, rng);
    for (int64_t M : {1, 3, 8, 9, 70}) {
      const auto A = random_vec(M * K, rng);
      expect_prepared_matches(
          t().bf16dot_prepared, M, N, K, bf16dot_prepared_row_bytes_bound(K), A, W.data(), K,
          [&](int64_t m, const float* a, float* c) { t().gemm_nt_bf16dot(m, 0, N, K, a, K, W.data(), K, c, N); });
    }
  }
  for (int64_t K : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, kBf16DotMaxK})
    EXPECT_LE(t().bf16dot_prepared.row_bytes(K), bf16dot_prepared_row_bytes_bound(K)) << K;
}

// The tile layout (kBF16DotT16): each table's product on the tiles is its
// product on the rows, bit for bit, whatever the column split (ranges on and
// off the 16-row blocks) or the rows prepared; K across the 32-column steps,
// their tail and (4500) the amx table's passes over k.
TEST_P(KernelTest, Bf16DotTilesAreTheRowsBitForBit) {
  std::mt19937 rng(23);
  for (int64_t N : {1, 16, 37}) {
    for (int64_t K : {1, 31, 32, 100, 513, 4500}) {
      const auto W = random_bf16(N * K, rng);
      std::vector<uint16_t> T(static_cast<size_t>(tile_block_count(N) * 16 * tile_padded_cols(K)));
      pack_tiles(W.data(), N, K, T.data());
      for (int64_t M : K == 4500 ? std::vector<int64_t>{1, 20} : std::vector<int64_t>{1, 3, 17, 40}) {
        const auto A = random_vec(M * K, rng);
        const PreparedGemm& rows = t().bf16dot_prepared;
        const PreparedGemm& tiles = t().bf16dot_tiles_prepared;
        ASSERT_EQ(tiles.row_bytes(K), rows.row_bytes(K));
        AlignedBytes P(static_cast<size_t>(M * rows.row_bytes(K)));
        rows.prepare(M, K, A.data(), K, P.data());
        std::vector<float> want(static_cast<size_t>(M * N), -7.0f);
        rows.gemm(M, 0, N, K, P.data(), W.data(), K, want.data(), N);
        for (int64_t step : {N, int64_t{5}, int64_t{16}}) {
          std::vector<float> got(want.size(), -7.0f);
          for (int64_t n0 = 0; n0 < N; n0 += step)
            tiles.gemm(M, n0, std::min(N, n0 + step), K, P.data(), T.data(), 0, got.data(), N);
          for (int64_t i = 0; i < M * N; ++i)
            ASSERT_EQ(bits(got[static_cast<size_t>(i)]), bits(want[static_cast<size_t>(i)]))
                << "N=" << N << " K=" << K << " M=" << M << " step=" << step << " i=" << i;
        }
      }
    }
  }
}

// ---- element-wise ----------------------------------------------------------

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::fmax(1.0f, std::fabs(want[i])))
        << what << " n=" << got.size() << " i=" << i;
}

TEST_P(KernelTest, Gelu) {
  std::mt19937 rng(3);
  for (int64_t n : kSizes) {
    const auto x = random_vec(n, rng, -8.0f, 8.0f);
    std::vector<float> y(x.size()), r(x.size());
    t().gelu(x.data(), n, y.data());
    ref().gelu(x.data(), n, r.data());
    expect_close(y, r, 2e-6f, "gelu");
    std::vector<float> inplace = x;  // y aliases x
    t().gelu(inplace.data(), n, inplace.data());
    expect_close(inplace, r, 2e-6f, "gelu in place");
  }
  // Extremes and the region where erf saturates.
  const std::vector<float> x = {0.0f,   -0.0f, 1e-3f,  -1e-3f, 3.0f,  -3.0f, -5.5f,  5.5f,   -5.66f,
                                -10.0f, 10.0f, -50.0f, 50.0f,  -1e4f, 1e4f,  1e-30f, -1e-30f};
  std::vector<float> y(x.size()), r(x.size());
  t().gelu(x.data(), static_cast<int64_t>(x.size()), y.data());
  ref().gelu(x.data(), static_cast<int64_t>(x.size()), r.data());
  expect_close(y, r, 2e-6f, "gelu extremes");
}

TEST_P(KernelTest, SiluMul) {
  std::mt19937 rng(4);
  for (int64_t n : kSizes) {
    const auto g = random_vec(n, rng, -20.0f, 20.0f);
    const auto u = random_vec(n, rng, -2.0f, 2.0f);
    std::vector<float> y(g.size()), r(g.size());
    t().silu_mul(g.data(), u.data(), n, y.data());
    ref().silu_mul(g.data(), u.data(), n, r.data());
    expect_close(y, r, 2e-6f, "silu_mul");
    std::vector<float> ag = g, au = u;  // y aliases g, then u
    t().silu_mul(ag.data(), u.data(), n, ag.data());
    t().silu_mul(g.data(), au.data(), n, au.data());
    expect_close(ag, r, 2e-6f, "silu_mul y=g");
    expect_close(au, r, 2e-6f, "silu_mul y=u");
  }
  // Saturation: silu(-100) ~ -0, silu(100) = 100, no inf or NaN anywhere.
  const std::vector<float> g = {-100.0f, 100.0f, -88.5f, 88.5f, -87.0f, 87.0f, -1e4f, 1e4f, 0.0f};
  const std::vector<float> u(g.size(), 1.0f);
  std::vector<float> y(g.size()), r(g.size());
  t().silu_mul(g.data(), u.data(), static_cast<int64_t>(g.size()), y.data());
  ref().silu_mul(g.data(), u.data(), static_cast<int64_t>(g.size()), r.data());
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  expect_close(y, r, 2e-6f, "silu_mul extremes");
  EXPECT_EQ(y[1], 100.0f);
  EXPECT_EQ(y[7], 1e4f);
}

TEST_P(KernelTest, AddAndAxpy) {
  std::mt19937 rng(5);
  for (int64_t n : kSizes) {
    const auto a = random_vec(n, rng), b = random_vec(n, rng);
    std::vector<float> y(a.size()), r(a.size());
    t().add(a.data(), b.data(), n, y.data());
    ref().add(a.data(), b.data(), n, r.data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(r[i])) << "add n=" << n;
    std::vector<float> ya = a, yb = b;  // aliasing
    t().add(ya.data(), b.data(), n, ya.data());
    t().add(a.data(), yb.data(), n, yb.data());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(bits(ya[i]), bits(r[i]));
      ASSERT_EQ(bits(yb[i]), bits(r[i]));
    }

    std::vector<float> ys = b, rs = b;
    t().axpy(-0.75f, a.data(), n, ys.data());
    ref().axpy(-0.75f, a.data(), n, rs.data());
    expect_close(ys, rs, 1e-6f, "axpy");
  }
}

// The sampling kernels' sizes: the awkward ones and a vocabulary.
std::vector<int64_t> sampling_sizes() {
  std::vector<int64_t> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back(32000);
  return sizes;
}
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

TEST_P(KernelTest, ArgmaxIsTheReferenceIndex) {
  std::mt19937 rng(15);
  for (int64_t n : sampling_sizes()) {
    auto x = random_vec(n, rng);
    auto check = [&](const char* what) {
      const int64_t want = ref().argmax(x.data(), n);
      ASSERT_EQ(t().argmax(x.data(), n), want) << what << " n=" << n;
      if (n > 0) {
        ASSERT_TRUE(std::isnan(x[static_cast<size_t>(want)]) || !(x[static_cast<size_t>(want)] < x[0]));
      }
    };
    check("random");
    if (n == 0) {
      ASSERT_EQ(t().argmax(x.data(), 0), 0);
      continue;
    }
    const auto at = [&](double f) { return static_cast<size_t>(f * static_cast<double>(n - 1)); };
    // A tie for the maximum: the lower index wins, wherever the two sit
    // (either side of a vector boundary, in the tail).
    x[at(0.7)] = 2.0f;
    x[at(0.3)] = 2.0f;
    check("tie");
    ASSERT_EQ(t().argmax(x.data(), n), static_cast<int64_t>(at(0.3)));
    // NaN skipped: at the start, at the maximum's place, everywhere but one.
    x[0] = kNaN;
    x[at(0.3)] = kNaN;
    check("nan");
    std::fill(x.begin(), x.end(), kNaN);
    check("all nan");
    ASSERT_EQ(t().argmax(x.data(), n), 0);
    x[n - 1] = -kInf;
    check("nan and one -inf");
    ASSERT_EQ(t().argmax(x.data(), n), n - 1);
    // Infinities and signed zeros.
    std::fill(x.begin(), x.end(), -kInf);
    check("all -inf");
    x[at(0.5)] = kInf;
    check("+inf");
    std::fill(x.begin(), x.end(), -1.0f);
    x[at(0.9)] = 0.0f;
    x[at(0.6)] = -0.0f;
    check("signed zeros");
    ASSERT_EQ(t().argmax(x.data(), n), static_cast<int64_t>(std::min(at(0.6), at(0.9))));
  }
}

TEST_P(KernelTest, IndicesAtLeastAreTheReferences) {
  std::mt19937 rng(16);
  for (int64_t n : sampling_sizes()) {
    auto x = random_vec(n, rng);
    for (size_t i = 0; i < x.size(); i += 5) x[i] = i % 2 == 0 ? kNaN : -kInf;
    if (n > 2) x[static_cast<size_t>(n / 2)] = kInf;
    for (float th : {-kInf, -1.0f, 0.0f, 0.9f, kInf}) {
      std::vector<int32_t> got(static_cast<size_t>(n) + 1, -7), want(static_cast<size_t>(n) + 1, -7);
      const int64_t c = t().indices_at_least(x.data(), n, th, 100, got.data());
      const int64_t r = ref().indices_at_least(x.data(), n, th, 100, want.data());
      ASSERT_EQ(c, r) << "n=" << n << " t=" << th;
      ASSERT_EQ(got, want) << "n=" << n << " t=" << th;  // and nothing written past the count
    }
  }
}

TEST_P(KernelTest, ExpShiftedIsTheReferences) {
  std::mt19937 rng(17);
  for (int64_t n : sampling_sizes()) {
    auto x = random_vec(n, rng, -30.0f, 5.0f);
    if (n > 3) {
      x[0] = -kInf;
      x[1] = kNaN;
      x[2] = -200.0f;  // below the floor once shifted
    }
    for (float inv_t : {1.0f, 1.25f, 4.0f}) {
      std::vector<float> p(x.size(), -1.0f), r(x.size(), -1.0f);
      const float sum = t().exp_shifted(x.data(), n, 5.0f, inv_t, p.data());
      const float rsum = ref().exp_shifted(x.data(), n, 5.0f, inv_t, r.data());
      for (size_t i = 0; i < p.size(); ++i) {
        if (r[i] == 0.0f) {
          ASSERT_EQ(p[i], 0.0f) << "n=" << n << " i=" << i;
        } else {
          ASSERT_NEAR(p[i], r[i], 2e-6f * std::max(1.0f, std::fabs(r[i]))) << "n=" << n << " i=" << i;
        }
      }
      ASSERT_NEAR(sum, rsum, 1e-5f * std::max(1.0f, rsum)) << "n=" << n;
    }
  }
}

// ---- normalisation ---------------------------------------------------------

TEST_P(KernelTest, LayerNorm) {
  std::mt19937 rng(6);
  for (int64_t n : kSizes) {
    // An offset mean checks the two-pass variance.
    const auto x = random_vec(n, rng, 2.0f, 4.0f);
    const auto w = random_vec(n, rng, 0.5f, 1.5f), b = random_vec(n, rng);
    std::vector<float> y(x.size()), r(x.size());
    t().layernorm(x.data(), w.data(), b.data(), 1e-5f, n, y.data());
    ref().layernorm(x.data(), w.data(), b.data(), 1e-5f, n, r.data());
    expect_close(y, r, 1e-5f, "layernorm");
  }
}

TEST_P(KernelTest, RmsNorm) {
  std::mt19937 rng(7);
  for (int64_t n : kSizes) {
    const auto x = random_vec(n, rng, -3.0f, 3.0f);
    const auto w = random_vec(n, rng, 0.5f, 1.5f);
    std::vector<float> y(x.size()), r(x.size());
    t().rmsnorm(x.data(), w.data(), 1e-6f, n, y.data());
    ref().rmsnorm(x.data(), w.data(), 1e-6f, n, r.data());
    expect_close(y, r, 1e-5f, "rmsnorm");
    std::vector<float> inplace = x;
    t().rmsnorm(inplace.data(), w.data(), 1e-6f, n, inplace.data());
    expect_close(inplace, r, 1e-5f, "rmsnorm in place");
  }
}

// ---- attention -------------------------------------------------------------

// Runs t and the reference on the same cache; |out - ref| <= tol * max|V|.
// The stats (the largest score and the sum of exp(score - max)) agree too:
// the attention op merges pieces of a row by them.
void check_attend(const KernelTable& t, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, int64_t len, int64_t hd, int64_t stride, float scale, float tol) {
  std::vector<float> out(static_cast<size_t>(hd), 123.0f), want(static_cast<size_t>(hd));
  const AttendStats got_s = t.attend(q.data(), k.data(), v.data(), len, hd, stride, scale, out.data());
  const AttendStats want_s = scalar_table().attend(q.data(), k.data(), v.data(), len, hd, stride, scale, want.data());
  float vmax = 0.0f;
  for (float x : v) vmax = std::fmax(vmax, std::fabs(x));
  for (int64_t i = 0; i < hd; ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "len=" << len << " hd=" << hd << " i=" << i;
    ASSERT_NEAR(out[i], want[i], tol * std::fmax(vmax, 1e-30f))
        << "len=" << len << " hd=" << hd << " stride=" << stride << " i=" << i;
  }
  ASSERT_NEAR(got_s.max, want_s.max, 1e-5f * std::fmax(1.0f, std::fabs(want_s.max))) << "len=" << len << " hd=" << hd;
  ASSERT_GE(want_s.sum, 1.0f);  // the max's own term is exp(0)
  ASSERT_NEAR(got_s.sum, want_s.sum, 1e-5f * want_s.sum) << "len=" << len << " hd=" << hd;
}

// Strides past hd and equal to it (the attention op's rows, which the
// AVX-512 table takes 16 positions at a time); len runs through every
// block tail.
TEST_P(KernelTest, AttendMatchesReference) {
  std::mt19937 rng(8);
  // 300 exceeds the register-resident width of both SIMD tables (fallback path).
  for (int64_t hd : {16, 64, 128, 80, 1, 3, 136, 300})
    for (int64_t stride : {hd + 5, hd}) {
      const int64_t max_len = hd <= 128 ? 300 : 40;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const auto q = random_vec(hd, rng, -2.0f, 2.0f);
      const auto k = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng, -2.0f, 2.0f);
      const auto v = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng);
      for (int64_t len = 1; len <= max_len; ++len) {
        // Exact-size copies so the last row of a shorter cache ends the buffer.
        const size_t size = strided_size(len, hd, stride);
        const std::vector<float> kl(k.begin(), k.begin() + static_cast<ptrdiff_t>(size));
        const std::vector<float> vl(v.begin(), v.begin() + static_cast<ptrdiff_t>(size));
        check_attend(t(), q, kl, vl, len, hd, stride, scale, 5e-6f);
      }
    }
}

// Caches longer than the AVX-512 kernel's 512-position score chunks, with
// the largest score in a later chunk (which rescales what the first chunk
// summed) or in the first one.
TEST_P(KernelTest, AttendMatchesReferenceAcrossScoreChunks) {
  std::mt19937 rng(21);
  for (int64_t hd : {64, 128, 80})
    for (int64_t peak : {int64_t{3}, int64_t{900}}) {
      const int64_t max_len = 1300;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const auto q = random_vec(hd, rng, -2.0f, 2.0f);
      auto k = random_vec(max_len * hd, rng, -2.0f, 2.0f);
      const auto v = random_vec(max_len * hd, rng);
      for (int64_t i = 0; i < hd; ++i) k[static_cast<size_t>(peak * hd + i)] = 2.0f * q[static_cast<size_t>(i)];
      for (int64_t len : {int64_t{511}, int64_t{512}, int64_t{513}, int64_t{1024}, int64_t{1100}, max_len}) {
        const std::vector<float> kl(k.begin(), k.begin() + len * hd), vl(v.begin(), v.begin() + len * hd);
        check_attend(t(), q, kl, vl, len, hd, hd, scale, 5e-6f);
      }
    }
}

// attend_cached leaves out only prefetch hints: the same bits as attend,
// for f32 and bf16 rows, dense (the attention op's) and strided.
TEST_P(KernelTest, AttendCachedIsAttendBitForBit) {
  std::mt19937 rng(23);
  for (int64_t hd : {64, 16, 128, 80})
    for (int64_t stride : {hd, hd + 5}) {
      const int64_t max_len = 1100;
      const auto q = random_vec(hd, rng, -2.0f, 2.0f);
      const auto k = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng, -2.0f, 2.0f);
      const auto v = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng);
      std::vector<uint16_t> k16(k.size()), v16(v.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k16[i] = f32_to_bf16(k[i]);
        v16[i] = f32_to_bf16(v[i]);
      }
      for (int64_t len : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100}, int64_t{513}, max_len}) {
        const size_t size = strided_size(len, hd, stride);
        const std::vector<float> kl(k.begin(), k.begin() + static_cast<ptrdiff_t>(size));
        const std::vector<float> vl(v.begin(), v.begin() + static_cast<ptrdiff_t>(size));
        const std::vector<uint16_t> kl16(k16.begin(), k16.begin() + static_cast<ptrdiff_t>(size));
        const std::vector<uint16_t> vl16(v16.begin(), v16.begin() + static_cast<ptrdiff_t>(size));
        std::vector<float> a(static_cast<size_t>(hd), 1.0f), b(static_cast<size_t>(hd), 2.0f);
        std::vector<float> a16(static_cast<size_t>(hd), 3.0f), b16(static_cast<size_t>(hd), 4.0f);
        t().attend(q.data(), kl.data(), vl.data(), len, hd, stride, 0.125f, a.data());
        t().attend_cached(q.data(), kl.data(), vl.data(), len, hd, stride, 0.125f, b.data());
        t().attend_bf16(q.data(), kl16.data(), vl16.data(), len, hd, stride, 0.125f, a16.data());
        t().attend_bf16_cached(q.data(), kl16.data(), vl16.data(), len, hd, stride, 0.125f, b16.data());
        for (size_t i = 0; i < static_cast<size_t>(hd); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "hd=" << hd << " len=" << len;
          ASSERT_EQ(std::bit_cast<uint32_t>(a16[i]), std::bit_cast<uint32_t>(b16[i])) << "hd=" << hd << " len=" << len;
        }
      }
    }
}

// A bf16 cache row is read by widening each value exactly, so attend_bf16
// over bf16 rows must give, bit for bit, what the same table's attend gives
// over those rows widened to f32 (and hence match the reference as attend
// does). hd covers the SIMD tails (AVX2 copies a partial bf16 vector through
// the stack) and the fallback past the register-resident widths (300).
TEST_P(KernelTest, AttendBf16IsAttendOnTheWidenedRows) {
  std::mt19937 rng(11);
  for (int64_t hd : {64, 16, 80, 1, 3, 136, 300})
    for (int64_t stride : {hd + 5, hd}) {
      const int64_t max_len = hd <= 136 ? 70 : 20;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const auto q = random_vec(hd, rng, -2.0f, 2.0f);
      const auto kf = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng, -2.0f, 2.0f);
      const auto vf = random_vec(static_cast<int64_t>(strided_size(max_len, hd, stride)), rng);
      std::vector<uint16_t> k16(kf.size()), v16(vf.size());
      std::vector<float> kw(kf.size()), vw(vf.size());
      for (size_t i = 0; i < kf.size(); ++i) {
        k16[i] = f32_to_bf16(kf[i]);
        v16[i] = f32_to_bf16(vf[i]);
        kw[i] = bf16_to_f32(k16[i]);
        vw[i] = bf16_to_f32(v16[i]);
      }
      for (int64_t len :
           {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{13}, int64_t{16}, int64_t{37}, max_len}) {
        if (len > max_len) continue;
        // Exact-size copies so the last row of a shorter cache ends the buffer.
        const size_t size = len == 0 ? 0 : strided_size(len, hd, stride);
        const std::vector<uint16_t> kl(k16.begin(), k16.begin() + static_cast<ptrdiff_t>(size));
        const std::vector<uint16_t> vl(v16.begin(), v16.begin() + static_cast<ptrdiff_t>(size));
        std::vector<float> got(static_cast<size_t>(hd), 5.0f), want(static_cast<size_t>(hd), 6.0f);
        t().attend_bf16(q.data(), kl.data(), vl.data(), len, hd, stride, scale, got.data());
        t().attend(q.data(), kw.data(), vw.data(), len, hd, stride, scale, want.data());
        for (int64_t i = 0; i < hd; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                    std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
              << "hd=" << hd << " stride=" << stride << " len=" << len << " i=" << i;
      }
    }
}

// A NaN in a K row (so in its score) makes every output NaN, and one in a
// V row the output of its column, as in the reference, on the dense rows
// (the attention op's) and on strided ones: the weight of a NaN score must
// not be clamped to a finite value by the vector exp.
TEST_P(KernelTest, AttendNanInTheCacheIsNan) {
  std::mt19937 rng(31);
  for (int64_t hd : {64, 16, 80})
    for (int64_t stride : {hd, hd + 5})
      for (int64_t len : {int64_t{9}, int64_t{40}, int64_t{600}})
        for (bool in_k : {true, false}) {
          const auto q = random_vec(hd, rng, -2.0f, 2.0f);
          auto k = random_vec(static_cast<int64_t>(strided_size(len, hd, stride)), rng, -2.0f, 2.0f);
          auto v = random_vec(static_cast<int64_t>(strided_size(len, hd, stride)), rng);
          (in_k ? k : v)[static_cast<size_t>((len / 2) * stride + 3)] = std::nanf("");
          std::vector<float> out(static_cast<size_t>(hd), 0.0f);
          t().attend(q.data(), k.data(), v.data(), len, hd, stride, 0.125f, out.data());
          for (int64_t i = 0; i < hd; ++i)
            ASSERT_EQ(std::isnan(out[static_cast<size_t>(i)]), in_k || i == 3)
                << "hd=" << hd << " stride=" << stride << " len=" << len << (in_k ? " K" : " V") << " i=" << i;
        }
}

TEST_P(KernelTest, AttendEmptyIsZero) {
  std::vector<float> q(64, 1.0f), out(64, 5.0f);
  const AttendStats st = t().attend(q.data(), nullptr, nullptr, 0, 64, 64, 1.0f, out.data());
  for (float o : out) EXPECT_EQ(o, 0.0f);
  EXPECT_EQ(st.max, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(st.sum, 0.0f);
}

// Scores in the thousands: exp(s) would overflow without max subtraction.
// Integer q and k make every dot product exact in float whatever the
// summation order, so both implementations see identical scores.
TEST_P(KernelTest, AttendLargeScoresStable) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t hd : {16, 64, 80, 128}) {
    for (int64_t len : {1, 5, 33, 300})
      for (int64_t stride : {hd + 3, hd}) {
        std::vector<float> q(static_cast<size_t>(hd));
        std::vector<float> k(strided_size(len, hd, stride));
        for (float& x : q) x = static_cast<float>(small(rng));
        for (float& x : k) x = static_cast<float>(small(rng));
        const auto v = random_vec(static_cast<int64_t>(k.size()), rng);
        for (float scale : {1.0f, 10.0f, -3.0f}) check_attend(t(), q, k, v, len, hd, stride, scale, 5e-6f);
      }
  }
  // All scores equal and huge: a plain average of V.
  const int64_t hd = 64, len = 50;
  std::vector<float> q(hd, 8.0f), k(static_cast<size_t>(hd * len), 8.0f);
  const auto v = random_vec(hd * len, rng);
  check_attend(t(), q, k, v, len, hd, hd, 100.0f, 5e-6f);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelTest,
                         ::testing::Values(TableCase{Isa::kScalar, Prefetch::kL1}, TableCase{Isa::kAvx2, Prefetch::kL1},
                                           TableCase{Isa::kAvx512, Prefetch::kL1}, TableCase{Isa::kAmx, Prefetch::kL1},
                                           TableCase{Isa::kAvx512, Prefetch::kL2}, TableCase{Isa::kAmx, Prefetch::kL2}),
                         [](const ::testing::TestParamInfo<TableCase>& info) { return info.param.name(); });

// ---- dispatch --------------------------------------------------------------

TEST(Dispatch, NamesAndTables) {
  EXPECT_EQ(isa_name(Isa::kScalar), "scalar");
  EXPECT_EQ(isa_name(Isa::kAvx2), "avx2");
  EXPECT_EQ(isa_name(Isa::kAvx512), "avx512");
  EXPECT_EQ(isa_name(Isa::kAmx), "amx");
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    Isa parsed = Isa::kScalar;
    EXPECT_TRUE(parse_isa(isa_name(isa), &parsed));
    EXPECT_EQ(parsed, isa);
  }
  Isa untouched = Isa::kAvx2;
  EXPECT_FALSE(parse_isa("avx512f", &untouched));
  EXPECT_FALSE(parse_isa("", &untouched));
  EXPECT_EQ(untouched, Isa::kAvx2);
  EXPECT_EQ(table_for(Isa::kScalar), &scalar_table());
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const KernelTable* table = table_for(isa);
    const bool runnable = static_cast<int>(isa) <= static_cast<int>(detect_isa());
    ASSERT_EQ(table != nullptr, runnable) << isa_name(isa);
    if (table != nullptr) {
      EXPECT_EQ(table->isa, isa);
    }
  }
}

// The prefetch level is the CPU's unless K3_PREFETCH says otherwise (the
// test environment does not set it), and both levels' AVX-512 and amx
// tables exist, differ and say which they are.
TEST(Dispatch, PrefetchLevels) {
  EXPECT_EQ(prefetch_name(Prefetch::kL1), "l1");
  EXPECT_EQ(prefetch_name(Prefetch::kL2), "l2");
  Prefetch p = Prefetch::kL1;
  EXPECT_TRUE(parse_prefetch("l2", &p));
  EXPECT_EQ(p, Prefetch::kL2);
  EXPECT_FALSE(parse_prefetch("L3", &p));
  EXPECT_FALSE(parse_prefetch("", &p));
  EXPECT_EQ(p, Prefetch::kL2);
  if (std::getenv("K3_PREFETCH") == nullptr) {
    EXPECT_EQ(table_for(Isa::kScalar)->prefetch, Prefetch::kL1);
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAmx}) {
    const KernelTable* l1 = table_for(isa, Prefetch::kL1);
    const KernelTable* l2 = table_for(isa, Prefetch::kL2);
    if (l1 == nullptr) continue;
    ASSERT_NE(l2, nullptr);
    EXPECT_EQ(l1->prefetch, Prefetch::kL1);
    EXPECT_EQ(l2->prefetch, Prefetch::kL2);
    EXPECT_NE(l1->gemm_nt, l2->gemm_nt);
    EXPECT_EQ(l1->isa, l2->isa);
    if (std::getenv("K3_PREFETCH") == nullptr) {
      EXPECT_EQ(table_for(isa)->prefetch, prefetch_for_cpu());
    }
  }
}

// Without K3_ISA the best table stops at avx512 (amx is opt-in).
TEST(Dispatch, BestTableHonoursCap) {
  Isa want = detect_isa();
  Isa c = Isa::kAvx512;
  if (const char* env = std::getenv("K3_ISA")) {
    const std::string cap(env);
    (void)parse_isa(cap, &c);  // unknown values leave the default cap
  }
  if (static_cast<int>(c) < static_cast<int>(want)) want = c;
  EXPECT_EQ(best_table().isa, want);
  EXPECT_EQ(&best_table(), &best_table());
}

}  // namespace
}  // namespace k3::kernels
