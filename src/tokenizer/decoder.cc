// Decoder implementations (see decoder.h).
#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// ByteLevel for one token: its bytes, or the token itself if some character
// is not a byte character.
std::string byte_level_bytes(const std::string& t) {
  std::string bytes;
  if (!chars_to_bytes(t, &bytes)) return t;
  return bytes;
}

// Strips up to `start` leading and `stop` trailing copies of character c.
std::string strip_chars(const std::string& t, const std::string& c, size_t start, size_t stop) {
  size_t b = 0, e = t.size();
  for (size_t i = 0; i < start && e - b >= c.size() && t.compare(b, c.size(), c) == 0; ++i) b += c.size();
  for (size_t i = 0; i < stop && e - b >= c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++i) e -= c.size();
  return t.substr(b, e - b);
}

// Metaspace: replacement -> " ", dropped entirely in the first token.
std::string metaspace(const std::string& t, const std::string& rep, bool drop) {
  std::string out;
  size_t pos = 0;
  while (pos < t.size()) {
    if (t.compare(pos, rep.size(), rep) == 0) {
      if (!drop) out.push_back(' ');
      pos += rep.size();
    } else {
      out.push_back(t[pos++]);
    }
  }
  return out;
}

}  // namespace

Status Decoder::add_steps(const Json& j, const std::string& path, std::vector<Step>* steps) {
  K3_ASSIGN_OR_RETURN(std::string type, component_type(j, path));
  Step s{Kind::kFuse, "", Pattern::literal(" "), 0, 0, true};
  if (type == "Sequence") {
    K3_ASSIGN_OR_RETURN(const Json* list, field(j, "decoders", path));
    if (!list->is_array()) return invalid_argument(join_path(path, "decoders") + ": expected an array");
    for (size_t i = 0; i < list->size(); ++i)
      K3_RETURN_IF_ERROR(add_steps((*list)[i], join_path(path, "decoders") + "[" + std::to_string(i) + "]", steps));
    return Status::ok_status();
  }
  if (type == "ByteLevel") {
    s.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    s.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = Kind::kFuse;
  } else if (type == "Replace") {
    s.kind = Kind::kReplace;
    K3_ASSIGN_OR_RETURN(const Json* pj, field(j, "pattern", path));
    K3_ASSIGN_OR_RETURN(s.pattern, Pattern::from_json(*pj, join_path(path, "pattern")));
    K3_ASSIGN_OR_RETURN(s.content, string_field(j, "content", path));
  } else if (type == "Strip") {
    s.kind = Kind::kStrip;
    K3_ASSIGN_OR_RETURN(s.content, string_field(j, "content", path));
    K3_ASSIGN_OR_RETURN(int64_t start, int_field(j, "start", path));
    K3_ASSIGN_OR_RETURN(int64_t stop, int_field(j, "stop", path));
    if (start < 0 || stop < 0) return invalid_argument(path + ": start and stop must be non-negative");
    s.start = static_cast<size_t>(start);
    s.stop = static_cast<size_t>(stop);
  } else if (type == "Metaspace") {
    s.kind = Kind::kMetaspace;
    K3_ASSIGN_OR_RETURN(s.content, string_field(j, "replacement", path));
    if (s.content.empty()) return invalid_argument(join_path(path, "replacement") + ": empty");
    K3_ASSIGN_OR_RETURN(std::string scheme, optional_string(j, "prepend_scheme", path, ""));
    if (scheme.empty()) {
      K3_ASSIGN_OR_RETURN(bool add, bool_field(j, "add_prefix_space", path, true));
      s.prepend = add;
    } else {
      s.prepend = scheme != "never";
    }
  } else {
    return unimplemented(path + ": unsupported decoder type \"" + type + "\"");
  }
  steps->push_back(std::move(s));
  return Status::ok_status();
}

StatusOr<Decoder> Decoder::from_json(const Json* j, const std::string& path) {
  Decoder d;
  if (j == nullptr) {
    d.none_ = true;
    return d;
  }
  K3_RETURN_IF_ERROR(add_steps(*j, path, &d.steps_));
  return d;
}

StatusOr<std::string> Decoder::decode(std::vector<std::string> tokens) const {
  if (none_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kByteLevel: {
        // All tokens' bytes together, then one lossy UTF-8 conversion.
        std::string bytes;
        for (const auto& t : tokens) bytes += byte_level_bytes(t);
        tokens.assign(1, utf8_lossy(bytes));
        break;
      }
      case Kind::kByteFallback: {
        // Runs of <0xXX> tokens become their UTF-8 text, or one U+FFFD per
        // byte when the run is not valid UTF-8.
        std::vector<std::string> out;
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
          if (run_len == 0) return;
          if (is_valid_utf8(run)) {
            out.push_back(run);
          } else {
            for (size_t i = 0; i < run_len; ++i) out.emplace_back(kReplacementChar);
          }
          run.clear();
          run_len = 0;
        };
        for (auto& t : tokens) {
          const int b = parse_byte_token(t);
          if (b >= 0) {
            run.push_back(static_cast<char>(b));
            ++run_len;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = metaspace(tokens[i], s.content, i == 0 && s.prepend);
        break;
      case Kind::kReplace:
        for (auto& t : tokens) {
          K3_ASSIGN_OR_RETURN(t, s.pattern.replace_all(t, s.content));
        }
        break;
      case Kind::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Kind::kStrip:
        for (auto& t : tokens) t = strip_chars(t, s.content, s.start, s.stop);
        break;
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

StatusOr<std::string> Decoder::piece(const std::string& token, size_t index) const {
  if (none_) return index == 0 ? token : " " + token;
  std::string t = token;
  bool fused = false;  // after Fuse the stream is one token: only its start can be stripped
  bool bytes = false;  // t already holds raw bytes
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kByteLevel:
        if (!bytes) t = byte_level_bytes(t);
        bytes = true;
        fused = true;
        break;
      case Kind::kByteFallback:
        if (!bytes) {
          const int b = parse_byte_token(t);
          if (b >= 0) {
            t.assign(1, static_cast<char>(b));
            bytes = true;
          }
        }
        break;
      case Kind::kMetaspace:
        if (!fused) t = metaspace(t, s.content, index == 0 && s.prepend);
        break;
      case Kind::kReplace:
        if (!bytes) {
          K3_ASSIGN_OR_RETURN(t, s.pattern.replace_all(t, s.content));
        }
        break;
      case Kind::kFuse:
        fused = true;
        break;
      case Kind::kStrip:
        // Stripping the end of the whole stream would need look-ahead; only
        // the leading strip applies once tokens are fused.
        if (!fused) {
          t = strip_chars(t, s.content, s.start, s.stop);
        } else if (index == 0) {
          t = strip_chars(t, s.content, s.start, 0);
        }
        break;
    }
  }
  return t;
}

}  // namespace k3::tok
