// The fixed-slot KV cache, allocated once at load.
//
// Layout per layer, for K and V separately: [slot, kv_head, position, head_dim].
// Why this order: decode attention for one (sequence, kv head) streams
// positions 0..p of one contiguous [p+1, head_dim] block, the best access
// pattern for the read-bound inner loop; a slot is a fixed region, so a
// sequence never moves and admitting one (continuous batching, later) is just
// choosing a free slot. Writing a token's K/V touches n_kv_heads rows, which
// is negligible next to reading the cache.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/dtype.h"
#include "util/aligned_buffer.h"
#include "util/checked.h"
#include "util/status.h"

namespace k3::runtime {

struct KvCacheShape {
  int64_t n_layers = 0;
  int64_t n_slots = 0;
  int64_t n_kv_heads = 0;
  int64_t max_seq = 0;
  int64_t head_dim = 0;
  ir::DType dtype = ir::DType::kF32;  // f32 or bf16 (k3 compile --kv-dtype)

  uint64_t layer_elems() const {
    return static_cast<uint64_t>(n_slots) * static_cast<uint64_t>(n_kv_heads) * static_cast<uint64_t>(max_seq) *
           static_cast<uint64_t>(head_dim);
  }
  uint64_t elem_bytes() const { return ir::dtype_size(dtype); }
  uint64_t total_bytes() const { return 2 * static_cast<uint64_t>(n_layers) * layer_elems() * elem_bytes(); }
};

class KvCache {
 public:
  Status allocate(const KvCacheShape& shape) {
    if (shape.dtype != ir::DType::kF32 && shape.dtype != ir::DType::kBF16)
      return invalid_argument("the KV cache must be f32 or bf16, not " + std::string(ir::dtype_name(shape.dtype)));
    shape_ = shape;
    const uint64_t layer_bytes = align_up(shape.layer_elems() * shape.elem_bytes(), AlignedBuffer::kAlign);
    layer_stride_ = layer_bytes;
    if (!buf_.allocate(2 * static_cast<uint64_t>(shape.n_layers) * layer_bytes))
      return out_of_range("cannot allocate the KV cache (" + std::to_string(shape.total_bytes() >> 20) + " MiB)");
    return Status();
  }
  const KvCacheShape& shape() const { return shape_; }
  // Layer `layer`'s K and V regions, elements of shape().dtype.
  void* k(int64_t layer) const { return buf_.data() + (2 * layer) * layer_stride_; }
  void* v(int64_t layer) const { return buf_.data() + (2 * layer + 1) * layer_stride_; }
  uint64_t bytes() const { return buf_.size(); }

 private:
  KvCacheShape shape_;
  uint64_t layer_stride_ = 0;
  AlignedBuffer buf_;
};

}  // namespace k3::runtime
