// The BPE model: vocabulary, merge ranks, byte fallback, unknown token and
// ignore_merges, with the merge loop of Hugging Face tokenizers (lowest rank
// first, leftmost on ties) driven by a priority queue, so a word of n
// characters costs O(n log n) rather than the O(n^2) of rescanning all pairs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_fields.h"

namespace k3::tok {

class BpeModel {
 public:
  // From tokenizer.json "model" (type "BPE"); path names it in errors.
  static StatusOr<BpeModel> from_json(const Json& j, const std::string& path);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // Token text for id, or nullptr if the vocabulary has no such id.
  const std::string* id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One more than the largest id in the vocabulary.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct PairHash {
    size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k * 0x9E3779B97F4A7C15ull); }
  };
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge, PairHash> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Ids of the "<0xXX>" tokens when byte_fallback is on (-1 when absent).
  std::vector<int32_t> byte_ids_;
};

}  // namespace k3::tok
