// Engine: optimized vs reference ops on whole models, batched == unbatched
// and chunked prefill == token-by-token (bit for bit), and checked steps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"
#include "test_models.h"

namespace k3::runtime {
namespace {

using k3::testing::model_dir;

std::unique_ptr<Engine> load(const std::string& preset, int64_t max_batch, bool reference = false, int threads = 2) {
  EngineOptions o;
  o.max_batch = max_batch;
  o.reference = reference;
  o.threads = threads;
  o.prefill_chunk = 16;
  auto e = Engine::load(model_dir(preset), o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Feeds `tokens` to one slot starting at position `start`, returns the
// logits of the last token.
std::vector<float> feed(Engine& e, int32_t slot, int32_t start, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> pos(tokens.size()), slots(tokens.size(), slot);
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = start + static_cast<int32_t>(i);
  const int32_t row = static_cast<int32_t>(n - 1);
  auto r = e.step({tokens.data(), pos.data(), slots.data(), n, &row, 1});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::vector<float>(*r, *r + e.config().vocab_size);
}

TEST(Engine, FastMatchesReferenceOps) {
  for (const char* preset : {"k3-tiny", "moe-swiglu-small"}) {
    auto fast = load(preset, 1);
    auto ref = load(preset, 1, /*reference=*/true, 1);
    const std::vector<int32_t> prompt{5, 17, 42, 99, 3, 1};
    auto a = feed(*fast, 0, 0, prompt);
    auto b = feed(*ref, 0, 0, prompt);
    for (int step = 0; step < 4; ++step) {
      float max_ref = 0, max_err = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(b[i]));
        max_err = std::max(max_err, std::fabs(a[i] - b[i]));
      }
      EXPECT_LE(max_err, 1e-4f * std::max(1.0f, max_ref)) << preset << " step " << step;
      const int32_t next = static_cast<int32_t>(std::max_element(b.begin(), b.end()) - b.begin());
      a = feed(*fast, 0, static_cast<int32_t>(prompt.size()) + step, {next});
      b = feed(*ref, 0, static_cast<int32_t>(prompt.size()) + step, {next});
    }
  }
}

TEST(Engine, BatchedDecodeEqualsUnbatchedBitForBit) {
  auto batched = load("k3-small", 3);
  auto single = load("k3-small", 1);
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {40, 41, 42, 43, 44, 45, 46}, {7}};
  std::vector<std::vector<float>> expected;
  std::vector<int32_t> next(3);
  for (int32_t s = 0; s < 3; ++s) {
    feed(*batched, s, 0, prompts[static_cast<size_t>(s)]);
    auto alone = feed(*single, 0, 0, prompts[static_cast<size_t>(s)]);
    alone = feed(*single, 0, static_cast<int32_t>(prompts[static_cast<size_t>(s)].size()), {100 + s});
    expected.push_back(alone);
    next[static_cast<size_t>(s)] = 100 + s;
  }
  // One decode step with all three sequences at different positions.
  std::vector<int32_t> pos{3, 7, 1}, slots{0, 1, 2}, rows{0, 1, 2};
  auto r = batched->step({next.data(), pos.data(), slots.data(), 3, rows.data(), 3});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const int64_t v = batched->config().vocab_size;
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t i = 0; i < v; ++i) ASSERT_EQ((*r)[s * v + i], expected[static_cast<size_t>(s)][static_cast<size_t>(i)]) << "seq " << s << " logit " << i;
}

TEST(Engine, ChunkedPrefillEqualsTokenByToken) {
  auto a = load("k3-tiny", 1);
  auto b = load("k3-tiny", 1);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 512);
  // a: 40 tokens in chunks of 16, 16, 8 (prefill_chunk = 16).
  std::vector<float> la;
  for (size_t b0 = 0; b0 < prompt.size(); b0 += 16) {
    std::vector<int32_t> chunk(prompt.begin() + static_cast<long>(b0), prompt.begin() + static_cast<long>(std::min(prompt.size(), b0 + 16)));
    la = feed(*a, 0, static_cast<int32_t>(b0), chunk);
  }
  std::vector<float> lb;
  for (size_t i = 0; i < prompt.size(); ++i) lb = feed(*b, 0, static_cast<int32_t>(i), {prompt[i]});
  EXPECT_EQ(la, lb);
}

// The generator draws a batch's tokens on the engine's threads, each
// sequence from its own random stream: the tokens are those of one thread,
// and those of each prompt generated alone.
TEST(Generator, SampledBatchIsTheSameOnAnyThreadsAndAlone) {
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {40, 41, 42, 43}, {7}};
  GenerateOptions go;
  go.max_new_tokens = 12;
  go.stop_at_eos = false;
  go.sampling.temperature = 0.9f;
  go.sampling.top_k = 0;
  go.sampling.top_p = 0.9f;
  go.sampling.seed = 11;
  std::vector<std::vector<int32_t>> tokens[2];
  for (int threads : {1, 2}) {
    auto e = load("k3-small", 3, false, threads);
    ASSERT_NE(e, nullptr);
    Generator gen(*e);
    auto r = gen.generate(prompts, go);
    ASSERT_TRUE(r.ok()) << r.status().message();
    tokens[threads - 1] = r->tokens;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  auto e = load("k3-small", 1);
  ASSERT_NE(e, nullptr);
  Generator gen(*e);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = gen.generate({prompts[i]}, go);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->tokens[0], tokens[1][i]) << "prompt " << i;
  }
}

TEST(Engine, RejectsBadSteps) {
  auto e = load("k3-tiny", 2);
  auto expect_error = [&](std::vector<int32_t> tok, std::vector<int32_t> pos, std::vector<int32_t> slot, std::vector<int32_t> rows,
                          const std::string& needle) {
    auto r = e->step({tok.data(), pos.data(), slot.data(), static_cast<int64_t>(tok.size()), rows.data(), static_cast<int64_t>(rows.size())});
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error({512}, {0}, {0}, {0}, "outside the vocabulary");
  expect_error({-1}, {0}, {0}, {0}, "outside the vocabulary");
  expect_error({1}, {256}, {0}, {0}, "outside the context");
  expect_error({1}, {-1}, {0}, {0}, "outside the context");
  expect_error({1}, {0}, {2}, {0}, "slot 2 does not exist");
  expect_error({1, 2}, {3, 3}, {1, 1}, {0}, "same cache position");
  expect_error({1}, {0}, {0}, {1}, "logit row index out of range");
  expect_error({}, {}, {}, {}, "step has 0 tokens");
  std::vector<int32_t> many(17, 1), pos(17), slot(17, 0);
  for (int i = 0; i < 17; ++i) pos[static_cast<size_t>(i)] = i;
  int32_t row = 0;
  auto r = e->step({many.data(), pos.data(), slot.data(), 17, &row, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step has 17 tokens"), std::string::npos);
}

TEST(Engine, RejectsBadOptions) {
  EngineOptions o;
  o.ctx_len = 257;
  auto e = Engine::load(model_dir("k3-tiny"), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("max_seq_len 256"), std::string::npos) << e.status().message();
  o.ctx_len = 0;
  o.threads = -1;
  EXPECT_FALSE(Engine::load(model_dir("k3-tiny"), o).ok());
  o.threads = 1;
  o.max_batch = 0;
  EXPECT_FALSE(Engine::load(model_dir("k3-tiny"), o).ok());
  o.max_batch = 1;
  auto missing = Engine::load("/nonexistent/k3-model", o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace k3::runtime
