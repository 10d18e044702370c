// UTF-8 helpers for the tokenizer: decoding code points, replacing invalid
// bytes with U+FFFD the way Python's bytes.decode("utf-8", "replace") and
// Rust's String::from_utf8_lossy do (one U+FFFD per maximal invalid subpart),
// incremental validation for streaming, and Unicode normalization forms.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace k3::tok {

// The UTF-8 encoding of U+FFFD REPLACEMENT CHARACTER.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Appends the UTF-8 encoding of code point cp (assumed a valid scalar value).
void append_utf8(std::string* out, uint32_t cp);

// Byte length of the UTF-8 sequence starting with lead byte b (1 for a byte
// that cannot start a sequence, so loops over lossy text always advance).
int utf8_seq_len(unsigned char b);

// Decodes the code point at text[pos] (text must be valid UTF-8) and advances pos.
uint32_t next_code_point(std::string_view text, size_t* pos);

// Appends the valid UTF-8 of `in` to `out`, each maximal invalid subpart
// replaced by U+FFFD. With final == false an incomplete sequence at the end
// (a valid prefix of some character) is not consumed; returns how many bytes
// of `in` were consumed (all of them when final).
size_t utf8_lossy_append(std::string_view in, bool final, std::string* out);

// `in` with invalid UTF-8 replaced (final conversion).
std::string utf8_lossy(std::string_view in);

bool is_valid_utf8(std::string_view in);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// Unicode normalization of valid UTF-8 text.
StatusOr<std::string> normalize_unicode(std::string_view text, NormalForm form);

}  // namespace k3::tok
