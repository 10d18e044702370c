// Normalizer implementations (see normalizer.h).
#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  StatusOr<std::string> normalize(std::string text) const override { return normalize_unicode(text, form_); }

 private:
  NormalForm form_;
};

// Prepends a string to non-empty text (SentencePiece's leading "▁").
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  StatusOr<std::string> normalize(std::string text) const override {
    if (text.empty()) return text;
    return prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  StatusOr<std::string> normalize(std::string text) const override { return pattern_.replace_all(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  StatusOr<std::string> normalize(std::string text) const override {
    for (const auto& step : steps_) {
      K3_ASSIGN_OR_RETURN(text, step->normalize(std::move(text)));
    }
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string type, component_type(j, path));
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkd));
  if (type == "Prepend") {
    K3_ASSIGN_OR_RETURN(std::string prefix, string_field(j, "prepend", path));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    K3_ASSIGN_OR_RETURN(const Json* pj, field(j, "pattern", path));
    K3_ASSIGN_OR_RETURN(Pattern pattern, Pattern::from_json(*pj, join_path(path, "pattern")));
    K3_ASSIGN_OR_RETURN(std::string content, string_field(j, "content", path));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "Sequence") {
    K3_ASSIGN_OR_RETURN(const Json* list, field(j, "normalizers", path));
    if (!list->is_array()) return invalid_argument(join_path(path, "normalizers") + ": expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      K3_ASSIGN_OR_RETURN(auto step,
                          make_normalizer((*list)[i], join_path(path, "normalizers") + "[" + std::to_string(i) + "]"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return unimplemented(path + ": unsupported normalizer type \"" + type + "\"");
}

}  // namespace k3::tok
