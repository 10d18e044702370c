// Pre-tokenizers: split normalized text into the words BPE runs on
// (ByteLevel, Split, Metaspace, Sequence), built from "pre_tokenizer".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_fields.h"

namespace k3::tok {

// A piece of text on its way to the model. at_start: it begins at offset 0
// of the original input (Metaspace's prepend_scheme "first" needs this).
struct Piece {
  std::string text;
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its sub-pieces (empty pieces are dropped).
  virtual Status pre_tokenize(std::vector<Piece>* pieces) const = 0;
};

StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, const std::string& path);

}  // namespace k3::tok
