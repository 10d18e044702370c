// Decoders: token strings -> text (ByteLevel, ByteFallback, Metaspace,
// Replace, Fuse, Strip, Sequence), built from tokenizer.json "decoder".
//
// decode() follows tokenizers' decode_chain step by step, so whole-sequence
// output is identical to the Python library, including how invalid byte runs
// turn into U+FFFD. piece() gives the raw bytes one token contributes at a
// given position in a stream, for the streaming detokenizer.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/json_fields.h"
#include "tokenizer/pattern.h"

namespace k3::tok {

class Decoder {
 public:
  // Null j (no decoder) joins tokens with spaces, as tokenizers does.
  static StatusOr<Decoder> from_json(const Json* j, const std::string& path);

  StatusOr<std::string> decode(std::vector<std::string> tokens) const;

  // Bytes (possibly partial UTF-8) that `token` adds when it is the index-th
  // token of the output; concatenating pieces gives decode()'s bytes for any
  // valid UTF-8 result.
  StatusOr<std::string> piece(const std::string& token, size_t index) const;

 private:
  enum class Kind { kByteLevel, kByteFallback, kMetaspace, kReplace, kFuse, kStrip };
  struct Step {
    Kind kind;
    std::string content;                      // Replace: replacement; Strip: the character; Metaspace: replacement char
    Pattern pattern = Pattern::literal(" ");  // Replace
    size_t start = 0, stop = 0;               // Strip
    bool prepend = true;                      // Metaspace: prepend_scheme != never
  };
  static Status add_steps(const Json& j, const std::string& path, std::vector<Step>* steps);

  bool none_ = false;  // no decoder: join with " "
  std::vector<Step> steps_;
};

}  // namespace k3::tok
