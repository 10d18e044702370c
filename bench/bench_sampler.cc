// Sampler microbenchmark (Google Benchmark): one draw per iteration over a
// vocabulary of logits shaped like a language model's (a few large values,
// a long flat tail), for the settings users run: greedy, top-k, top-p alone
// (the article's and the OpenAI API's default) and both; top-p also over an
// untrained model's nearly flat logits, and every setting over a dumped row
// of a real model's (K3_SAMPLER_LOGITS, main below).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "util/npy.h"

namespace {

std::vector<float> lm_like_logits(int64_t vocab) {
  std::mt19937 gen(7);
  std::normal_distribution<float> tail(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (auto& l : logits) l = tail(gen);
  for (int i = 0; i < 20; ++i) logits[static_cast<size_t>(gen() % vocab)] += 8.0f;
  return logits;
}

// An untrained model's logits (k3 init-model's presets): nearly flat, so
// the nucleus holds most of the vocabulary.
std::vector<float> flat_logits(int64_t vocab) {
  std::mt19937 gen(7);
  std::normal_distribution<float> tail(0.0f, 0.3f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (auto& l : logits) l = tail(gen);
  return logits;
}

// One draw per iteration over `logits` (vocab = its size).
void draw_loop(benchmark::State& state, const std::vector<float>& logits, float temperature, int64_t top_k,
               float top_p) {
  k3::runtime::Sampler sampler(static_cast<int64_t>(logits.size()));
  k3::runtime::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  k3::Rng rng(1);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits.data(), p, rng));
  state.SetItemsProcessed(state.iterations());
}

void bm_sample(benchmark::State& state, float temperature, int64_t top_k, float top_p, bool flat = false) {
  const int64_t vocab = state.range(0);
  draw_loop(state, flat ? flat_logits(vocab) : lm_like_logits(vocab), temperature, top_k, top_p);
}

// clang-format would split the names' "p0.95" into two tokens.
// clang-format off
BENCHMARK_CAPTURE(bm_sample, greedy, 0.0f, 0, 1.0f)->Arg(32000)->Arg(152064);
BENCHMARK_CAPTURE(bm_sample, top_k40_top_p0.95, 0.8f, 40, 0.95f)->Arg(32000)->Arg(152064);
BENCHMARK_CAPTURE(bm_sample, top_p0.95, 0.8f, 0, 0.95f)->Arg(32000)->Arg(152064);
BENCHMARK_CAPTURE(bm_sample, full_softmax, 1.0f, 0, 1.0f)->Arg(32000)->Arg(152064);
BENCHMARK_CAPTURE(bm_sample, top_p0.95_flat, 0.8f, 0, 0.95f, true)->Arg(32000)->Arg(152064);
// clang-format on

}  // namespace

// K3_SAMPLER_LOGITS=FILE.npy (k3 generate --dump-logits: [1, steps, vocab])
// adds the same settings over the file's first row: a real model's logits.
int main(int argc, char** argv) {
  std::vector<float> row;
  if (const char* path = std::getenv("K3_SAMPLER_LOGITS"); path != nullptr) {
    auto a = k3::read_npy_f32(path);
    if (!a.ok()) {
      std::fprintf(stderr, "bench_sampler: K3_SAMPLER_LOGITS: %s\n", a.status().message().c_str());
      return 1;
    }
    if (a->shape.empty() || a->shape.back() < 1) {
      std::fprintf(stderr, "bench_sampler: K3_SAMPLER_LOGITS: %s holds no row of logits\n", path);
      return 1;
    }
    row.assign(a->data.begin(), a->data.begin() + a->shape.back());
    struct Setting {
      const char* name;
      float temperature;
      int64_t top_k;
      float top_p;
    };
    for (const Setting& st : {Setting{"greedy", 0.0f, 0, 1.0f}, Setting{"top_k40_top_p0.95", 0.8f, 40, 0.95f},
                              Setting{"top_p0.95", 0.8f, 0, 0.95f}, Setting{"full_softmax", 1.0f, 0, 1.0f}})
      benchmark::RegisterBenchmark((std::string("model_logits/") + st.name).c_str(), draw_loop, row, st.temperature,
                                   st.top_k, st.top_p);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
