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

// Text of generated ids. A model's vocabulary may be larger than its
// tokenizer's (rows padded to a multiple of 64, or a random test model); an
// id the tokenizer has no text for contributes none, as in the Python
// tokenizers library (the ids themselves are reported unchanged).
StatusOr<std::string> generated_text(const tok::Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special);

// Ends a sequence at the tokenizer's eos_token too (when it has one).
void add_tokenizer_stop(const tok::Tokenizer& t, std::vector<int32_t>& stop_ids);

// Streams generated ids to stdout as whole UTF-8 characters (flushed per
// token); ids without text are skipped, like generated_text. The first
// decoding error is kept for the caller to report after generation.
class StdoutTextStream {
 public:
  StdoutTextStream(const tok::Tokenizer& t, bool skip_special) : tokenizer_(&t), decoder_(t, skip_special) {}
  void push(int32_t id);
  // Prints what is held back (as U+FFFD) and a newline; ready for the next text.
  void finish_line();
  const Status& status() const { return status_; }

 private:
  const tok::Tokenizer* tokenizer_;
  tok::StreamDecoder decoder_;
  Status status_;
};

// j.dump() that replaces invalid UTF-8 instead of throwing (generated or
// typed text may hold any bytes).
std::string dump_json(const nlohmann::json& j);

}  // namespace k3::cli
