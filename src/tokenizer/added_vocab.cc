// Added-token matching (see added_vocab.h); the lstrip/rstrip/single_word
// rules follow tokenizers' AddedVocabulary::find_matches.
#include "tokenizer/added_vocab.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

// Unicode White_Space (Rust regex \s), for lstrip/rstrip of added tokens.
bool is_space_at(std::string_view s, size_t pos, size_t* len) {
  size_t p = pos;
  const uint32_t cp = next_code_point(s, &p);
  *len = p - pos;
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Rust regex \w (what tokenizers' single_word checks): alphabetic, marks,
// decimal digits, connector punctuation, joiners.
bool is_word_cp(uint32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_word_char_before(std::string_view s, size_t pos) {
  if (pos == 0) return false;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return is_word_cp(next_code_point(s, &start));
}

bool is_word_char_at(std::string_view s, size_t pos) {
  if (pos >= s.size()) return false;
  return is_word_cp(next_code_point(s, &pos));
}

}  // namespace

StatusOr<AddedVocab> AddedVocab::from_json(const Json& list, const std::string& path, const Normalizer* normalizer) {
  if (!list.is_array()) return invalid_argument(path + ": expected an array");
  AddedVocab v;
  v.by_first_byte_.resize(256);
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& e = list[i];
    const std::string where = path + "[" + std::to_string(i) + "]";
    AddedToken t;
    K3_ASSIGN_OR_RETURN(int64_t id, int_field(e, "id", where));
    if (id < 0 || id > INT32_MAX) return invalid_argument(where + ".id: out of range");
    t.id = static_cast<int32_t>(id);
    K3_ASSIGN_OR_RETURN(t.content, string_field(e, "content", where));
    if (t.content.empty()) return invalid_argument(where + ".content: empty");
    if (!is_valid_utf8(t.content)) return invalid_argument(where + ".content: not valid UTF-8");
    K3_ASSIGN_OR_RETURN(t.special, bool_field(e, "special", where, false));
    K3_ASSIGN_OR_RETURN(t.normalized, bool_field(e, "normalized", where, !t.special));
    K3_ASSIGN_OR_RETURN(t.lstrip, bool_field(e, "lstrip", where, false));
    K3_ASSIGN_OR_RETURN(t.rstrip, bool_field(e, "rstrip", where, false));
    K3_ASSIGN_OR_RETURN(t.single_word, bool_field(e, "single_word", where, false));
    std::string match = t.content;
    if (t.normalized && normalizer != nullptr) {
      K3_ASSIGN_OR_RETURN(match, normalizer->normalize(match));
      if (match.empty()) continue;
    }
    const int index = static_cast<int>(v.tokens_.size());
    v.by_id_[t.id] = index;
    v.by_content_[t.content] = t.id;
    v.by_content_.emplace(match, t.id);
    v.by_first_byte_[static_cast<unsigned char>(match[0])].push_back(index);
    v.match_text_.push_back(std::move(match));
    v.tokens_.push_back(std::move(t));
  }
  for (auto& bucket : v.by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](int a, int b) { return v.match_text_[a].size() > v.match_text_[b].size(); });
  }
  return v;
}

int AddedVocab::longest_at(std::string_view text, size_t pos, bool normalized_pass, size_t* len) const {
  for (int index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    if (tokens_[index].normalized != normalized_pass) continue;
    const std::string& m = match_text_[index];
    if (text.compare(pos, m.size(), m) == 0) {
      *len = m.size();
      return index;
    }
  }
  return -1;
}

std::vector<Segment> AddedVocab::split(std::string_view text, size_t base_offset, bool normalized_pass,
                                       bool parse_special) const {
  std::vector<Segment> out;
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    const int index = longest_at(text, pos, normalized_pass, &len);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[index];
    size_t start = pos;
    size_t stop = pos + len;
    pos = stop;  // matches never overlap, even when one is then skipped
    if (t.special && !parse_special) continue;
    if (t.single_word && (is_word_char_before(text, start) || is_word_char_at(text, stop))) continue;
    if (t.lstrip) {
      // Absorb whitespace before the token, back to the previous match.
      while (start > start_offset) {
        size_t b = start - 1;
        while (b > start_offset && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        size_t sl = 0;
        if (!is_space_at(text, b, &sl)) break;
        start = b;
      }
    }
    if (t.rstrip) {
      size_t sl = 0;
      while (stop < text.size() && is_space_at(text, stop, &sl)) stop += sl;
      pos = stop;
    }
    if (start > start_offset)
      out.push_back(
          {std::string(text.substr(start_offset, start - start_offset)), std::nullopt, base_offset + start_offset});
    out.push_back({t.content, t.id, base_offset + start});
    start_offset = stop;
  }
  if (start_offset < text.size() || out.empty())
    out.push_back({std::string(text.substr(start_offset)), std::nullopt, base_offset + start_offset});
  return out;
}

const AddedToken* AddedVocab::find_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocab::text_for_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &match_text_[it->second];
}

std::optional<int32_t> AddedVocab::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

bool AddedVocab::is_special_id(int32_t id) const {
  const AddedToken* t = find_id(id);
  return t != nullptr && t->special;
}

}  // namespace k3::tok
