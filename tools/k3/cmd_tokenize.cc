// k3 tokenize / k3 detokenize: run a Hugging Face tokenizer (tokenizer.json)
// from the command line, to debug prompts and compare ids with other tools.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "text_io.h"
#include "tokenizer/tokenizer.h"

namespace k3::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer;
  std::string text;
  std::vector<std::string> text_files;
  bool no_special = false;
  bool add_special = false;
  bool no_add_special = false;
  bool json = false;
};

struct DetokenizeFlags {
  std::string tokenizer;
  std::vector<std::string> ids;
  std::string ids_file;
  bool skip_special = false;
  bool stream = false;
  bool json = false;
};

int run_tokenize(const TokenizeFlags& f) {
  if (f.text_files.empty() == f.text.empty())
    return report(invalid_argument("give either --text or --text-file (one or more), not both"));
  std::vector<std::string> texts;
  if (f.text_files.empty()) texts.push_back(f.text);
  for (const std::string& path : f.text_files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return report(not_found("cannot open " + path));
    std::ostringstream ss;
    ss << in.rdbuf();
    texts.push_back(ss.str());
  }
  auto tok = tok::Tokenizer::load(f.tokenizer);
  if (!tok.ok()) return report(tok.status());
  tok::EncodeOptions options;
  options.parse_special = !f.no_special;
  options.add_special_tokens = !f.no_add_special;
  // One output line per text, in order.
  for (const std::string& text : texts) {
    auto ids = tok->encode(text, options);
    if (!ids.ok()) return report(ids.status());
    if (f.json) {
      nlohmann::json tokens = nlohmann::json::array();
      for (int32_t id : *ids) tokens.push_back(*tok->id_to_token(id));
      nlohmann::json out = {{"text", text}, {"ids", *ids}, {"tokens", tokens}};
      std::printf("%s\n", dump_json(out).c_str());
    } else {
      std::string line;
      for (size_t i = 0; i < ids->size(); ++i) line += (i ? "," : "") + std::to_string((*ids)[i]);
      std::printf("%s\n", line.c_str());
    }
  }
  return 0;
}

// Text of one id list ("" is the empty list).
int detokenize_one(const DetokenizeFlags& f, const tok::Tokenizer& tok, const std::string& id_text) {
  auto ids = id_text.empty() ? StatusOr<std::vector<int32_t>>(std::vector<int32_t>()) : parse_id_list(id_text);
  if (!ids.ok()) return report(ids.status());
  std::string text;
  if (f.stream) {
    // Token by token through the streaming detokenizer, as a generation loop would.
    tok::StreamDecoder stream(tok, f.skip_special);
    for (int32_t id : *ids) {
      auto piece = stream.push(id);
      if (!piece.ok()) return report(piece.status());
      text += *piece;
    }
    text += stream.finish();
  } else {
    auto decoded = tok.decode(*ids, f.skip_special);
    if (!decoded.ok()) return report(decoded.status());
    text = std::move(decoded).value();
  }
  if (f.json) {
    std::printf("%s\n", dump_json({{"text", text}, {"ids", *ids}}).c_str());
  } else {
    text.push_back('\n');
    std::fwrite(text.data(), 1, text.size(), stdout);  // (the text may hold NUL characters)
  }
  return 0;
}

int run_detokenize(const DetokenizeFlags& f) {
  auto tok = tok::Tokenizer::load(f.tokenizer);
  if (!tok.ok()) return report(tok.status());
  std::vector<std::string> lists = f.ids;
  if (!f.ids_file.empty()) {
    std::ifstream in(f.ids_file);
    if (!in) return report(not_found("cannot open " + f.ids_file));
    for (std::string line; std::getline(in, line);) lists.push_back(line);
  }
  if (lists.empty()) return report(invalid_argument("give --ids or --ids-file"));
  for (const std::string& ids : lists) {
    const int rc = detokenize_one(f, *tok, ids);
    if (rc != 0) return rc;
  }
  return 0;
}

}  // namespace

Registered add_tokenize(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* sub = app.add_subcommand("tokenize", "Text -> token ids with a Hugging Face tokenizer.json");
  sub->add_option("--tokenizer", f->tokenizer, "Directory holding tokenizer.json, or the file itself")->required();
  sub->add_option("--text", f->text, "The text to tokenize");
  sub->add_option("--text-file", f->text_files, "Read the text (raw bytes) from this file; repeat for several")
      ->allow_extra_args(false);
  sub->add_flag("--no-special", f->no_special,
                "Do not parse special tokens written in the text (for untrusted user text)");
  auto* add = sub->add_flag("--add-special", f->add_special, "Add the post-processor's tokens, e.g. BOS (default)");
  auto* no_add = sub->add_flag("--no-add-special", f->no_add_special, "Do not add BOS/EOS tokens");
  add->excludes(no_add);
  sub->add_flag("--json", f->json, "Print {\"text\", \"ids\", \"tokens\"} as JSON");
  return {sub, [f]() { return run_tokenize(*f); }};
}

Registered add_detokenize(CLI::App& app) {
  auto f = std::make_shared<DetokenizeFlags>();
  CLI::App* sub = app.add_subcommand("detokenize", "Token ids -> text with a Hugging Face tokenizer.json");
  sub->add_option("--tokenizer", f->tokenizer, "Directory holding tokenizer.json, or the file itself")->required();
  sub->add_option("--ids", f->ids, "Comma-separated token ids; repeat for several (one output line each)")
      ->allow_extra_args(false);
  sub->add_option("--ids-file", f->ids_file, "Read id lists from this file, one comma-separated list per line");
  sub->add_flag("--skip-special", f->skip_special, "Leave special tokens out of the text");
  sub->add_flag("--stream", f->stream, "Decode id by id with the streaming detokenizer");
  sub->add_flag("--json", f->json, "Print {\"text\", \"ids\"} as JSON");
  return {sub, [f]() { return run_detokenize(*f); }};
}

}  // namespace k3::cli
