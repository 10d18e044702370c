// UTF-8 decoding, lossy repair and normalization (see unicode.h).
//
// Normalization uses utf8proc (Debian libutf8proc-dev): a small C library
// whose only job is Unicode normalization/properties, rather than ICU, which
// is far larger than the one call we need.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

namespace k3::tok {

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int utf8_seq_len(unsigned char b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF8) return 4;
  return 1;
}

uint32_t next_code_point(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = *pos;
  int n = utf8_seq_len(s[i]);
  if (i + n > text.size()) n = 1;
  uint32_t cp = 0;
  switch (n) {
    case 1:
      cp = s[i];
      break;
    case 2:
      cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      break;
    case 3:
      cp = ((s[i] & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
      break;
    default:
      cp = ((s[i] & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu);
  }
  *pos = i + n;
  return cp;
}

namespace {

// Range of the second byte allowed after lead byte b (Unicode Table 3-7);
// returns the sequence length, 0 if b cannot start a sequence.
int lead_info(unsigned char b, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b == 0xE0) {
    *lo = 0xA0;
    return 3;
  }
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return 3;
  if (b == 0xED) {
    *hi = 0x9F;
    return 3;
  }
  if (b == 0xF0) {
    *lo = 0x90;
    return 4;
  }
  if (b >= 0xF1 && b <= 0xF3) return 4;
  if (b == 0xF4) {
    *hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

size_t utf8_lossy_append(std::string_view in, bool final, std::string* out) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      out->push_back(static_cast<char>(s[i]));
      ++i;
      continue;
    }
    unsigned char lo = 0, hi = 0;
    const int len = lead_info(s[i], &lo, &hi);
    if (len == 0) {
      out->append(kReplacementChar);
      ++i;
      continue;
    }
    // Count how many bytes of the sequence are valid (the maximal subpart).
    int good = 1;
    while (good < len && i + good < n) {
      const unsigned char c = s[i + good];
      const bool ok = good == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++good;
    }
    if (good == len) {
      out->append(in.substr(i, len));
      i += len;
    } else if (i + good == n && !final) {
      return i;  // incomplete character at the end: hold it back
    } else {
      out->append(kReplacementChar);
      i += good;
    }
  }
  return n;
}

std::string utf8_lossy(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  utf8_lossy_append(in, true, &out);
  return out;
}

bool is_valid_utf8(std::string_view in) {
  std::string out;
  utf8_lossy_append(in, true, &out);
  return out.size() == in.size() && out == in;
}

StatusOr<std::string> normalize_unicode(std::string_view text, NormalForm form) {
  if (text.empty()) return std::string();
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &result, static_cast<utf8proc_option_t>(options));
  if (len < 0) return invalid_argument(std::string("unicode normalization failed: ") + utf8proc_errmsg(len));
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
  std::free(result);
  return out;
}

}  // namespace k3::tok
