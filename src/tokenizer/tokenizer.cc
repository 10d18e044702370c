// Tokenizer loading and the encode/decode pipelines (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

StatusOr<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return not_found("cannot open " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read " + p.string());
  return ss.str();
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
StatusOr<std::string> config_token(const Json& cfg, const char* key) {
  K3_ASSIGN_OR_RETURN(const Json* v, optional_field(cfg, key, ""));
  if (v == nullptr) return std::string();
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return string_field(*v, "content", key);
  return invalid_argument(std::string(key) + ": expected a string or {\"content\": ...}");
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "tokenizer.json";
  K3_ASSIGN_OR_RETURN(std::string text, read_file(p));
  std::string config;
  const auto config_path = p.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) {
    K3_ASSIGN_OR_RETURN(config, read_file(config_path));
  }
  auto tok = from_json_text(text, config);
  if (!tok.ok()) return tok.status().with_context(p.string());
  return tok;
}

StatusOr<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view config_json) {
  const Json j = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("tokenizer.json is not valid JSON");
  if (!j.is_object()) return invalid_argument("tokenizer.json: expected an object at the top level");
  Tokenizer t;

  K3_ASSIGN_OR_RETURN(const Json* norm, optional_field(j, "normalizer", ""));
  if (norm != nullptr) {
    K3_ASSIGN_OR_RETURN(t.normalizer_, make_normalizer(*norm, "normalizer"));
  }
  K3_ASSIGN_OR_RETURN(const Json* pre, optional_field(j, "pre_tokenizer", ""));
  if (pre != nullptr) {
    K3_ASSIGN_OR_RETURN(t.pre_tokenizer_, make_pre_tokenizer(*pre, "pre_tokenizer"));
  }
  K3_ASSIGN_OR_RETURN(const Json* model, field(j, "model", ""));
  K3_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::from_json(*model, "model"));
  t.model_ = std::move(bpe);

  K3_ASSIGN_OR_RETURN(const Json* added, optional_field(j, "added_tokens", ""));
  if (added != nullptr) {
    K3_ASSIGN_OR_RETURN(t.added_, AddedVocab::from_json(*added, "added_tokens", t.normalizer_.get()));
  } else {
    K3_ASSIGN_OR_RETURN(t.added_, AddedVocab::from_json(Json::array(), "added_tokens", nullptr));
  }

  K3_ASSIGN_OR_RETURN(const Json* dec, optional_field(j, "decoder", ""));
  K3_ASSIGN_OR_RETURN(t.decoder_, Decoder::from_json(dec, "decoder"));

  // Post-processor: the single-sequence template, flattened to prefix/suffix.
  K3_ASSIGN_OR_RETURN(const Json* post, optional_field(j, "post_processor", ""));
  std::vector<std::pair<const Json*, std::string>> todo;
  if (post != nullptr) todo.push_back({post, "post_processor"});
  while (!todo.empty()) {
    auto [pj, path] = todo.front();
    todo.erase(todo.begin());
    K3_ASSIGN_OR_RETURN(std::string type, component_type(*pj, path));
    if (type == "ByteLevel") continue;  // only adjusts offsets, which K3 does not report
    if (type == "Sequence") {
      K3_ASSIGN_OR_RETURN(const Json* list, field(*pj, "processors", path));
      if (!list->is_array()) return invalid_argument(join_path(path, "processors") + ": expected an array");
      for (size_t i = 0; i < list->size(); ++i)
        todo.push_back({&(*list)[i], join_path(path, "processors") + "[" + std::to_string(i) + "]"});
      continue;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      for (const char* key : {"cls", "sep"}) {
        K3_ASSIGN_OR_RETURN(const Json* pair, field(*pj, key, path));
        if (!pair->is_array() || pair->size() != 2 || !(*pair)[1].is_number_integer())
          return invalid_argument(join_path(path, key) + ": expected [\"token\", id]");
        (key[0] == 'c' ? t.prefix_ : t.suffix_).push_back((*pair)[1].get<int32_t>());
      }
      continue;
    }
    if (type != "TemplateProcessing") return unimplemented(path + ": unsupported post_processor type \"" + type + "\"");
    K3_ASSIGN_OR_RETURN(const Json* single, field(*pj, "single", path));
    K3_ASSIGN_OR_RETURN(const Json* specials, field(*pj, "special_tokens", path));
    if (!single->is_array()) return invalid_argument(join_path(path, "single") + ": expected an array");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& item = (*single)[i];
      const std::string where = join_path(path, "single") + "[" + std::to_string(i) + "]";
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      K3_ASSIGN_OR_RETURN(const Json* st, field(item, "SpecialToken", where));
      K3_ASSIGN_OR_RETURN(std::string name, string_field(*st, "id", join_path(where, "SpecialToken")));
      K3_ASSIGN_OR_RETURN(const Json* entry, field(*specials, name.c_str(), join_path(path, "special_tokens")));
      K3_ASSIGN_OR_RETURN(const Json* ids, field(*entry, "ids", join_path(path, "special_tokens") + "." + name));
      if (!ids->is_array())
        return invalid_argument(join_path(path, "special_tokens") + "." + name + ".ids: expected an array");
      for (const Json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          return invalid_argument(join_path(path, "special_tokens") + "." + name + ".ids: expected token ids");
        (seen_sequence ? t.suffix_ : t.prefix_).push_back(id.get<int32_t>());
      }
    }
  }

  if (!config_json.empty()) {
    const Json cfg = Json::parse(config_json, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object())
      return invalid_argument("tokenizer_config.json is not a valid JSON object");
    auto bos = config_token(cfg, "bos_token");
    if (!bos.ok()) return bos.status().with_context("tokenizer_config.json");
    auto eos = config_token(cfg, "eos_token");
    if (!eos.ok()) return eos.status().with_context("tokenizer_config.json");
    t.bos_token_ = *bos;
    t.eos_token_ = *eos;
  }
  return t;
}

