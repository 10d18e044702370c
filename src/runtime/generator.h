// Generation: prefill each prompt, then decode all sequences together.
//
// Each prompt owns one KV slot. Prefill runs prompt chunks one sequence at a
// time; decode advances every unfinished sequence by one token per step. A
// sequence's tokens do not depend on its batch-mates: its rows are computed
// identically whatever shares the step, and it has its own random stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace k3::runtime {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingParams sampling;
  bool stop_at_eos = true;
  // More ids that end a sequence (a tokenizer's end-of-turn tokens), when
  // stop_at_eos is on; the config's eos_token_id always does.
  std::vector<int32_t> stop_ids;
  // Optional: called with (prompt index, token) as each token is accepted,
  // for streaming output. The engine's step allocates nothing; what the
  // callback does is the caller's business.
  std::function<void(int64_t, int32_t)> on_token;
  // Optional: per-node hooks for every decode step (bench statistics).
  StepHooks* decode_hooks = nullptr;
  // Optional: receives the logits row used to choose each token (testing).
  std::vector<std::vector<float>>* logits_out = nullptr;  // indexed [prompt][step * V + v]
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // generated ids per prompt
  std::vector<std::string> finish_reason;    // "length", "eos", "context"
  double prefill_ms = 0;                     // all prompts' prefill + first tokens
  double decode_ms = 0;                      // all decode steps
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps
  int64_t prompt_tokens = 0;
  int64_t decode_allocations = -1;  // heap allocations in the decode loop; -1 = not counted
};

class Generator {
 public:
  explicit Generator(Engine& engine);
  // prompts.size() must be in 1..max_batch; each prompt non-empty and shorter
  // than the context.
  StatusOr<GenerateResult> generate(const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options);

 private:
  Engine& engine_;
  // One per engine thread, up to the engine's batch: a batch's draws run in
  // parallel, sampler c for the rows k with k % n == c (each sequence keeps
  // its own random stream, so the tokens do not depend on the split).
  std::vector<Sampler> samplers_;
};

}  // namespace k3::runtime
