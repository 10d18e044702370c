// Jinja lexer for chat templates (see jinja_lexer.h): mirrors jinja2's
// lexer.py for the default delimiters with trim_blocks and lstrip_blocks on.
#include "tokenizer/jinja_lexer.h"

#include <cstring>

#include "tokenizer/unicode.h"

namespace k3::tok::jinja {
namespace {

// Byte offset just past the last non-space code point of text (Python rstrip()).
size_t rstrip_end(std::string_view text) {
  size_t pos = 0, end = 0;
  while (pos < text.size()) {
    const uint32_t cp = next_code_point(text, &pos);
    if (!is_py_space(cp)) end = pos;
  }
  return end;
}

// True when text is non-empty and all Python whitespace (regex \s+ fullmatch).
bool all_space(std::string_view text) {
  if (text.empty()) return false;
  size_t pos = 0;
  while (pos < text.size())
    if (!is_py_space(next_code_point(text, &pos))) return false;
  return true;
}

// Skips Python whitespace from pos; returns the new position.
size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_py_space(next_code_point(s, &next))) break;
    pos = next;
  }
  return pos;
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes Python string-literal escapes (what jinja2 does with unicode-escape).
// Unknown escapes keep their backslash, as Python does.
std::string unescape(std::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 == raw.size()) {
      out += raw[i];
      continue;
    }
    const char c = raw[++i];
    int hex_digits = 0;
    switch (c) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case 'a':
        out += '\a';
        break;
      case 'x':
        hex_digits = 2;
        break;
      case 'u':
        hex_digits = 4;
        break;
      case 'U':
        hex_digits = 8;
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t j = i;
          for (int k = 0; k < 3 && j < raw.size() && raw[j] >= '0' && raw[j] <= '7'; ++k, ++j)
            v = v * 8 + (raw[j] - '0');
          append_utf8(&out, v);
          i = j - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
    if (hex_digits > 0) {
      uint32_t v = 0;
      bool ok = true;
      for (int k = 1; ok && k <= hex_digits; ++k) {
        const int h = i + k < raw.size() ? hex_value(raw[i + k]) : -1;
        if (h < 0) ok = false;
        v = v * 16 + static_cast<uint32_t>(h);
      }
      if (ok && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) {
        append_utf8(&out, v);
        i += hex_digits;
      } else {
        out += '\\';
        out += c;
      }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  StatusOr<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t idx = find_tag(pos);
      std::string_view text(src_.data() + pos, (idx == std::string::npos ? src_.size() : idx) - pos);
      if (idx == std::string::npos) {
        emit_text(text);
        break;
      }
      const char kind = src_[idx + 1];
      const char sign = idx + 2 < src_.size() && (src_[idx + 2] == '-' || src_[idx + 2] == '+') ? src_[idx + 2] : 0;
      const int text_lines = count_newlines(text);
      std::string_view kept = text;
      if (sign == '-') {
        kept = text.substr(0, rstrip_end(text));
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && all_space(text.substr(l_pos))) kept = text.substr(0, l_pos);
      }
      emit_text(kept);
      line_ += text_lines;
      pos = idx + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        K3_ASSIGN_OR_RETURN(pos, comment(pos));
      } else if (kind == '%' && is_raw(pos)) {
        K3_ASSIGN_OR_RETURN(pos, raw_block(pos));
      } else {
        K3_ASSIGN_OR_RETURN(pos, tag(pos, kind == '%'));
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenKind::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_text(std::string_view text) {
    if (text.empty()) return;
    tokens_.push_back({TokenKind::kText, std::string(text), line_});
  }

  Status error(const std::string& what) const {
    return invalid_argument("chat template syntax error at line " + std::to_string(line_) + ": " + what);
  }

  // After the closing delimiter at `end` (just past it), applies the
  // trailing whitespace rule of marker `sign` ('-', '+' or 0).
  size_t after_close(size_t end, char sign, bool trims) {
    if (sign == '-') {
      const size_t next = skip_space(src_, end);
      line_ += count_newlines(std::string_view(src_).substr(end, next - end));
      return next;
    }
    if (sign == 0 && trims && end < src_.size() && src_[end] == '\n') {
      ++line_;
      return end + 1;
    }
    return end;
  }

  StatusOr<size_t> comment(size_t pos) {
    const size_t q = src_.find("#}", pos);
    if (q == std::string::npos) return error("missing end of comment tag");
    line_ += count_newlines(std::string_view(src_).substr(pos, q - pos));
    const char sign = q > pos && (src_[q - 1] == '-' || src_[q - 1] == '+') ? src_[q - 1] : 0;
    return after_close(q + 2, sign, true);
  }

  bool is_raw(size_t pos) const {
    size_t p = skip_space(src_, pos);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_space(src_, p + 3);
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  StatusOr<size_t> raw_block(size_t pos) {
    size_t p = skip_space(src_, pos) + 3;
    p = skip_space(src_, p);
    if (src_[p] == '-') {
      p = after_close(p + 3, '-', true);
    } else {
      p = after_close(p + 2, 0, true);
    }
    // Find {% [-+] endraw [-+]%}.
    for (size_t i = src_.find("{%", p); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      const char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : 0;
      if (sign) ++j;
      j = skip_space(src_, j);
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j = skip_space(src_, j + 6);
      char end_sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_sign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string_view body(src_.data() + p, i - p);
      const int body_lines = count_newlines(body);
      if (sign == '-') body = body.substr(0, rstrip_end(body));
      emit_text(body);
      line_ += body_lines;
      return after_close(j + 2, end_sign, true);
    }
    return error("missing end of raw directive");
  }

  StatusOr<size_t> tag(size_t pos, bool block) {
    tokens_.push_back({block ? TokenKind::kBlockBegin : TokenKind::kVarBegin, "", line_});
    int depth = 0;
    while (true) {
      while (pos < src_.size() && (src_[pos] == ' ' || src_[pos] == '\t' || src_[pos] == '\n' || src_[pos] == '\r')) {
        line_ += src_[pos] == '\n';
        ++pos;
      }
      if (pos >= src_.size())
        return error(block ? "missing end of block tag '%}'" : "missing end of variable tag '}}'");
      const std::string_view rest = std::string_view(src_).substr(pos);
      if (depth == 0) {
        const std::string_view close = block ? "%}" : "}}";
        for (const char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const size_t off = sign ? 1 : 0;
          if ((!sign || rest[0] == sign) && rest.substr(off, 2) == close) {
            tokens_.push_back({block ? TokenKind::kBlockEnd : TokenKind::kVarEnd, "", line_});
            return after_close(pos + off + 2, sign, block);
          }
        }
      }
      const char c = rest[0];
      if (is_name_start(c)) {
        size_t n = 1;
        while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
        tokens_.push_back({TokenKind::kName, std::string(rest.substr(0, n)), line_});
        pos += n;
      } else if (is_digit(c)) {
        size_t n = 0;
        std::string digits;
        auto take_digits = [&]() {
          while (n < rest.size() &&
                 (is_digit(rest[n]) || (rest[n] == '_' && n + 1 < rest.size() && is_digit(rest[n + 1])))) {
            if (rest[n] != '_') digits += rest[n];
            ++n;
          }
        };
        take_digits();
        bool is_float = false;
        const bool after_dot = !tokens_.empty() && tokens_.back().kind == TokenKind::kOp && tokens_.back().value == ".";
        if (!after_dot && n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
          is_float = true;
          digits += '.';
          ++n;
          take_digits();
        }
        if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t m = n + 1;
          if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
          if (m < rest.size() && is_digit(rest[m])) {
            is_float = true;
            digits += 'e';
            digits.append(rest.substr(n + 1, m - n - 1));
            n = m;
            take_digits();
          }
        }
        tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInt, digits, line_});
        pos += n;
      } else if (c == '\'' || c == '"') {
        size_t n = 1;
        while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
        if (n >= rest.size()) return error("unterminated string literal");
        const std::string_view raw = rest.substr(1, n - 1);
        tokens_.push_back({TokenKind::kString, unescape(raw), line_});
        line_ += count_newlines(raw);
        pos += n + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                           "]",  "(",  ")",  "{",  "}",  "<",  ">", "=", ".", ":", "|", ",", ";"};
        const char* found = nullptr;
        for (const char* op : kOps) {
          if (rest.substr(0, std::strlen(op)) == op) {
            found = op;
            break;
          }
        }
        if (!found) {
          size_t end = 0;
          next_code_point(rest, &end);
          return error("unexpected character '" + std::string(rest.substr(0, end)) + "'");
        }
        const std::string op(found);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return error("unexpected '" + op + "'");
          --depth;
        }
        tokens_.push_back({TokenKind::kOp, op, line_});
        pos += op.size();
      }
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

StatusOr<std::vector<Token>> lex(std::string_view source) {
  // Newlines normalized to \n (jinja2 does this to text and string literals),
  // one trailing newline dropped (keep_trailing_newline=False).
  const std::string valid = utf8_lossy(source);
  source = valid;
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace k3::tok::jinja
