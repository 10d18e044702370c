// Generator implementation. The decode loop touches only buffers sized
// before it starts (no allocation per token; tests/runtime checks this).
#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "util/alloc_counter.h"

namespace k3::runtime {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Generator::Generator(Engine& engine) : engine_(engine) {
  // No more than a step has rows to draw: each holds two vocabulary-sized buffers.
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(engine.threads(), engine.options().max_batch));
  samplers_.reserve(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) samplers_.emplace_back(engine.config().vocab_size, engine.kernels());
}

StatusOr<GenerateResult> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerateOptions& opt) {
  const ModelConfig& c = engine_.config();
  const int64_t n = static_cast<int64_t>(prompts.size());
  const int64_t ctx = engine_.ctx_len(), vocab = c.vocab_size;
  if (n < 1 || n > engine_.options().max_batch)
    return invalid_argument("got " + std::to_string(n) + " prompts; this engine decodes 1.." +
                            std::to_string(engine_.options().max_batch) + " at once");
  if (opt.max_new_tokens < 0) return invalid_argument("--max-new-tokens must be >= 0");
  K3_RETURN_IF_ERROR(opt.sampling.validate());
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = prompts[static_cast<size_t>(i)];
    if (p.empty()) return invalid_argument("prompt " + std::to_string(i) + " is empty");
    if (static_cast<int64_t>(p.size()) >= ctx)
      return out_of_range("prompt " + std::to_string(i) + " has " + std::to_string(p.size()) +
                          " tokens; the context holds " + std::to_string(ctx) + " positions, so at most " +
                          std::to_string(ctx - 1) + " prompt tokens leave room to generate");
    for (int32_t t : p)
      if (t < 0 || t >= vocab)
        return out_of_range("prompt " + std::to_string(i) + ": token id " + std::to_string(t) +
                            " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  }

  GenerateResult r;
  r.tokens.assign(static_cast<size_t>(n), {});
  r.finish_reason.assign(static_cast<size_t>(n), "length");
  for (auto& t : r.tokens) t.reserve(static_cast<size_t>(opt.max_new_tokens));
  if (opt.logits_out) {
    opt.logits_out->assign(static_cast<size_t>(n), {});
    for (auto& l : *opt.logits_out) l.reserve(static_cast<size_t>(opt.max_new_tokens * vocab));
  }
  std::vector<Rng> rngs(static_cast<size_t>(n), Rng(opt.sampling.seed));
  std::vector<int32_t> len(static_cast<size_t>(n));  // tokens in the slot so far
  std::vector<char> done(static_cast<size_t>(n), opt.max_new_tokens == 0);
  for (int64_t i = 0; i < n; ++i) r.prompt_tokens += static_cast<int64_t>(prompts[static_cast<size_t>(i)].size());

  // Accepts token tok, drawn from logits; returns true if the sequence is
  // finished.
  auto accept = [&](int64_t i, const float* logits, int32_t tok) {
    if (opt.logits_out) {
      auto& dst = (*opt.logits_out)[static_cast<size_t>(i)];
      dst.insert(dst.end(), logits, logits + vocab);
    }
    r.tokens[static_cast<size_t>(i)].push_back(tok);
    if (opt.on_token) opt.on_token(i, tok);
    const bool stop_id = std::find(opt.stop_ids.begin(), opt.stop_ids.end(), tok) != opt.stop_ids.end();
    // Hugging Face configs may list several end ids (eos_token_ids); any ends it.
    const bool eos = (c.eos_token_id && tok == *c.eos_token_id) ||
                     std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok) != c.eos_token_ids.end();
    if (opt.stop_at_eos && (eos || stop_id))
      r.finish_reason[static_cast<size_t>(i)] = "eos";
    else if (static_cast<int64_t>(r.tokens[static_cast<size_t>(i)].size()) >= opt.max_new_tokens)
      r.finish_reason[static_cast<size_t>(i)] = "length";
    // The token just sampled is not in the cache yet: prompt + generated
    // tokens reach the context size when len + 1 == ctx.
    else if (len[static_cast<size_t>(i)] + 1 >= ctx)
      r.finish_reason[static_cast<size_t>(i)] = "context";
    else
      return false;
    return true;
  };

  // Prefill: one sequence per step, in chunks; the last chunk returns logits.
  const int64_t chunk = engine_.prefill_chunk();
  std::vector<int32_t> pos(static_cast<size_t>(chunk)), slot(static_cast<size_t>(chunk));
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n && opt.max_new_tokens > 0; ++i) {
    const auto& p = prompts[static_cast<size_t>(i)];
    const int64_t plen = static_cast<int64_t>(p.size());
    for (int64_t b = 0; b < plen; b += chunk) {
      const int64_t m = std::min(chunk, plen - b);
      for (int64_t j = 0; j < m; ++j)
        pos[static_cast<size_t>(j)] = static_cast<int32_t>(b + j),
        slot[static_cast<size_t>(j)] = static_cast<int32_t>(i);
      const bool last = b + m == plen;
      const int32_t out_row = static_cast<int32_t>(m - 1);
      StepInputs in{p.data() + b, pos.data(), slot.data(), m, &out_row, last ? 1 : 0};
      K3_ASSIGN_OR_RETURN(const float* logits, engine_.step(in));
      if (last) {
        len[static_cast<size_t>(i)] = static_cast<int32_t>(plen);
        const int32_t tok = samplers_[0].sample(logits, opt.sampling, rngs[static_cast<size_t>(i)]);
        done[static_cast<size_t>(i)] = accept(i, logits, tok);
      }
    }
  }
  r.prefill_ms = ms_since(t0);

  // Decode: every unfinished sequence advances one token per step.
  std::vector<int32_t> tok(static_cast<size_t>(n)), dpos(static_cast<size_t>(n)), dslot(static_cast<size_t>(n)),
      rows(static_cast<size_t>(n)), which(static_cast<size_t>(n)), drawn(static_cast<size_t>(n));
  // Draws run on the engine's threads, sampler c taking rows c, c + nc, ...
  // (greedy draws are an argmax each: not worth a parallel region).
  const int64_t n_samplers = opt.sampling.temperature > 0.0f ? static_cast<int64_t>(samplers_.size()) : 1;
  t0 = std::chrono::steady_clock::now();
  const int64_t allocations_before = heap_allocations();
  for (;;) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      const size_t k = static_cast<size_t>(m);
      tok[k] = r.tokens[static_cast<size_t>(i)].back();
      dpos[k] = len[static_cast<size_t>(i)];
      dslot[k] = static_cast<int32_t>(i);
      rows[k] = static_cast<int32_t>(m);
      which[k] = static_cast<int32_t>(i);
      ++m;
    }
    if (m == 0) break;
    StepInputs in{tok.data(), dpos.data(), dslot.data(), m, rows.data(), m};
    K3_ASSIGN_OR_RETURN(const float* logits, engine_.step(in, opt.decode_hooks));
    ++r.decode_steps;
    // The draws first, then the tokens in row order. One top-p 0.95 draw
    // over k3-base's logits takes about 0.13 ms (bench_sampler with
    // K3_SAMPLER_LOGITS), 8 of them a batch-8 step.
    engine_.pool().run_chunks(std::min(m, n_samplers), [&](int64_t c, int64_t nc) {
      for (int64_t k = c; k < m; k += nc)
        drawn[static_cast<size_t>(k)] = samplers_[static_cast<size_t>(c)].sample(
            logits + k * vocab, opt.sampling, rngs[static_cast<size_t>(which[static_cast<size_t>(k)])]);
    });
    for (int64_t k = 0; k < m; ++k) {
      const int64_t i = which[static_cast<size_t>(k)];
      ++len[static_cast<size_t>(i)];
      ++r.decode_tokens;
      done[static_cast<size_t>(i)] = accept(i, logits + k * vocab, drawn[static_cast<size_t>(k)]);
    }
  }
  r.decode_ms = ms_since(t0);
  if (allocations_before >= 0) r.decode_allocations = heap_allocations() - allocations_before;
  return r;
}

}  // namespace k3::runtime
