// Jinja lexer for chat templates: splits a template into text runs and the
// tokens inside {{ }} / {% %} tags, applying Jinja2's whitespace rules as
// transformers configures them (trim_blocks, lstrip_blocks, `-`/`+` markers,
// newline normalization, one trailing newline dropped). Comments vanish here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace k3::tok::jinja {

enum class TokenKind {
  kText,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal, value already unescaped
  kInt,
  kFloat,
  kOp,  // operator or punctuation
  kEof,
};

struct Token {
  TokenKind kind;
  std::string value;
  int line;
};

// Tokenizes a template. Errors (unterminated tag/comment/string, stray
// character) name the line.
StatusOr<std::vector<Token>> lex(std::string_view source);

// Python's str.isspace() for one code point.
bool is_py_space(uint32_t cp);

}  // namespace k3::tok::jinja
