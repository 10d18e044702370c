// Proves the decode hot path allocates nothing: global operator new is
// counted while decode steps and sampling run, and the whole generator's
// allocation count does not grow with the number of generated tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "compiled/compiled_model.h"
#include "runtime/generator.h"
#include "test_models.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return operator new(n, std::nothrow); }
// These replace the global deletes, so the memory they free always came
// from the malloc in the replacements above. GCC 12 (in the sanitizer build,
// with -Werror in CI) still reports free() of memory from "operator new"
// once it inlines the two; the pair matches, so the diagnostic is silenced here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace k3::runtime {
namespace {

// Prefill of 5 tokens into slot 0, then 20 batch-2 decode steps with
// greedy and top-p sampling: none of the decode steps or samples allocates.
void expect_decode_allocates_nothing(Engine& e, const std::string& what) {
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  std::vector<int32_t> pos{0, 1, 2, 3, 4}, slot(5, 0);
  int32_t row = 4;
  ASSERT_TRUE(e.step({prompt.data(), pos.data(), slot.data(), 5, &row, 1}).ok());
  Sampler sampler(e.config().vocab_size);
  Rng rng(1);
  SamplingParams greedy, sampled;
  greedy.temperature = 0.0f;
  sampled.top_k = 0;  // top-p over the whole vocabulary: the selection path
  std::vector<int32_t> tok{7, 9}, dpos{5, 0}, dslot{0, 1}, rows{0, 1};

  const int64_t before = g_allocations.load();
  for (int i = 0; i < 20; ++i) {
    auto r = e.step({tok.data(), dpos.data(), dslot.data(), 2, rows.data(), 2});
    ASSERT_TRUE(r.ok());
    tok[0] = sampler.sample(*r, greedy, rng);
    tok[1] = sampler.sample(*r + e.config().vocab_size, sampled, rng);
    ++dpos[0];
    ++dpos[1];
  }
  EXPECT_EQ(g_allocations.load() - before, 0) << what;
}

TEST(NoAllocation, DecodeStepsAndSampling) {
  for (const char* preset : {"k3-tiny", "moe-swiglu-small"}) {
    EngineOptions o;
    o.max_batch = 2;
    o.threads = 2;
    auto e = Engine::load(k3::testing::model_dir(preset), o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    expect_decode_allocates_nothing(**e, preset);
  }
}

// The same compiled at each precision (the bf16 dot-product and int8
// kernels round the activations into stack buffers) and weight layout, the
// bf16 models with a bf16 KV cache.
TEST(NoAllocation, DecodeStepsAtEveryPrecisionAndLayout) {
  for (const char* preset : {"k3-tiny", "moe-swiglu-small"}) {
    for (const char* precision : {"fp32", "bf16", "int8", "int8-channel"}) {
      for (const char* layout : {"rows", "panels"}) {
        CompileOptions co;
        co.batch = 2;
        co.prefill_chunk = 8;
        co.ctx_len = 64;
        co.precision = precision;
        co.pipeline.weight_layout = layout;
        // The bf16 cache (rows rounded as written) with the bf16 weights.
        co.pipeline.kv_dtype = std::string(precision) == "bf16" ? "bf16" : "f32";
        auto m = compile_checkpoint(k3::testing::model_dir(preset), co);
        ASSERT_TRUE(m.ok()) << m.status().message();
        EngineOptions o;
        o.max_batch = 2;
        o.threads = 2;
        auto e = Engine::create(std::move(m).value(), o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        expect_decode_allocates_nothing(
            **e, std::string(preset) + " " + precision + " " + layout + " kv " + co.pipeline.kv_dtype);
      }
    }
  }
}

TEST(NoAllocation, GeneratorCostDoesNotGrowWithTokens) {
  EngineOptions o;
  o.max_batch = 2;
  auto e = Engine::load(k3::testing::model_dir("k3-tiny"), o);
  ASSERT_TRUE(e.ok());
  Generator gen(**e);
  auto count = [&](int64_t tokens) {
    GenerateOptions go;
    go.max_new_tokens = tokens;
    go.stop_at_eos = false;
    go.sampling.seed = 3;
    const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {4, 5}};
    const int64_t before = g_allocations.load();
    auto r = gen.generate(prompts, go);
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->decode_steps, tokens - 1);
    return g_allocations.load() - before;
  };
  EXPECT_EQ(count(8), count(60));
}

}  // namespace
}  // namespace k3::runtime
