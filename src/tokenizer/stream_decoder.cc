// Streaming detokenizer (see StreamDecoder in tokenizer.h).
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace k3::tok {

StatusOr<std::string> StreamDecoder::push(int32_t id) {
  const std::string* token = tokenizer_->id_to_token(id);
  if (token == nullptr) return out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
  if (skip_special_ && tokenizer_->is_special(id)) return std::string();
  K3_ASSIGN_OR_RETURN(std::string bytes, tokenizer_->decoder().piece(*token, index_));
  ++index_;
  pending_ += bytes;
  std::string out;
  const size_t used = utf8_lossy_append(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8_lossy_append(pending_, /*final=*/true, &out);
  pending_.clear();
  index_ = 0;
  return out;
}

}  // namespace k3::tok
