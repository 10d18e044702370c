// Added tokens (tokenizer.json "added_tokens"): control tokens such as
// <|im_start|> and user-added words that are matched in the raw text before
// normalization and BPE. Matching is leftmost-longest and non-overlapping, as
// tokenizers' aho-corasick MatchKind::LeftmostLongest; with parse_special off,
// special tokens are left as plain text, so text typed by a user can never
// smuggle in control tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_fields.h"

namespace k3::tok {

class Normalizer;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;  // matched in normalized text instead of raw text
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A piece of input: either an added token (id set) or text for the model.
struct Segment {
  std::string text;
  std::optional<int32_t> id;
  size_t offset = 0;  // byte offset of text in the raw input (normalized segments keep their source's)
};

class AddedVocab {
 public:
  // Parses "added_tokens"; `normalizer` (may be null) normalizes the content of
  // tokens marked "normalized" so they match in normalized text.
  static StatusOr<AddedVocab> from_json(const Json& list, const std::string& path, const Normalizer* normalizer);

  // Splits text at the tokens (normalized == normalized_pass); text segments
  // come back without id. parse_special false skips special tokens.
  std::vector<Segment> split(std::string_view text, size_t base_offset, bool normalized_pass, bool parse_special) const;

  const AddedToken* find_id(int32_t id) const;
  // Text of the token for decoding: its normalized content when it is matched
  // in normalized text (tokenizers' id_to_token gives that too), else content.
  const std::string* text_for_id(int32_t id) const;
  std::optional<int32_t> find_content(std::string_view content) const;
  bool is_special_id(int32_t id) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Longest token of the given pass starting at text[pos], or -1.
  int longest_at(std::string_view text, size_t pos, bool normalized_pass, size_t* len) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> match_text_;  // per token: content, normalized when `normalized`
  // first byte -> token indices, longest match text first
  std::vector<std::vector<int>> by_first_byte_;
  std::unordered_map<int32_t, int> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
};

}  // namespace k3::tok
