// Oniguruma wrapper (see regex.h for why Oniguruma).
#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "tokenizer/unicode.h"

namespace k3::tok {

struct Regex::Impl {
  OnigRegex regex = nullptr;
  ~Impl() {
    if (regex != nullptr) onig_free(regex);
  }
};

namespace {

void init_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  if (info != nullptr) {
    onig_error_code_to_str(buf, code, info);
  } else {
    onig_error_code_to_str(buf, code);
  }
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

StatusOr<Regex> Regex::compile(std::string_view pattern) {
  init_oniguruma();
  if (!is_valid_utf8(pattern)) return invalid_argument("regex pattern is not valid UTF-8");
  auto impl = std::make_shared<Impl>();
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int r =
      onig_new(&impl->regex, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (r != ONIG_NORMAL) {
    impl->regex = nullptr;
    return invalid_argument("bad regex \"" + std::string(pattern) + "\": " + onig_message(r, &info));
  }
  Regex out;
  out.impl_ = std::move(impl);
  return out;
}

StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  OnigRegion* region = onig_region_new();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  Status status;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int r = onig_search(impl_->regex, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      status = invalid_argument("regex search failed: " + onig_message(r, nullptr));
      break;
    }
    const auto s = static_cast<size_t>(region->beg[0]);
    const auto e = static_cast<size_t>(region->end[0]);
    if (s == e && have_last && last_match_end == e) {
      // Empty match right after the previous one: step over one character.
      last_end +=
          last_end < text.size() ? static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(text[last_end]))) : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    matches.emplace_back(s, e);
  }
  onig_region_free(region, 1);
  if (!status.ok()) return status;
  return matches;
}

}  // namespace k3::tok
