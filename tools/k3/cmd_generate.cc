// k3 generate: prefill + decode with timing; token ids in and out, or text
// through the model's Hugging Face tokenizer (streamed as it is generated).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "commands.h"
#include "runtime/generator.h"
#include "tensor_dump.h"
#include "text_io.h"
#include "util/npy.h"

namespace k3::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::vector<std::string> prompt_ids;
  std::string prompt_ids_file;
  std::vector<std::string> prompts;       // text
  std::vector<std::string> prompt_files;  // text, one prompt per file
  std::string tokenizer;
  bool no_parse_special = false;
  bool special = false;
  int64_t max_new_tokens = 32;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  int64_t seed = -1;
  int threads = 0;
  std::string cpus;
  bool mmap = false;
  int64_t ctx_size = 0;
  int64_t prefill_chunk = 128;
  std::string isa;
  std::string prefetch;
  std::string dump_logits;
  std::string dump_tensors;
  bool reference = false;
  bool moe_dense = false;
  bool json = false;
};

StatusOr<std::vector<std::vector<int32_t>>> read_prompts(const GenerateFlags& f) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : f.prompt_ids) {
    K3_ASSIGN_OR_RETURN(auto ids, parse_id_list(p));
    prompts.push_back(std::move(ids));
  }
  if (!f.prompt_ids_file.empty()) {
    std::ifstream in(f.prompt_ids_file);
    if (!in) return io_error("cannot open " + f.prompt_ids_file);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto ids = parse_id_list(line);
      if (!ids.ok()) return ids.status().with_context(f.prompt_ids_file + ":" + std::to_string(line_no));
      prompts.push_back(std::move(ids).value());
    }
  }
  return prompts;
}

bool has_text_prompts(const GenerateFlags& f) {
  return !f.prompts.empty() || !f.prompt_files.empty();
}

// Text prompts -> ids with the model's tokenizer (BOS etc. as its
// post-processor adds them).
StatusOr<std::vector<std::vector<int32_t>>> encode_prompts(const GenerateFlags& f, const tok::Tokenizer& t) {
  K3_ASSIGN_OR_RETURN(auto texts, read_prompt_texts(f.prompts, f.prompt_files));
  tok::EncodeOptions eo;
  eo.parse_special = !f.no_parse_special;
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < texts.size(); ++i) {
    K3_ASSIGN_OR_RETURN(auto ids, t.encode(texts[i], eo));
    if (ids.empty()) return invalid_argument("prompt " + std::to_string(i) + " is empty after tokenization");
    out.push_back(std::move(ids));
  }
  return out;
}

