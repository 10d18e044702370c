// Sampler: greedy ties, top-k / top-p truncation, the sampled distribution,
// reproducibility by seed, and flag validation.
#include <gtest/gtest.h>

#include <cmath>
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
