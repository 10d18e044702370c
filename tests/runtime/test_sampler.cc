// Sampler: greedy ties, top-k / top-p truncation, the sampled distribution,
// reproducibility by seed, and flag validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "runtime/sampler.h"

namespace k3::runtime {
namespace {

TEST(Sampler, GreedyPicksLowestIndexOnTies) {
  Sampler s(5);
  Rng rng(1);
  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(s.sample(logits, p, rng), 1);
}

TEST(Sampler, GreedySkipsNaNAndMatchesEveryTable) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(32000);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-5.0f, 5.0f);
  for (float& l : logits) l = dist(gen);
  logits[0] = nan;  // not the answer, though nothing compares above it
  logits[31999] = 9.0f;
  logits[12345] = 9.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    const kernels::KernelTable* kt = kernels::table_for(isa);
    if (kt == nullptr) continue;
    Sampler s(static_cast<int64_t>(logits.size()), *kt);
    Rng rng(1);
    EXPECT_EQ(s.sample(logits.data(), p, rng), 12345) << kernels::isa_name(isa);
  }
}

TEST(Sampler, TopKOneIsGreedyForAnySeed) {
  Sampler s(6);
  const float logits[6] = {0.1f, 0.3f, 0.29f, -2.0f, 0.0f, 0.3f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  p.top_p = 1.0f;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Rng rng(seed);
    EXPECT_EQ(s.sample(logits, p, rng), 1);
  }
}

TEST(Sampler, TopKAndTopPTruncate) {
  Sampler s(4);
  // Probabilities at T=1 roughly 0.64, 0.24, 0.09, 0.03.
  const float logits[4] = {2.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.top_p = 1.0f;
  Rng rng(3);
  for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(logits, p, rng), 2);
  p.top_k = 0;
  p.top_p = 0.5f;  // the first token alone already holds 0.64 of the mass
  for (int i = 0; i < 500; ++i) EXPECT_EQ(s.sample(logits, p, rng), 0);
  p.top_p = 0.7f;  // needs the first two
  bool saw_one = false;
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = s.sample(logits, p, rng);
    EXPECT_LT(t, 2);
    saw_one |= t == 1;
  }
  EXPECT_TRUE(saw_one);
}

TEST(Sampler, FrequenciesFollowTemperatureSoftmax) {
  Sampler s(2);
  const float logits[2] = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75 at T = 1
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  Rng rng(11);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits, p, rng);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
  // T = 2 flattens: p1 = sqrt(3) / (1 + sqrt(3)) = 0.634.
  p.temperature = 2.0f;
  ones = 0;
  for (int i = 0; i < n; ++i) ones += s.sample(logits, p, rng);
  EXPECT_NEAR(static_cast<double>(ones) / n, std::sqrt(3.0) / (1 + std::sqrt(3.0)), 0.015);
}

TEST(Sampler, SameSeedSameTokens) {
  Sampler s(100);
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[static_cast<size_t>(i)] = std::sin(static_cast<float>(i));
  SamplingParams p;
  p.top_k = 0;
  auto draw = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits.data(), p, rng));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

// The selection-based nucleus (and its bucketed form) against the
// definition: sort by (logit desc, id asc), take the shortest prefix whose
// mass reaches the target. Logits drawn from a few values force many ties;
// 32000 nearly flat ones are an untrained model's.
TEST(Sampler, NucleusPrefixMatchesSortedDefinition) {
  std::mt19937 gen(5);
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4099, 32000}) {
    for (int distinct : {3, 50, 100000, -100000}) {  // negative: as many values, 1000 times closer
      std::uniform_int_distribution<int> pick(0, std::abs(distinct) - 1);
      std::vector<float> logits(static_cast<size_t>(n));
      for (auto& l : logits) l = static_cast<float>(pick(gen)) * (distinct > 0 ? 0.01f : 1e-5f);
      const float mx = *std::max_element(logits.begin(), logits.end());
      std::vector<float> prob(logits.size());
      double total = 0.0;
      for (size_t i = 0; i < logits.size(); ++i) total += (prob[i] = std::exp((logits[i] - mx) / 0.7f));
      std::vector<int32_t> sorted(logits.size());
      std::iota(sorted.begin(), sorted.end(), 0);
      std::sort(sorted.begin(), sorted.end(),
                [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (double top_p : {1e-9, 0.1, 0.5, 0.9, 0.95, 0.999}) {
        const double target = top_p * total;
        int64_t want = 0;
        for (double acc = 0.0; want < n;) {
          acc += prob[sorted[want]];
          ++want;
          if (acc >= target) break;
        }
        for (bool buckets : {false, true}) {
          std::vector<int32_t> idx(logits.size());
          std::iota(idx.begin(), idx.end(), 0);
          std::vector<double> mass(kNucleusBuckets);
          const int64_t got = buckets
                                  ? nucleus_by_buckets(logits.data(), prob.data(), idx.data(), n, target, mass.data())
                                  : nucleus_prefix(logits.data(), prob.data(), idx.data(), n, target);
          ASSERT_EQ(got, want) << "n=" << n << " distinct=" << distinct << " top_p=" << top_p << " buckets " << buckets;
          EXPECT_EQ(std::set<int32_t>(idx.begin(), idx.begin() + got),
                    std::set<int32_t>(sorted.begin(), sorted.begin() + want))
              << "n=" << n << " distinct=" << distinct << " top_p=" << top_p << " buckets " << buckets;
          std::sort(idx.begin(), idx.end());
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(idx[i], i) << "idx must stay a permutation";
        }
      }
    }
  }
}

// The threshold-filtered top-k against a full sort in the sampler's order,
// on every table: ties (a few distinct values), NaN (never a candidate),
// -inf, k past the count of non-NaN logits, ascending and descending runs
// (the threshold starts low and rises late, or starts right).
TEST(Sampler, TopKCandidatesMatchAFullSort) {
  std::mt19937 gen(8);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    const kernels::KernelTable* kt = kernels::table_for(isa);
    if (kt == nullptr) continue;
    for (int64_t v : {1, 5, 40, 513, 4096, 32000}) {
      for (int shape = 0; shape < 5; ++shape) {
        std::vector<float> logits(static_cast<size_t>(v));
        std::uniform_int_distribution<int> pick(0, shape == 1 ? 3 : 100000);
        for (size_t i = 0; i < logits.size(); ++i) {
          logits[i] = static_cast<float>(pick(gen)) * 0.001f;
          if (shape == 2) logits[i] = static_cast<float>(i);                  // ascending
          if (shape == 3) logits[i] = -static_cast<float>(i);                 // descending
          if (shape == 4 && i % 3 == 0) logits[i] = i % 2 == 0 ? nan : -inf;  // NaN and -inf among them
        }
        std::vector<int32_t> want;
        for (int32_t i = 0; i < static_cast<int32_t>(v); ++i)
          if (!std::isnan(logits[static_cast<size_t>(i)])) want.push_back(i);
        std::sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
          return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
                 (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
        });
        for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{40}, v}) {
          std::vector<int32_t> idx(static_cast<size_t>(v));
          const int64_t got = top_k_candidates(*kt, logits.data(), v, k, idx.data());
          const int64_t expect = std::min<int64_t>(k, static_cast<int64_t>(want.size()));
          ASSERT_EQ(got, expect) << kernels::isa_name(isa) << " v=" << v << " shape=" << shape << " k=" << k;
          for (int64_t i = 0; i < got; ++i)
            ASSERT_EQ(idx[static_cast<size_t>(i)], want[static_cast<size_t>(i)])
                << kernels::isa_name(isa) << " v=" << v << " shape=" << shape << " k=" << k << " rank " << i;
        }
      }
    }
  }
}

