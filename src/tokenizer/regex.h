// Unicode-aware regular expressions for pre-tokenizer split patterns.
//
// Oniguruma (Debian libonig-dev) rather than PCRE2: it is the engine Hugging
// Face tokenizers itself uses (the Rust `onig` crate), so \s, \p{L}, \p{N},
// (?i:...) and lookahead mean exactly what the patterns in tokenizer.json were
// written and tested against. std::regex cannot match Unicode properties.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace k3::tok {

class Regex {
 public:
  // Compiles `pattern` (UTF-8, Oniguruma default syntax); the error names the pattern.
  static StatusOr<Regex> compile(std::string_view pattern);

  // Byte ranges [start, end) of successive non-overlapping matches in `text`
  // (valid UTF-8), iterated like the onig crate's find_iter: an empty match
  // right after the previous match is skipped by advancing one character.
  StatusOr<std::vector<std::pair<size_t, size_t>>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared: a compiled regex is immutable
};

}  // namespace k3::tok
