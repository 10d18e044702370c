// kv-cache-precision: the element type of the KV cache, the user's choice
// (`k3 compile --kv-dtype f32|bf16`), recorded in the compiled graphs so the
// runtime allocates and reads the cache in it.
//
//   CachedAttention(q, k, v, pos, slots, kcache: f32 state, vcache: f32 state)
//     -> CachedAttention(q, k, v, pos, slots, kcache: bf16 state, vcache: bf16 state)
//
// bf16 halves the bytes attention streams per cached position, which at
// long contexts and larger batches is a growing share of a decode step
// (llama.cpp keeps its cache in f16 by default). Each new K/V row is rounded
// to bf16 (nearest even) as it is written; reads widen exactly, and scores,
// softmax and the weighted sum stay f32 (kernels.h, attend_bf16).
// docs/precision.md has the quality cost.
//
// Guards (each has a must-not-convert test in
// tests/passes/test_kv_cache_precision.cc):
//   - only the cache inputs of CachedAttention nodes, and only state values
//     (the shape rule already requires that; checked again here);
//   - only f32 caches (a cache already in bf16 is left alone);
//   - a state also read by anything other than a CachedAttention cache input
//     is left alone, and so is its node's other cache: K and V share a dtype.
// "f32" is a no-op; other dtypes are refused.
#include "passes/kv_cache_precision.h"

#include <vector>

namespace k3::passes {

StatusOr<bool> KvCachePrecision::run(ir::Graph& g) {
  if (kv_dtype_ == "f32") return false;
  if (kv_dtype_ != "bf16") return unimplemented("--kv-dtype '" + kv_dtype_ + "' is not supported (f32, bf16)");
  // Readers of each value that are not a CachedAttention cache input.
  std::vector<int> other_readers(g.values().size(), 0);
  for (const ir::Node& n : g.nodes())
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int id = n.inputs[i];
      if (id < 0) continue;
      if (!(n.op == ir::OpKind::kCachedAttention && (i == 5 || i == 6))) ++other_readers[static_cast<size_t>(id)];
    }
  bool changed = false;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::OpKind::kCachedAttention || n.inputs.size() != 7) continue;
    ++stats_.matched;
    const int ids[2] = {n.inputs[5], n.inputs[6]};
    bool ok = true;
    for (int id : ids) {
      const ir::Value& v = g.value(id);
      ok = ok && v.kind == ir::ValueKind::kState && v.dtype == ir::DType::kF32 &&
           other_readers[static_cast<size_t>(id)] == 0;
    }
    if (!ok) {
      stats_.notes.push_back("node " + n.name + ": cache left as it is (not two f32 states read only as its cache)");
      continue;
    }
    for (int id : ids) g.values()[static_cast<size_t>(id)].dtype = ir::DType::kBF16;
    ++stats_.applied;
    changed = true;
  }
  return changed;
}

}  // namespace k3::passes
