// k3 quality: what a precision (or any other change) costs in accuracy.
//
// The reference model decodes greedily from a prompt for N positions; the
// candidate is fed the same tokens (teacher forcing), so both predict every
// position from the same context. Reported: top-1 agreement (the share of
// positions where both pick the same next token) and the mean KL divergence
// KL(ref || candidate) of the next-token distributions, in nats.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "runtime/engine.h"

namespace k3::cli {
namespace {

struct QualityFlags {
  std::string ref;
  std::string model;
  std::string prompt_ids = "5,17,42,99";
  int64_t positions = 256;
  int threads = 0;
  bool json = false;
};

// log-softmax in double (logits of a large vocabulary span a wide range).
void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const double mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - lse;
}

int run_quality(const QualityFlags& f) {
  StatusOr<std::vector<int32_t>> prompt = parse_id_list(f.prompt_ids);
  if (!prompt.ok()) return report(prompt.status());
  if (prompt->empty()) return report(invalid_argument("--prompt-ids is empty"));
  runtime::EngineOptions eo;
  eo.threads = f.threads;
  auto ref = runtime::Engine::load(f.ref, eo);
  if (!ref.ok()) return report(ref.status());
  auto cand = runtime::Engine::load(f.model, eo);
  if (!cand.ok()) return report(cand.status());
  const int64_t vocab = (*ref)->config().vocab_size;
  if ((*cand)->config().vocab_size != vocab)
    return report(invalid_argument("the two models have different vocabularies"));
  const int64_t total = static_cast<int64_t>(prompt->size()) + f.positions;
  if (total > std::min((*ref)->ctx_len(), (*cand)->ctx_len()))
    return report(out_of_range("prompt + positions (" + std::to_string(total) + ") exceed the models' context"));
  for (int32_t id : *prompt)
    if (id >= vocab) return report(out_of_range("token id " + std::to_string(id) + " is outside the vocabulary"));

  // Feed `tokens` from position `pos` to both engines; logits of the last.
  std::vector<float> lr(static_cast<size_t>(vocab)), lc(static_cast<size_t>(vocab));
  auto feed = [&](runtime::Engine& e, const std::vector<int32_t>& tokens, int32_t pos,
                  std::vector<float>& out) -> Status {
    const int64_t chunk_max = e.prefill_chunk();
    for (size_t at = 0; at < tokens.size();) {
      const int64_t n = std::min<int64_t>(chunk_max, static_cast<int64_t>(tokens.size() - at));
      std::vector<int32_t> p(static_cast<size_t>(n)), s(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i)
        p[static_cast<size_t>(i)] = pos + static_cast<int32_t>(at) + static_cast<int32_t>(i);
      const int32_t row = static_cast<int32_t>(n - 1);
      K3_ASSIGN_OR_RETURN(const float* l, e.step({tokens.data() + at, p.data(), s.data(), n, &row, 1}));
      std::copy(l, l + vocab, out.begin());
      at += static_cast<size_t>(n);
    }
    return Status();
  };
  if (Status s = feed(**ref, *prompt, 0, lr); !s.ok()) return report(s);
  if (Status s = feed(**cand, *prompt, 0, lc); !s.ok()) return report(s);
  int64_t agree = 0;
  double kl_sum = 0, kl_max = 0;
  std::vector<double> pr, pc;
  int32_t pos = static_cast<int32_t>(prompt->size());
  for (int64_t i = 0; i < f.positions; ++i) {
    const auto top_r = static_cast<int32_t>(std::max_element(lr.begin(), lr.end()) - lr.begin());
    const auto top_c = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    agree += top_r == top_c;
    log_softmax(lr.data(), vocab, pr);
    log_softmax(lc.data(), vocab, pc);
    double kl = 0;
    for (int64_t v = 0; v < vocab; ++v)
      kl += std::exp(pr[static_cast<size_t>(v)]) * (pr[static_cast<size_t>(v)] - pc[static_cast<size_t>(v)]);
    kl = std::max(kl, 0.0);  // rounding can give -1e-17
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    if (i + 1 == f.positions) break;
    // Teacher forcing: both continue with the reference's greedy token.
    if (Status s = feed(**ref, {top_r}, pos, lr); !s.ok()) return report(s);
    if (Status s = feed(**cand, {top_r}, pos, lc); !s.ok()) return report(s);
    ++pos;
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(f.positions);
  const double kl_mean = kl_sum / static_cast<double>(f.positions);
  if (f.json) {
    nlohmann::json j = {
        {"ref", f.ref},       {"model", f.model}, {"positions", f.positions}, {"top1_agreement", agreement},
        {"mean_kl", kl_mean}, {"max_kl", kl_max}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s vs %s over %ld teacher-forced positions: top-1 agreement %.4f, mean KL %.3g nats (max %.3g)\n",
                f.model.c_str(), f.ref.c_str(), static_cast<long>(f.positions), agreement, kl_mean, kl_max);
  }
  return 0;
}

}  // namespace

Registered add_quality(CLI::App& app) {
  auto f = std::make_shared<QualityFlags>();
  CLI::App* sub = app.add_subcommand(
      "quality", "Accuracy of a model against a reference: top-1 agreement and mean KL over teacher-forced positions");
  sub->add_option("--ref", f->ref, "Reference model (checkpoint directory or .k3m), e.g. the fp32 one")->required();
  sub->add_option("-m,--model", f->model, "Model to judge (e.g. the bf16 .k3m)")->required();
  sub->add_option("--prompt-ids", f->prompt_ids, "Prompt the positions follow (comma-separated ids)");
  sub->add_option("--positions", f->positions, "Positions to compare")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-t,--threads", f->threads, "Threads; 0 = all cores")->check(CLI::Range(0, 1024));
  sub->add_flag("--json", f->json, "Print one JSON object");
  return {sub, [f]() { return run_quality(*f); }};
}

}  // namespace k3::cli