int run_generate(const GenerateFlags& f) {
  if (has_text_prompts(f) && (!f.prompt_ids.empty() || !f.prompt_ids_file.empty()))
    return report(invalid_argument("give text prompts (--prompt/--prompt-file) or ids (--prompt-ids), not both"));
  if (!has_text_prompts(f) && f.prompt_ids.empty() && f.prompt_ids_file.empty())
    return report(invalid_argument("no prompt: give --prompt, --prompt-file, --prompt-ids or --prompt-ids-file"));
  auto prompts = read_prompts(f);
  if (!prompts.ok()) return report(prompts.status());
  // Text prompts are counted for the engine's batch before it loads; they
  // are tokenized once the model (and so its vocabulary) is known.
  const size_t n_prompts = has_text_prompts(f) ? f.prompts.size() + f.prompt_files.size() : prompts->size();
  if (!f.dump_tensors.empty() && n_prompts != 1)
    return report(invalid_argument("--dump-tensors needs exactly one prompt (got " + std::to_string(n_prompts) + ")"));
  runtime::EngineOptions eo;
  eo.threads = f.threads;
  eo.cpus = f.cpus;
  eo.mmap = f.mmap;
  eo.max_batch = static_cast<int64_t>(n_prompts);
  eo.ctx_len = f.ctx_size;
  eo.prefill_chunk = f.prefill_chunk;
  // The dump prefills the whole prompt in one step (text prompts: the
  // chunk is widened below, once they are tokenized).
  if (!f.dump_tensors.empty() && !prompts->empty())
    eo.prefill_chunk = std::max<int64_t>(eo.prefill_chunk, static_cast<int64_t>(prompts->front().size()));
  eo.reference = f.reference;
  eo.moe_dense = f.moe_dense;
  // A dump from a checkpoint keeps the residual Adds apart, so it holds
  // every tensor the reference dump has (a .k3m was fused when compiled).
  if (!f.dump_tensors.empty()) eo.disabled_passes = {"fuse-residual-add"};
  auto kt = kernels_for_isa_flag(f.isa, f.prefetch);
  if (!kt.ok()) return report(kt.status());
  eo.kernels = *kt;
  const auto t_load = std::chrono::steady_clock::now();
  auto engine = runtime::Engine::load(f.model, eo);
  if (!engine.ok()) return report(engine.status());
  note_layout_kernels(**engine);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();

  std::optional<tok::Tokenizer> tokenizer;
  if (has_text_prompts(f)) {
    auto t = load_model_tokenizer(f.model, f.tokenizer, (*engine)->config().vocab_size);
    if (!t.ok()) return report(t.status());
    tokenizer.emplace(std::move(t).value());
    auto ids = encode_prompts(f, *tokenizer);
    if (!ids.ok()) return report(ids.status());
    *prompts = std::move(ids).value();
    if (!f.dump_tensors.empty() && static_cast<int64_t>(prompts->front().size()) > (*engine)->prefill_chunk())
      return report(invalid_argument("--dump-tensors with a text prompt of " + std::to_string(prompts->front().size()) +
                                     " tokens needs --prefill-chunk >= that"));
  }

  if (!f.dump_tensors.empty()) {
    Status s = dump_tensors(**engine, prompts->front(), f.dump_tensors);
    if (!s.ok()) return report(s);
  }

  runtime::GenerateOptions go;
  go.max_new_tokens = f.max_new_tokens;
  go.sampling.temperature = f.temperature;
  go.sampling.top_k = f.top_k;
  go.sampling.top_p = f.top_p;
  go.sampling.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  std::vector<std::vector<float>> logits;
  if (!f.dump_logits.empty()) {
    if (prompts->size() != 1) return report(invalid_argument("--dump-logits needs exactly one prompt"));
    go.logits_out = &logits;
  }
  // Text output: one prompt streams its text to stdout as it is generated;
  // several prompts (decoded together, interleaved) are printed at the end.
  std::optional<StdoutTextStream> stream;
  if (tokenizer) {
    add_tokenizer_stop(*tokenizer, go.stop_ids);
    if (!f.json && prompts->size() == 1) {
      stream.emplace(*tokenizer, !f.special);
      go.on_token = [&](int64_t, int32_t id) { stream->push(id); };
    }
  }
  runtime::Generator gen(**engine);
  auto r = gen.generate(*prompts, go);
  if (!r.ok()) return report(r.status());
  if (stream && !stream->status().ok()) return report(stream->status());
  std::vector<std::string> texts;
  if (tokenizer) {
    for (const auto& toks : r->tokens) {
      auto text = generated_text(*tokenizer, toks, !f.special);
      if (!text.ok()) return report(text.status());
      texts.push_back(std::move(text).value());
    }
  }
  if (!f.dump_logits.empty()) {
    const int64_t v = (*engine)->config().vocab_size;
    const int64_t steps = static_cast<int64_t>(logits[0].size()) / v;
    Status s = write_npy_f32(f.dump_logits, logits[0].data(), {1, steps, v});
    if (!s.ok()) return report(s);
  }
  // Timing: TTFT covers every prompt's prefill and first token; decode time
  // per token is per decode step (each step gives every active sequence one).
  const double ms_per_step = r->decode_steps > 0 ? r->decode_ms / static_cast<double>(r->decode_steps) : 0.0;
  const double tok_s = r->decode_ms > 0 ? static_cast<double>(r->decode_tokens) / (r->decode_ms / 1e3) : 0.0;
  if (f.json) {
    nlohmann::json j;
    j["generated_ids"] = r->tokens;
    j["finish_reason"] = r->finish_reason;
    j["prompt_tokens"] = r->prompt_tokens;
    j["ttft_ms"] = r->prefill_ms;
    j["decode_ms_per_token"] = ms_per_step;
    j["tokens_per_s"] = tok_s;
    j["decode_steps"] = r->decode_steps;
    // Bytes of weights a batch-1 decode step reads, in their stored dtypes.
    const double weight_bytes = static_cast<double>((*engine)->weight_bytes_per_token());
    j["weight_bytes_per_token"] = weight_bytes;
    if (prompts->size() == 1 && ms_per_step > 0) j["effective_weight_gb_per_s"] = weight_bytes / (ms_per_step * 1e6);
    j["load_ms"] = load_ms;
    j["threads"] = (*engine)->threads();
    j["isa"] = std::string(kernels::isa_name((*engine)->kernels().isa));
    const std::string_view prefetch = kernels::table_prefetch((*engine)->kernels());
    j["prefetch"] = prefetch.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(prefetch));
    j["seed"] = go.sampling.seed;
    if (tokenizer) {
      j["prompt_ids"] = *prompts;
      j["text"] = texts;
    }
    std::printf("%s\n", dump_json(j).c_str());
  } else {
    if (stream) {
      stream->finish_line();
    } else if (tokenizer) {
      for (const std::string& text : texts) std::printf("%s\n", text.c_str());
    } else {
      for (const auto& toks : r->tokens) {
        for (size_t i = 0; i < toks.size(); ++i) std::printf("%s%d", i ? "," : "", toks[i]);
        std::printf("\n");
      }
    }
    std::fflush(stdout);
    std::fprintf(stderr, "prompt %ld tokens, TTFT %.2f ms, decode %.3f ms/token (%.1f tokens/s), %d threads, %s\n",
                 static_cast<long>(r->prompt_tokens), r->prefill_ms, ms_per_step, tok_s, (*engine)->threads(),
                 kernels::table_label((*engine)->kernels()).c_str());
  }
  return 0;
}

}  // namespace

