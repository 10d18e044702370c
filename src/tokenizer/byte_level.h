// GPT-2's byte <-> printable-character mapping used by ByteLevel
// pre-tokenizers and decoders: every byte gets a visible Unicode character so
// that BPE vocabularies can be stored as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace k3::tok {

// UTF-8 of the character standing for byte b.
const std::string& byte_to_char(unsigned char b);

// Maps each byte of text to its character.
std::string bytes_to_chars(std::string_view text);

// The byte for code point cp, or -1 if cp stands for no byte.
int char_to_byte(uint32_t cp);

// Inverse of bytes_to_chars for a token (valid UTF-8); false if some
// character stands for no byte (out is then unspecified).
bool chars_to_bytes(std::string_view token, std::string* out);

}  // namespace k3::tok
