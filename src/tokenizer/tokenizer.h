// A Hugging Face tokenizer loaded from tokenizer.json (+ tokenizer_config.json
// when present): added tokens -> normalizer -> pre-tokenizer -> BPE ->
// post-processor on the way in, decoder on the way out. Ids match the Python
// `tokenizers` library for the supported components (docs/tokenizer.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace k3::tok {

struct EncodeOptions {
  // Add the post-processor's tokens (e.g. BOS) around the text.
  bool add_special_tokens = true;
  // Recognise special tokens written in the text. Turn off for text typed by
  // a user, so "<|im_start|>" in it stays plain text.
  bool parse_special = true;
};

class Tokenizer {
 public:
  // PATH is a directory holding tokenizer.json, or the tokenizer.json file;
  // tokenizer_config.json next to it is read when present.
  static StatusOr<Tokenizer> load(const std::string& path);
  // From the text of tokenizer.json (and optionally tokenizer_config.json).
  static StatusOr<Tokenizer> from_json_text(std::string_view tokenizer_json, std::string_view config_json = "");

  // Invalid UTF-8 in text is first replaced by U+FFFD (as Python's
  // bytes.decode("utf-8", "replace") does), so encoding never fails on it.
  StatusOr<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Ids outside the vocabulary are an error (the Python library drops them).
  StatusOr<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Token text for id (added tokens first), or nullptr.
  const std::string* id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const { return added_.is_special_id(id); }
  // One more than the largest id (model vocabulary or added token).
  int32_t vocab_size() const;
  const Decoder& decoder() const { return decoder_; }

  // From tokenizer_config.json, empty when absent.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  Tokenizer() = default;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::optional<BpeModel> model_;
  AddedVocab added_;
  Decoder decoder_;
  // Post-processor template for one sequence: prefix + ids + suffix.
  std::vector<int32_t> prefix_, suffix_;
  std::string bos_token_, eos_token_;
};

// Streaming detokenizer: feed ids one at a time, get text that is always
// whole UTF-8 characters. Bytes of an incomplete character are held back
// until the character completes; bytes that can never form one come out as
// U+FFFD, and finish() flushes what is still held as U+FFFD.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  // Text that became complete with this id (may be empty).
  StatusOr<std::string> push(int32_t id);
  // Whatever is still held back, as U+FFFD; the decoder starts over after it.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  size_t index_ = 0;     // tokens emitted so far (decoders treat the first one specially)
  std::string pending_;  // bytes of an incomplete character
};

}  // namespace k3::tok
