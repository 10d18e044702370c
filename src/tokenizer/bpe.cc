// BPE model (see bpe.h). Behaviour mirrors tokenizers' model/bpe: the
// per-character start (with byte fallback and unk fusing), then merges.
#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace k3::tok {

StatusOr<BpeModel> BpeModel::from_json(const Json& j, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string type, optional_string(j, "type", path, "BPE"));
  if (type != "BPE") return unimplemented(join_path(path, "type") + ": unsupported model type \"" + type + "\"");
  BpeModel m;
  K3_ASSIGN_OR_RETURN(const Json* dropout, optional_field(j, "dropout", path));
  if (dropout != nullptr) return unimplemented(join_path(path, "dropout") + ": BPE dropout is not supported");

  K3_ASSIGN_OR_RETURN(const Json* vocab, field(j, "vocab", path));
  if (!vocab->is_object()) return invalid_argument(join_path(path, "vocab") + ": expected an object");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      return invalid_argument(join_path(path, "vocab") + "[\"" + it.key() + "\"]: expected a non-negative integer id");
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  m.vocab_.reserve(vocab->size());
  m.id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m.has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    m.vocab_[it.key()] = id;
    m.id_to_token_[id] = it.key();
    m.has_id_[id] = true;
  }

  K3_ASSIGN_OR_RETURN(m.continuing_subword_prefix_, optional_string(j, "continuing_subword_prefix", path, ""));
  K3_ASSIGN_OR_RETURN(m.end_of_word_suffix_, optional_string(j, "end_of_word_suffix", path, ""));
  K3_ASSIGN_OR_RETURN(m.fuse_unk_, bool_field(j, "fuse_unk", path, false));
  K3_ASSIGN_OR_RETURN(m.byte_fallback_, bool_field(j, "byte_fallback", path, false));
  K3_ASSIGN_OR_RETURN(m.ignore_merges_, bool_field(j, "ignore_merges", path, false));
  K3_ASSIGN_OR_RETURN(const Json* unk, optional_field(j, "unk_token", path));
  if (unk != nullptr) {
    if (!unk->is_string()) return invalid_argument(join_path(path, "unk_token") + ": expected a string");
    auto id = m.token_to_id(unk->get<std::string>());
    if (!id)
      return invalid_argument(join_path(path, "unk_token") + ": \"" + unk->get<std::string>() +
                              "\" is not in the vocabulary");
    m.unk_id_ = *id;
  }
  if (m.byte_fallback_) {
    m.byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto id = m.token_to_id(name)) m.byte_ids_[b] = *id;
    }
  }

  // Merges: "a b" strings (older files) or ["a", "b"] pairs; rank = position.
  K3_ASSIGN_OR_RETURN(const Json* merges, field(j, "merges", path));
  if (!merges->is_array()) return invalid_argument(join_path(path, "merges") + ": expected an array");
  m.merges_.reserve(merges->size());
  const std::string merges_path = join_path(path, "merges");
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& e = (*merges)[i];
    const std::string where = merges_path + "[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return invalid_argument(where + ": expected \"left right\" (one space), got \"" + s + "\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return invalid_argument(where + ": expected \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = m.token_to_id(a);
    auto ib = m.token_to_id(b);
    if (!ia || !ib) return invalid_argument(where + ": \"" + (ia ? b : a) + "\" is not in the vocabulary");
    std::string merged = a;
    if (!m.continuing_subword_prefix_.empty() &&
        b.compare(0, m.continuing_subword_prefix_.size(), m.continuing_subword_prefix_) == 0) {
      merged += b.substr(m.continuing_subword_prefix_.size());
    } else {
      merged += b;
    }
    auto inew = m.token_to_id(merged);
    if (!inew) return invalid_argument(where + ": merged token \"" + merged + "\" is not in the vocabulary");
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    m.merges_[pair_key(*ia, *ib)] = Merge{static_cast<uint32_t>(i), *inew};
  }
  return m;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      ids->push_back(*id);
      return;
    }
  }
  // Initial symbols: one per character (or per byte with byte fallback).
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  int32_t pending_unk = -1;  // id of a pending unknown run (fuse_unk), -1 when none
  std::string s;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    pos += static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(word[pos])));
    if (pos > word.size()) pos = word.size();
    s.assign(word.substr(start, pos - start));
    if (start != 0 && !continuing_subword_prefix_.empty()) s.insert(0, continuing_subword_prefix_);
    if (pos == word.size() && !end_of_word_suffix_.empty()) s += end_of_word_suffix_;
    if (auto id = token_to_id(s)) {
      if (pending_unk >= 0) {
        symbols.push_back(pending_unk);
        pending_unk = -1;
      }
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);

  // Merge loop over a doubly linked list of symbols; stale queue entries are
  // recognised by the pair no longer producing the entry's token.
  const int n = static_cast<int>(symbols.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Entry {
    uint32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  for (int i = 0; i + 1 < n; ++i)
    if (const Merge* mg = find_merge(symbols[i], symbols[i + 1])) queue.push({mg->rank, i, mg->new_id});
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    const Merge* mg = find_merge(symbols[top.pos], symbols[right]);
    if (mg == nullptr || mg->new_id != top.new_id) continue;
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      const int p = prev[top.pos];
      if (const Merge* m2 = find_merge(symbols[p], symbols[top.pos])) queue.push({m2->rank, p, m2->new_id});
    }
    if (next[top.pos] >= 0) {
      if (const Merge* m2 = find_merge(symbols[top.pos], symbols[next[top.pos]]))
        queue.push({m2->rank, top.pos, m2->new_id});
    }
  }
  for (int i = 0; i < n; ++i)
    if (alive[i]) ids->push_back(symbols[i]);
}

}  // namespace k3::tok
