// Sampler implementation: temperature, then top-k, then top-p (nucleus),
// then one draw from the kept tokens.
//
// Cost matters: this runs once per token per sequence on the decode path. A
// full sort of the vocabulary (what nucleus sampling is usually written as)
// took 3.0 ms per draw for 32000 logits (build/bin/bench_sampler), about a
// quarter of a k3-base bf16 decode step (docs/performance.md),
// so nothing here sorts more than the candidates: top-k keeps the values at
// or above a rising threshold (KernelTable::indices_at_least, a block at a
// time) and sorts those; without top-k the softmax numerators come from one
// vectorised pass (exp_shifted), the tokens that cannot reach the nucleus
// are dropped by a bound on their mass, and the nucleus among the rest is
// found by selection (nucleus_prefix, O(candidates) expected; past 1024
// candidates, nucleus_by_buckets first narrows it to one bucket of logit
// values). docs/runtime.md has what each setting costs.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

int64_t nucleus_prefix(const float* logits, const float* prob, int32_t* idx, int64_t n, double target) {
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

int64_t nucleus_by_buckets(const float* logits, const float* prob, int32_t* idx, int64_t n, double target,
                           double* mass) {
  float hi = -std::numeric_limits<float>::infinity(), lo = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const float x = logits[idx[i]];
    hi = x > hi ? x : hi;
    lo = x < lo ? x : lo;
  }
  const float span = hi - lo;
  if (!(span > 0.0f) || !std::isfinite(span)) return nucleus_prefix(logits, prob, idx, n, target);
  // Bucket of a logit: (hi - x) * scale rounded down, which does not
  // decrease as x does, so every token of bucket b comes before every token
  // of bucket b + 1 in Before order.
  const float scale = static_cast<float>(kNucleusBuckets) / span;
  auto bucket = [&](int32_t t) {
    return std::min<int64_t>(kNucleusBuckets - 1, static_cast<int64_t>((hi - logits[t]) * scale));
  };
  std::fill(mass, mass + kNucleusBuckets, 0.0);
  for (int64_t i = 0; i < n; ++i) mass[bucket(idx[i])] += prob[idx[i]];
  // The first bucket whose tokens bring the mass to the target: the buckets
  // before it are in the nucleus whole, and it ends inside this one.
  int64_t b = 0;
  double above = 0.0;
  for (; b < kNucleusBuckets - 1 && above + mass[b] < target; ++b) above += mass[b];
  int32_t* whole = std::partition(idx, idx + n, [&](int32_t t) { return bucket(t) < b; });
  int32_t* edge = std::partition(whole, idx + n, [&](int32_t t) { return bucket(t) == b; });
  return (whole - idx) + nucleus_prefix(logits, prob, whole, edge - whole, target - above);
}

int64_t top_k_candidates(const kernels::KernelTable& kt, const float* logits, int64_t v, int64_t k, int32_t* idx) {
  // Every token outside idx[0, n) is below t, and at least k tokens in it
  // are at or above t once t is finite, so the k first in Before order are
  // in idx. When n passes kRoom * k, the k-th best so far becomes t and the
  // rest are dropped: t rises and later blocks add few tokens.
  constexpr int64_t kBlock = 512, kRoom = 4;
  const Before before{logits};
  float t = -std::numeric_limits<float>::infinity();
  int64_t n = 0;
  for (int64_t b = 0; b < v; b += kBlock) {
    n += kt.indices_at_least(logits + b, std::min(kBlock, v - b), t, static_cast<int32_t>(b), idx + n);
    if (n > kRoom * k) {
      std::nth_element(idx, idx + k - 1, idx + n, before);
      t = logits[idx[k - 1]];
      n = std::partition(idx + k, idx + n, [&](int32_t i) { return logits[i] >= t; }) - idx;
    }
  }
  const int64_t keep = std::min(k, n);  // fewer when the rest are NaN
  std::partial_sort(idx, idx + keep, idx + n, before);
  return keep;
}

int32_t Sampler::sample(const float* logits, const SamplingParams& p, Rng& rng) {
  const int64_t v = static_cast<int64_t>(idx_.size());
  if (p.temperature == 0.0f) return static_cast<int32_t>(kt_->argmax(logits, v));
  int32_t* idx = idx_.data();
  float* prob = prob_.data();  // indexed by token id
  const float inv_t = 1.0f / p.temperature;
  const bool sorted = p.top_k > 0 && p.top_k < v;
  const bool all = !sorted && p.top_p >= 1.0f;  // candidates: every token, in id order (idx unused)

  // Candidates idx[0, n) and their numerators: with top-k, the k first in
  // Before order, sorted; without, every token or, for top-p, the ones that
  // can be in the nucleus. n >= 1 below: the max's numerator is 1, at or
  // above the top-p floor (an all-NaN row has numerators 0 and floor 0).
  int64_t n = v;
  double sum = 0.0;
  if (sorted) {
    n = top_k_candidates(*kt_, logits, v, p.top_k, idx);
    if (n == 0) return 0;  // every logit NaN
    const float mx = logits[idx[0]];
    for (int64_t i = 0; i < n; ++i) sum += (prob[idx[i]] = std::exp((logits[idx[i]] - mx) * inv_t));
  } else {
    sum = kt_->exp_shifted(logits, v, logits[kt_->argmax(logits, v)], inv_t, prob);
    if (!all) {
      // Tokens whose numerator is below (1 - top_p) * sum / v hold less
      // than (1 - top_p) * sum together, and come after every other token
      // in Before order (the numerator does not decrease with the logit),
      // so the nucleus, which leaves out at most that much, is among the
      // others.
      const float floor = static_cast<float>((1.0 - static_cast<double>(p.top_p)) * sum / static_cast<double>(v));
      n = kt_->indices_at_least(prob, v, floor, 0, idx);
    }
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
    } else if (n > kNucleusBuckets) {
      n = nucleus_by_buckets(logits, prob, idx, n, target, mass_.data());
    } else {
      n = nucleus_prefix(logits, prob, idx, n, target);
    }
    sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += prob[idx[i]];
  }
  // One draw over the kept tokens in their order (sorted with top-k, a
  // fixed function of the logits otherwise): any fixed order samples the
  // same distribution. u starts >= 0, so it first turns negative at a
  // token with mass.
  double u = rng.uniform() * sum;
  if (!all) {
    for (int64_t i = 0; i < n; ++i) {
      u -= prob[idx[i]];
      if (u < 0.0) return idx[i];
    }
    return idx[n - 1];
  }
  // Whole blocks first (8 independent sums, where subtracting token by
  // token is one dependent add per token), then the block u ends in.
  constexpr int64_t kDrawBlock = 256;
  int64_t b = 0;
  for (; b + kDrawBlock <= v; b += kDrawBlock) {
    double s[8] = {};
    for (int64_t i = b; i < b + kDrawBlock; i += 8)
      for (int j = 0; j < 8; ++j) s[j] += prob[i + j];
    const double block = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    if (u < block) break;
    u -= block;
  }
  for (int64_t i = b; i < v; ++i) {
    u -= prob[i];
    if (u < 0.0) return static_cast<int32_t>(i);
  }
  for (int64_t i = v - 1; i > 0; --i)  // rounding left u >= 0: the last token with mass
    if (prob[i] > 0.0f) return static_cast<int32_t>(i);
  return 0;
}

}  // namespace k3::runtime