// Masked tokens (-inf) and NaN logits are never drawn, with or without
// top-k and top-p, on every table, and the rest at their softmax
// frequencies.
TEST(Sampler, NeverDrawsMinusInfOrNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits(1000, -inf);
  for (size_t i = 0; i < logits.size(); i += 7) logits[i] = nan;
  logits[3] = 0.0f;
  logits[500] = 0.5f;
  logits[998] = -1.0f;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    const kernels::KernelTable* kt = kernels::table_for(isa);
    if (kt == nullptr) continue;
    Sampler s(static_cast<int64_t>(logits.size()), *kt);
    for (auto [top_k, top_p] : {std::pair<int64_t, float>{0, 1.0f}, {0, 0.99f}, {40, 1.0f}, {40, 0.99f}}) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.top_k = top_k;
      p.top_p = top_p;
      Rng rng(4);
      std::map<int32_t, int> seen;
      const int draws = 6000;
      for (int i = 0; i < draws; ++i) ++seen[s.sample(logits.data(), p, rng)];
      ASSERT_EQ(seen.size(), 3u) << kernels::isa_name(isa) << " top_k " << top_k << " top_p " << top_p;
      // Masses 1, e^0.5, e^-1 in blocks 0, 1 and 3 of the full softmax's draw.
      const double total = 1.0 + std::exp(0.5) + std::exp(-1.0);
      EXPECT_NEAR(seen[3] / static_cast<double>(draws), 1.0 / total, 0.025) << kernels::isa_name(isa);
      EXPECT_NEAR(seen[500] / static_cast<double>(draws), std::exp(0.5) / total, 0.025) << kernels::isa_name(isa);
      EXPECT_NEAR(seen[998] / static_cast<double>(draws), std::exp(-1.0) / total, 0.025) << kernels::isa_name(isa);
    }
  }
}

// Top-p without top-k (the selection path): only nucleus tokens come out, at
// the nucleus's renormalised frequencies.
TEST(Sampler, TopPAloneSamplesTheRenormalisedNucleus) {
  // T = 1: masses 8, 4, 2, 1, 1 (of 16) for tokens 3, 0, 4, 1, 2.
  const float logits[5] = {std::log(4.0f), 0.0f, 0.0f, std::log(8.0f), std::log(2.0f)};
  Sampler s(5);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.8f;  // 8 + 4 = 12 < 12.8, + 2 = 14 >= 12.8: tokens 3, 0, 4
  Rng rng(9);
  std::vector<int> count(5, 0);
  const int draws = 28000;
  for (int i = 0; i < draws; ++i) ++count[static_cast<size_t>(s.sample(logits, p, rng))];
  EXPECT_EQ(count[1], 0);
  EXPECT_EQ(count[2], 0);
  EXPECT_NEAR(count[3] / static_cast<double>(draws), 8.0 / 14.0, 0.015);
  EXPECT_NEAR(count[0] / static_cast<double>(draws), 4.0 / 14.0, 0.015);
  EXPECT_NEAR(count[4] / static_cast<double>(draws), 2.0 / 14.0, 0.015);
}

TEST(Sampler, ValidateRejectsOutOfRange) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_FALSE(p.validate().ok());
  p = SamplingParams();
  p.temperature = NAN;
  EXPECT_FALSE(p.validate().ok());
  p = SamplingParams();
  p.top_p = 0.0f;
  EXPECT_FALSE(p.validate().ok());
  p.top_p = 1.5f;
  EXPECT_FALSE(p.validate().ok());
  p = SamplingParams();
  p.top_k = -3;
  EXPECT_FALSE(p.validate().ok());
  EXPECT_TRUE(SamplingParams().validate().ok());
}

}  // namespace
}  // namespace k3::runtime
