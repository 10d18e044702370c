// String/Regex patterns (see pattern.h).
#include "tokenizer/pattern.h"

namespace k3::tok {

StatusOr<Pattern> Pattern::from_json(const Json& j, const std::string& path) {
  if (!j.is_object()) return invalid_argument(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
  Pattern p;
  if (j.contains("String")) {
    K3_ASSIGN_OR_RETURN(p.literal_, string_field(j, "String", path));
    if (p.literal_.empty()) return invalid_argument(path + ".String: empty pattern");
    return p;
  }
  if (j.contains("Regex")) {
    K3_ASSIGN_OR_RETURN(std::string re, string_field(j, "Regex", path));
    auto compiled = Regex::compile(re);
    if (!compiled.ok()) return compiled.status().with_context(path + ".Regex");
    p.regex_ = std::move(compiled).value();
    return p;
  }
  return invalid_argument(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
}

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

StatusOr<std::vector<std::pair<size_t, size_t>>> Pattern::find_all(std::string_view text) const {
  if (regex_) return regex_->find_all(text);
  std::vector<std::pair<size_t, size_t>> out;
  if (literal_.empty()) return out;
  size_t pos = 0;
  while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal_.size());
    pos += literal_.size();
  }
  return out;
}

StatusOr<std::string> Pattern::replace_all(std::string_view text, std::string_view content) const {
  K3_ASSIGN_OR_RETURN(auto matches, find_all(text));
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    out.append(text.substr(prev, s - prev));
    out.append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace k3::tok
