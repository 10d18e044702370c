// A K3 checkpoint directory (config.json + model.safetensors, or Hugging
// Face shards listed by model.safetensors.index.json): the tensor
// contract, validated loading, and deterministic random initialization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "frontend/checkpoint/config.h"
#include "frontend/checkpoint/safetensors.h"

namespace k3 {

// How `k3 init-model` fills a tensor.
enum class InitKind : uint8_t { kEmbedding, kLinear, kNormWeight, kNormBias };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  InitKind init;
};

// Every tensor the contract requires for this config, in file order.
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// A loaded checkpoint. Weights are f32: F32 tensors are used in place from
// the mapping; BF16/F16 tensors are widened into owned buffers at load.
class Checkpoint {
 public:
  static StatusOr<std::shared_ptr<Checkpoint>> load(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  // f32 data of a tensor the contract names (validated at load).
  const float* weight(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  // Dtype the weights had in the file (f32, bf16 or f16; mixed reports f32).
  ir::DType file_dtype() const { return file_dtype_; }

 private:
  std::string dir_;
  ModelConfig config_;
  ir::DType file_dtype_ = ir::DType::kF32;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;  // one, or the shards of an index
  std::vector<std::unique_ptr<float[]>> owned_;
  std::vector<std::pair<std::string, const float*>> weights_;  // sorted by name
};

// Writes config.json and model.safetensors with deterministic random weights
// (same config and seed, same bytes). dtype: kF32 or kBF16.
Status init_model(const ModelConfig& config, uint64_t seed, ir::DType dtype, const std::string& out_dir);

}  // namespace k3
