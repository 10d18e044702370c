// kv-cache-precision: see kv_cache_precision.cc.
#pragma once

#include <string>

#include "passes/pass.h"

namespace k3::passes {

class KvCachePrecision final : public Pass {
 public:
  explicit KvCachePrecision(std::string kv_dtype) : kv_dtype_(std::move(kv_dtype)) {}
  std::string_view name() const override { return "kv-cache-precision"; }
  std::string_view summary() const override {
    return "store the KV cache in --kv-dtype (bf16: half the bytes attention reads per position)";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  std::string kv_dtype_;
};

}  // namespace k3::passes
