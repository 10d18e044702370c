// Pre-tokenizer implementations (see pre_tokenizer.h). Split semantics follow
// Hugging Face tokenizers' SplitDelimiterBehavior exactly, since ids depend on
// where words break.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"

namespace k3::tok {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

using Range = std::pair<size_t, size_t>;

// Splits every piece at the matches of `pattern` according to `behavior`.
Status split_pieces(const Pattern& pattern, Behavior behavior, bool invert, std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& piece : *pieces) {
    const std::string& text = piece.text;
    K3_ASSIGN_OR_RETURN(auto found, pattern.find_all(text));
    // (range, is_match) covering the whole text.
    std::vector<std::pair<Range, bool>> parts;
    size_t prev = 0;
    for (const auto& [s, e] : found) {
      if (prev != s) parts.push_back({{prev, s}, false});
      parts.push_back({{s, e}, true});
      prev = e;
    }
    if (prev != text.size()) parts.push_back({{prev, text.size()}, false});
    if (invert)
      for (auto& p : parts) p.second = !p.second;

    std::vector<std::pair<Range, bool>> merged;  // bool: remove this part
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kRemoved:
        for (auto& p : parts) merged.push_back({p.first, p.second});
        break;
      case Behavior::kIsolated:
        for (auto& p : parts) merged.push_back({p.first, false});
        break;
      case Behavior::kMergedWithPrevious:
        for (auto& p : parts) {
          if (p.second && !previous_match && !merged.empty()) {
            merged.back().first.second = p.first.second;
          } else {
            merged.push_back({p.first, false});
          }
          previous_match = p.second;
        }
        break;
      case Behavior::kMergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->second && !previous_match && !merged.empty()) {
            merged.back().first.first = it->first.first;
          } else {
            merged.push_back({it->first, false});
          }
          previous_match = it->second;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case Behavior::kContiguous:
        for (auto& p : parts) {
          if (p.second == previous_match && !merged.empty()) {
            merged.back().first.second = p.first.second;
          } else {
            merged.push_back({p.first, false});
          }
          previous_match = p.second;
        }
        break;
    }
    for (const auto& [range, remove] : merged) {
      if (remove || range.first == range.second) continue;
      out.push_back({text.substr(range.first, range.second - range.first), piece.at_start && range.first == 0});
    }
  }
  *pieces = std::move(out);
  return Status::ok_status();
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    return split_pieces(pattern_, behavior_, invert_, pieces);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's word pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : *pieces)
        if (!p.text.empty() && p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');  // (empty: no-op, as tokenizers)
    }
    if (regex_) K3_RETURN_IF_ERROR(split_pieces(*regex_, Behavior::kIsolated, false, pieces));
    for (Piece& p : *pieces) p.text = bytes_to_chars(p.text);
    return Status::ok_status();
  }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> regex_;
};

enum class PrependScheme { kAlways, kNever, kFirst };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    const Pattern space = Pattern::literal(" ");
    for (Piece& p : *pieces) {
      K3_ASSIGN_OR_RETURN(p.text, space.replace_all(p.text, replacement_));
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!p.text.empty() && !starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start)))
        p.text.insert(0, replacement_);
    }
    if (split_) {
      K3_RETURN_IF_ERROR(split_pieces(Pattern::literal(replacement_), Behavior::kMergedWithNext, false, pieces));
    }
    return Status::ok_status();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status pre_tokenize(std::vector<Piece>* pieces) const override {
    for (const auto& step : steps_) K3_RETURN_IF_ERROR(step->pre_tokenize(pieces));
    return Status::ok_status();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

StatusOr<Behavior> parse_behavior(const Json& j, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string b, string_field(j, "behavior", path));
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return invalid_argument(join_path(path, "behavior") + ": unknown split behavior \"" + b + "\"");
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string type, component_type(j, path));
  if (type == "Split") {
    K3_ASSIGN_OR_RETURN(const Json* pj, field(j, "pattern", path));
    K3_ASSIGN_OR_RETURN(Pattern pattern, Pattern::from_json(*pj, join_path(path, "pattern")));
    K3_ASSIGN_OR_RETURN(Behavior behavior, parse_behavior(j, path));
    K3_ASSIGN_OR_RETURN(bool invert, bool_field(j, "invert", path, false));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "ByteLevel") {
    K3_ASSIGN_OR_RETURN(bool add_prefix_space, bool_field(j, "add_prefix_space", path, true));
    K3_ASSIGN_OR_RETURN(bool use_regex, bool_field(j, "use_regex", path, true));
    std::optional<Pattern> regex;
    if (use_regex) {
      K3_ASSIGN_OR_RETURN(Pattern p, Pattern::from_json(Json{{"Regex", kGpt2Pattern}}, path));
      regex = std::move(p);
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
  }
  if (type == "Metaspace") {
    K3_ASSIGN_OR_RETURN(std::string replacement, string_field(j, "replacement", path));
    if (replacement.empty()) return invalid_argument(join_path(path, "replacement") + ": empty");
    PrependScheme scheme = PrependScheme::kAlways;
    K3_ASSIGN_OR_RETURN(const Json* ps, optional_field(j, "prepend_scheme", path));
    if (ps != nullptr) {
      if (!ps->is_string()) return invalid_argument(join_path(path, "prepend_scheme") + ": expected a string");
      const std::string s = ps->get<std::string>();
      if (s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else {
        return invalid_argument(join_path(path, "prepend_scheme") + ": unknown scheme \"" + s + "\"");
      }
    } else {
      // Older files: add_prefix_space true/false.
      K3_ASSIGN_OR_RETURN(bool add, bool_field(j, "add_prefix_space", path, true));
      scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    K3_ASSIGN_OR_RETURN(bool split, bool_field(j, "split", path, true));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(replacement), scheme, split));
  }
  if (type == "Sequence") {
    K3_ASSIGN_OR_RETURN(const Json* list, field(j, "pretokenizers", path));
    if (!list->is_array()) return invalid_argument(join_path(path, "pretokenizers") + ": expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      K3_ASSIGN_OR_RETURN(
          auto step, make_pre_tokenizer((*list)[i], join_path(path, "pretokenizers") + "[" + std::to_string(i) + "]"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  return unimplemented(path + ": unsupported pre_tokenizer type \"" + type + "\"");
}

}  // namespace k3::tok
