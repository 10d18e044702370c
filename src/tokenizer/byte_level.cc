// The GPT-2 bytes_to_unicode table (see byte_level.h).
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::array<int, 512> to_byte;  // all mapped code points are < 512
  Tables() {
    to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : next++;
      append_utf8(&to_char[b], static_cast<uint32_t>(cp));
      to_byte[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_char(unsigned char b) {
  return tables().to_char[b];
}

std::string bytes_to_chars(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out.append(byte_to_char(static_cast<unsigned char>(c)));
  return out;
}

int char_to_byte(uint32_t cp) {
  return cp < 512 ? tables().to_byte[cp] : -1;
}

bool chars_to_bytes(std::string_view token, std::string* out) {
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = char_to_byte(next_code_point(token, &pos));
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace k3::tok
