// Sampler implementation: temperature, then top-k, then top-p (nucleus),
// then one draw from the kept tokens.
//
// Cost matters: this runs once per token per sequence on the decode path. A
// full sort of the vocabulary (what nucleus sampling is usually written as)
// took 3.0 ms per draw for 32000 logits (build/bin/bench_sampler), about a
// quarter of a k3-base bf16 decode step (docs/performance.md),
// so nothing here sorts more than top-k candidates: without top-k the
// nucleus is found by selection (nucleus_prefix, O(vocab) expected).
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
  return static_cast<int32_t>(kernels::best_table().argmax(x, n));
}

namespace {

// Token order of the sampler: descending logit, ties by token id, so every
// result is a function of the logits and the random stream only.
struct Before {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }
};

}  // namespace

int64_t nucleus_prefix(const float* logits, const double* prob, int32_t* idx, int64_t n, double target) {
  // Invariant: idx[0, lo) are the lo first tokens in Before order and hold
  // mass `above` < target; the first hi tokens hold >= target (hi = n holds
  // everything). Each round partitions [lo, hi) around its middle with
  // nth_element and keeps the half that contains the boundary, so the work
  // halves every round: about 2n comparisons in all, against n log n to sort.
  const Before before{logits};
  int64_t lo = 0, hi = n;
  double above = 0.0;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    std::nth_element(idx + lo, idx + mid, idx + hi, before);
    double m = 0.0;
    for (int64_t j = lo; j < mid; ++j) m += prob[idx[j]];
    if (above + m >= target) {
      hi = mid;
    } else {
      above += m;
      lo = mid;
    }
  }
  return hi;
}

int32_t Sampler::sample(const float* logits, const SamplingParams& p, Rng& rng) {
  const int64_t v = static_cast<int64_t>(idx_.size());
  if (p.temperature == 0.0f) return static_cast<int32_t>(kt_->argmax(logits, v));
  const Before before{logits};
  int32_t* idx = idx_.data();
  double* prob = prob_.data();  // indexed by token id
  for (int64_t i = 0; i < v; ++i) idx[i] = static_cast<int32_t>(i);

  // Candidates idx[0, n): with top-k, the k first in Before order, sorted;
  // without, the whole vocabulary in id order.
  int64_t n = v;
  const bool sorted = p.top_k > 0 && p.top_k < v;
  if (sorted) {
    n = p.top_k;
    std::partial_sort(idx, idx + n, idx + v, before);
  }
  // Softmax numerators of logits / temperature (in double), shifted by the max.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double mx = logits[sorted ? idx[0] : kt_->argmax(logits, v)];
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = idx[i];
    sum += (prob[t] = std::exp((logits[t] - mx) * inv_t));
  }
  // Nucleus: the smallest prefix, in Before order, whose mass reaches top_p
  // (at least one token).
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * sum;
    if (sorted) {
      double acc = 0.0;
      int64_t keep = 0;
      while (keep < n) {
        acc += prob[idx[keep]];
        ++keep;
        if (acc >= target) break;
      }
      n = keep;
    } else {
      n = nucleus_prefix(logits, prob, idx, n, target);
    }
    sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += prob[idx[i]];
  }
  // One draw over the kept tokens in their order in idx (sorted with top-k,
  // a fixed function of the logits otherwise): any fixed order samples the
  // same distribution.
  double u = rng.uniform() * sum;
  for (int64_t i = 0; i < n; ++i) {
    u -= prob[idx[i]];
    if (u < 0.0) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace k3::runtime
