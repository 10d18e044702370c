// Text in, text out for the generation commands: finding the model's
// tokenizer, turning --prompt / --prompt-file text into ids, and the JSON
// dump that tolerates invalid UTF-8 in generated text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace k3::cli {

// The tokenizer for `model`: `explicit_path` when given (a directory holding
// tokenizer.json, or the file), else tokenizer.json in the model's
// directory (a checkpoint directory, or the directory of a .k3m / .onnx
// file). Its ids must fit the model's vocabulary of `vocab_size`.
StatusOr<tok::Tokenizer> load_model_tokenizer(const std::string& model, const std::string& explicit_path,
                                              int64_t vocab_size);

// The prompts' texts: each --prompt, then each --prompt-file's whole content.
StatusOr<std::vector<std::string>> read_prompt_texts(const std::vector<std::string>& prompts,
                                                     const std::vector<std::string>& files);

// j.dump() that replaces invalid UTF-8 instead of throwing (generated or
// typed text may hold any bytes).
std::string dump_json(const nlohmann::json& j);

}  // namespace k3::cli
