// Sampler implementation.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace k3::runtime {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) return invalid_argument("--temperature must be a finite number >= 0");
  if (top_k < 0) return invalid_argument("--top-k must be >= 0 (0 disables it)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid_argument("--top-p must be in (0, 1]");
  return Status();
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

int32_t Sampler::sample(const float* logits, const SamplingParams& p, Rng& rng) {
  const int64_t v = static_cast<int64_t>(idx_.size());
  if (p.temperature == 0.0f) return argmax(logits, v);
  // Order: descending logit, ties by token id, so the result is a function
  // of the logits and the random stream only.
  auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  for (int64_t i = 0; i < v; ++i) idx_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  int64_t n = v;
  if (p.top_k > 0 && p.top_k < v) {
    n = p.top_k;
    std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.end(), before);
  } else {
    std::sort(idx_.begin(), idx_.end(), before);
  }
  // Softmax of logits / temperature over the candidates (in double).
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double mx = logits[idx_[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (prob_[static_cast<size_t>(i)] = std::exp((logits[idx_[static_cast<size_t>(i)]] - mx) * inv_t));
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n) {
      acc += prob_[static_cast<size_t>(keep)] / sum;
      ++keep;
      if (acc >= static_cast<double>(p.top_p)) break;
    }
    n = keep;
    sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += prob_[static_cast<size_t>(i)];
  }
  double u = rng.uniform() * sum;
  for (int64_t i = 0; i < n; ++i) {
    u -= prob_[static_cast<size_t>(i)];
    if (u < 0.0) return idx_[static_cast<size_t>(i)];
  }
  return idx_[static_cast<size_t>(n - 1)];
}

}  // namespace k3::runtime
