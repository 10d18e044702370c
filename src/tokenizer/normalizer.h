// Normalizers: text -> normalized text before pre-tokenization (NFC/NFD/NFKC/
// NFKD, Prepend, Replace, Sequence), built from tokenizer.json "normalizer".
#pragma once

#include <memory>
#include <string>

#include "tokenizer/json_fields.h"

namespace k3::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual StatusOr<std::string> normalize(std::string text) const = 0;
};

// Builds the normalizer described by j (path names it in errors).
StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, const std::string& path);

}  // namespace k3::tok
