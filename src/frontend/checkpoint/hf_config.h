// Hugging Face checkpoints (config.json with "model_type" + model.safetensors
// as transformers' save_pretrained writes them) mapped onto K3's model
// contract, so they run through the same graph builder and engine.
//
// Supported today (docs/model-format.md): Mixtral (softmax router, top-k,
// renormalized: the same routing as K3's SwiGLU MoE) and the dense Llama and
// Mistral families as the one-expert case (the MLP is expert 0; its router
// is a synthesized [1, D] zero gate, so its weight is exactly 1). Anything
// in a config that would change the math and is not implemented (biases,
// RoPE scaling, a sliding window shorter than the context, other
// activations, other families) is a one-line error naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "frontend/checkpoint/config.h"

namespace k3 {

// True when the config.json object is a Hugging Face one (has model_type).
bool is_hf_config(const nlohmann::json& j);

// The K3 config of a Hugging Face config.json (hf_family set).
StatusOr<ModelConfig> parse_hf_config(const nlohmann::json& j);

// The checkpoint tensor name for a K3 contract name, for config c's family.
// Empty when the tensor is not in the file: the dense families' router gate
// (synthesized) and, with tied embeddings, the output projection.
std::string hf_tensor_name(const ModelConfig& c, const std::string& k3_name);

}  // namespace k3
