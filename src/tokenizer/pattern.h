// The {"String": "..."} / {"Regex": "..."} patterns of tokenizer.json, used by
// the Replace normalizer and decoder and the Split pre-tokenizer.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace k3::tok {

class Pattern {
 public:
  static StatusOr<Pattern> from_json(const Json& j, const std::string& path);
  static Pattern literal(std::string text);

  // Non-overlapping matches, left to right, as byte ranges.
  StatusOr<std::vector<std::pair<size_t, size_t>>> find_all(std::string_view text) const;
  // text with every match replaced by `content`.
  StatusOr<std::string> replace_all(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::optional<Regex> regex_;
};

}  // namespace k3::tok