Registered add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text or tokens from prompts given as text or token ids");
  sub->add_option("-m,--model", f->model,
                  "Model: a .k3m file (k3 compile) or a checkpoint directory (config.json + model.safetensors)")
      ->required();
  sub->add_option("--prompt-ids", f->prompt_ids,
                  "Prompt as comma-separated token ids; repeat for several prompts (decoded together)");
  sub->add_option("--prompt-ids-file", f->prompt_ids_file, "File with one prompt per line (comma-separated ids)");
  sub->add_option("-p,--prompt", f->prompts,
                  "Prompt text, tokenized with the model's tokenizer; repeat for several prompts (decoded together)");
  sub->add_option("-f,--prompt-file", f->prompt_files, "File whose whole content is one text prompt; repeatable");
  sub->add_option("--tokenizer", f->tokenizer,
                  "tokenizer.json (or its directory) for text prompts; default: the one in the model's directory");
  sub->add_flag("--no-parse-special", f->no_parse_special,
                "Keep special-token text in prompts (e.g. \"<|im_end|>\") as plain text");
  sub->add_flag("--special", f->special, "Print special tokens in the generated text");
  sub->add_option("-n,--max-new-tokens", f->max_new_tokens, "Tokens to generate per prompt")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  sub->add_option("--temp,--temperature", f->temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-k", f->top_k, "Keep the k most likely tokens; 0 = all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sub->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1]; 1 = off")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("-s,--seed", f->seed, "Random seed; -1 = random (the seed used is printed with --json)")
      ->check(CLI::Range(int64_t{-1}, INT64_MAX));
  sub->add_option("-t,--threads", f->threads, "Threads; 0 = all cores")->check(CLI::Range(0, 1024));
  sub->add_option("--cpus", f->cpus,
                  "Pin thread t to the t-th CPU of this list (taskset -c syntax, e.g. 0,1 or 0-3); "
                  "one CPU per thread, --threads defaults to their count");
  add_mmap_flag(sub, &f->mmap);
  sub->add_option("-c,--ctx-size", f->ctx_size, "KV cache positions per sequence; 0 = the model's max_seq_len")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  sub->add_option("--prefill-chunk", f->prefill_chunk, "Prompt tokens per prefill step")
      ->check(CLI::Range(int64_t{1}, int64_t{8192}));
  add_isa_flag(sub, &f->isa, &f->prefetch);
  sub->add_flag("--moe-dense", f->moe_dense,
                "Run the article's dense MoE (every expert on every token, masked); for measuring");
  sub->add_flag("--reference", f->reference, "Run the scalar reference ops (slow; for checking)");
  sub->add_option("--dump-logits", f->dump_logits,
                  "Write the logits of every generated step to a float32 .npy [1, steps, vocab]");
  sub->add_option("--dump-tensors", f->dump_tensors,
                  "Write every node's output of the prefill step and of one greedy decode step as .npy files under "
                  "DIR/step0, DIR/step1 (one prompt; see docs/debugging.md)");
  sub->add_flag("--json", f->json, "Print one JSON object with ids and timings");
  return {sub, [f]() { return run_generate(*f); }};
}

}  // namespace k3::cli
