// Tokenizer lookup and prompt text reading for k3 generate (see text_io.h).
#include "text_io.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace k3::cli {

namespace fs = std::filesystem;

StatusOr<tok::Tokenizer> load_model_tokenizer(const std::string& model, const std::string& explicit_path,
                                              int64_t vocab_size) {
  std::string path = explicit_path;
  if (path.empty()) {
    std::error_code ec;
    const fs::path dir = fs::is_directory(model, ec) ? fs::path(model) : fs::path(model).parent_path();
    const fs::path file = (dir.empty() ? fs::path(".") : dir) / "tokenizer.json";
    if (!fs::is_regular_file(file, ec))
      return not_found("text prompts need a tokenizer: no " + file.string() + "; give --tokenizer PATH");
    path = file.string();
  }
  K3_ASSIGN_OR_RETURN(tok::Tokenizer t, tok::Tokenizer::load(path));
  if (t.vocab_size() > vocab_size)
    return invalid_argument("tokenizer " + path + " has ids up to " + std::to_string(t.vocab_size() - 1) +
                            " but the model's vocabulary has " + std::to_string(vocab_size) + " entries");
  return t;
}

StatusOr<std::vector<std::string>> read_prompt_texts(const std::vector<std::string>& prompts,
                                                     const std::vector<std::string>& files) {
  std::vector<std::string> texts = prompts;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open prompt file " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    texts.push_back(ss.str());
  }
  return texts;
}

StatusOr<std::string> generated_text(const tok::Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (t.id_to_token(id) != nullptr) known.push_back(id);
  return t.decode(known, skip_special);
}

void add_tokenizer_stop(const tok::Tokenizer& t, std::vector<int32_t>& stop_ids) {
  if (const std::string& eos = t.eos_token(); !eos.empty())
    if (auto id = t.token_to_id(eos)) stop_ids.push_back(*id);
}

void StdoutTextStream::push(int32_t id) {
  if (tokenizer_->id_to_token(id) == nullptr) return;  // see generated_text
  auto piece = decoder_.push(id);
  if (!piece.ok()) {
    if (status_.ok()) status_ = piece.status();
    return;
  }
  std::fputs(piece->c_str(), stdout);
  std::fflush(stdout);
}

void StdoutTextStream::finish_line() {
  std::printf("%s\n", decoder_.finish().c_str());
  std::fflush(stdout);
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace k3::cli
