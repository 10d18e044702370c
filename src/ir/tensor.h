// A small owning tensor (dtype, shape, bytes): what callers hand the O0
// interpreter and get back, and what ONNX TensorProto / .npy files decode to.
//
// Storage is shared (copying a Tensor shares bytes) so a view of a weight or
// an input costs nothing; the interpreter allocates every op output fresh.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "ir/dtype.h"
#include "util/checked.h"

namespace k3::ir {

class Tensor {
 public:
  Tensor() = default;

  // Zero-filled tensor; nullopt when the shape is negative or its byte size overflows.
  static std::optional<Tensor> zeros(DType dtype, std::vector<int64_t> shape) {
    auto bytes = checked_numel_bytes(shape, dtype_size(dtype));
    if (!bytes) return std::nullopt;
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.bytes_ = *bytes;
    // One extra byte keeps the pointer non-null for empty tensors.
    auto storage = std::shared_ptr<uint8_t[]>(new uint8_t[*bytes + 1]());
    t.data_ = storage.get();
    t.owner_ = std::move(storage);
    return t;
  }
  // Non-owning view; `owner` (may be null) keeps the bytes alive.
  static Tensor view(DType dtype, std::vector<int64_t> shape, const void* data, std::shared_ptr<const void> owner) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.bytes_ = checked_numel_bytes(t.shape_, dtype_size(dtype)).value_or(0);
    t.data_ = const_cast<void*>(data);  // views are only read
    t.owner_ = std::move(owner);
    return t;
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return dtype_size(dtype_) == 0 ? 0 : static_cast<int64_t>(bytes_ / dtype_size(dtype_)); }
  uint64_t nbytes() const { return bytes_; }
  const void* raw() const { return data_; }
  // What keeps the bytes alive (for Graph::keep_alive).
  const std::shared_ptr<const void>& owner() const { return owner_; }
  void* raw_mut() { return data_; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  template <typename T>
  T* mut() {
    return static_cast<T*>(data_);
  }

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  uint64_t bytes_ = 0;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

}  // namespace k3::ir
