// Next-token sampling: greedy, or temperature -> top-k -> top-p (nucleus).
//
// Allocation-free: scratch buffers are sized for the vocabulary once.
// Reproducible: a per-sequence xoshiro stream seeded by the request's seed,
// so the same seed gives the same tokens whatever else is in the batch.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "util/rng.h"
#include "util/status.h"

namespace k3::runtime {

struct SamplingParams {
  float temperature = 0.8f;  // 0 = greedy
  int64_t top_k = 40;        // 0 = disabled
  float top_p = 0.95f;       // 1 = disabled
  uint64_t seed = 0;

  Status validate() const;
};

// Buckets of nucleus_by_buckets, which the sampler takes over
// nucleus_prefix for more candidates than this.
inline constexpr int64_t kNucleusBuckets = 1024;

class Sampler {
 public:
  // kt: the table whose argmax greedy sampling runs (the engine's).
  explicit Sampler(int64_t vocab_size, const kernels::KernelTable& kt = kernels::best_table())
      : kt_(&kt),
        idx_(static_cast<size_t>(vocab_size)),
        prob_(static_cast<size_t>(vocab_size)),
        mass_(static_cast<size_t>(kNucleusBuckets)) {}
  // logits: [vocab_size]. Ties in greedy mode go to the lowest token id.
  int32_t sample(const float* logits, const SamplingParams& params, Rng& rng);

 private:
  const kernels::KernelTable* kt_;
  std::vector<int32_t> idx_;
  std::vector<float> prob_;
  std::vector<double> mass_;  // nucleus_by_buckets's scratch
};

// The index of x's largest value (KernelTable::argmax on the best table:
// the lowest index among equal ones, NaNs skipped).
int32_t argmax(const float* x, int64_t n);

// Nucleus selection without sorting. idx[0, n) holds token ids, prob[t] the
// (unnormalised) probability of token t. Reorders idx so that its first c
// entries are the c most likely tokens (descending logit, ties by lower id),
// in no particular order among themselves, where c is the smallest count
// whose mass reaches target; returns c (1 <= c <= n).
int64_t nucleus_prefix(const float* logits, const float* prob, int32_t* idx, int64_t n, double target);

// nucleus_prefix's result (the same count, the same set of tokens first)
// for many candidates: their mass per bucket of logit values (kNucleusBuckets
// between the highest and lowest candidate, in mass, the caller's scratch)
// in one pass, then the buckets before the one where the mass reaches the
// target are taken whole and nucleus_prefix runs on that one only. A
// nearly flat distribution (an untrained model's) keeps most of the
// vocabulary, where nucleus_prefix's rounds cost ~0.6 ms per 32000.
int64_t nucleus_by_buckets(const float* logits, const float* prob, int32_t* idx, int64_t n, double target,
                           double* mass);

// The k first tokens of logits[v] in the sampler's order (descending logit,
// ties by lower id; NaN never), sorted, into idx[0, k) (idx has room for v);
// returns k, or fewer when fewer logits are not NaN. k >= 1.
int64_t top_k_candidates(const kernels::KernelTable& kt, const float* logits, int64_t v, int64_t k, int32_t* idx);

}  // namespace k3::runtime