StatusOr<std::vector<int32_t>> Tokenizer::encode(std::string_view raw, const EncodeOptions& options) const {
  const std::string text = utf8_lossy(raw);
  std::vector<int32_t> ids = options.add_special_tokens ? prefix_ : std::vector<int32_t>();
  std::vector<Piece> pieces;
  for (const Segment& seg : added_.split(text, 0, /*normalized_pass=*/false, options.parse_special)) {
    if (seg.id) {
      ids.push_back(*seg.id);
      continue;
    }
    std::string normalized = seg.text;
    if (normalizer_ && !normalized.empty()) {
      K3_ASSIGN_OR_RETURN(normalized, normalizer_->normalize(std::move(normalized)));
    }
    for (const Segment& sub : added_.split(normalized, seg.offset, /*normalized_pass=*/true, options.parse_special)) {
      if (sub.id) {
        ids.push_back(*sub.id);
        continue;
      }
      if (sub.text.empty()) continue;
      pieces.clear();
      pieces.push_back({sub.text, sub.offset == 0});
      if (pre_tokenizer_) K3_RETURN_IF_ERROR(pre_tokenizer_->pre_tokenize(&pieces));
      for (const Piece& p : pieces) model_->tokenize(p.text, &ids);
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

const std::string* Tokenizer::id_to_token(int32_t id) const {
  if (const std::string* t = added_.text_for_id(id)) return t;
  return model_->id_to_token(id);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.find_content(token)) return id;
  return model_->token_to_id(token);
}

int32_t Tokenizer::vocab_size() const {
  int32_t n = model_->vocab_size();
  for (const AddedToken& t : added_.tokens()) n = std::max(n, t.id + 1);
  return n;
}

StatusOr<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = id_to_token(id);
    if (token == nullptr) return out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special_tokens && added_.is_special_id(id)) continue;
    tokens.push_back(*token);
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace k3::tok
