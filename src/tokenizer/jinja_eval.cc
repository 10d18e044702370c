// Jinja evaluator for chat templates (see jinja_eval.h). Values are JSON
// (ordered, like Python dicts) plus Undefined, namespace() objects and
// macros; printing, comparison, arithmetic, slicing, string methods, filters
// and tests follow Python/jinja2. Errors are thrown as EvalError inside this
// file and turned into a Status at render().
#include "tokenizer/jinja_eval.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/unicode.h"

namespace k3::tok::jinja {
namespace {

struct EvalError {
  std::string message;
  int line;
};
struct BreakSignal {};
struct ContinueSignal {};

[[noreturn]] void fail(int line, std::string message) {
  throw EvalError{std::move(message), line};
}

struct Value {
  enum class Kind { kUndefined, kJson, kNamespace, kMacro, kBuiltin };
  Kind kind = Kind::kUndefined;
  Json json;
  std::shared_ptr<Json> ns;
  const Stmt* macro = nullptr;
  std::string name;  // undefined: description; builtin: function name

  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kJson;
    v.json = std::move(j);
    return v;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_json() const { return kind == Kind::kJson; }
  bool is_string() const { return is_json() && json.is_string(); }
};

// ---- Python-compatible text helpers ----

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  size_t pos = 0;
  while (pos < s.size()) out.push_back(next_code_point(s, &pos));
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t cp : cps) append_utf8(&out, cp);
  return out;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[32];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const uint32_t cp = next_code_point(s, &pos);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", cp);
      out += b;
    } else {
      out.append(s, start, pos - start);
    }
  }
  out += quote;
  return out;
}

std::string py_repr(const Json& j);

std::string py_str(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  return py_repr(j);
}

std::string py_repr(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float:
      return py_float(j.get<double>());
    case Json::value_t::string:
      return py_repr_string(j.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      bool first = true;
      for (const auto& item : j) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(item);
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k) + ": " + py_repr(v);
      }
      return out + "}";
    }
    default:
      return "None";
  }
}

// Python json.dumps.
void json_dumps(const Json& j, bool ensure_ascii, int indent, const std::string& item_sep, const std::string& key_sep,
                bool sort_keys, int level, std::string* out) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  auto dump_string = [&](const std::string& s) {
    *out += '"';
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t start = pos;
      const uint32_t cp = next_code_point(s, &pos);
      switch (cp) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        case '\b':
          *out += "\\b";
          break;
        case '\f':
          *out += "\\f";
          break;
        default:
          if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
            auto hex = [&](uint32_t u) {
              char b[16];
              std::snprintf(b, sizeof(b), "\\u%04x", u);
              *out += b;
            };
            if (cp >= 0x10000) {
              const uint32_t v = cp - 0x10000;
              hex(0xD800 + (v >> 10));
              hex(0xDC00 + (v & 0x3FF));
            } else {
              hex(cp);
            }
          } else {
            out->append(s, start, pos - start);
          }
      }
    }
    *out += '"';
  };
  switch (j.type()) {
    case Json::value_t::null:
      *out += "null";
      return;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
      return;
    }
    case Json::value_t::string:
      dump_string(j.get<std::string>());
      return;
    case Json::value_t::array: {
      if (j.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      bool first = true;
      for (const auto& item : j) {
        if (!first) *out += item_sep;
        first = false;
        newline(level + 1);
        json_dumps(item, ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1, out);
      }
      newline(level);
      *out += ']';
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        *out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Json*>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(k, &v);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      *out += '{';
      bool first = true;
      for (const auto& [k, v] : items) {
        if (!first) *out += item_sep;
        first = false;
        newline(level + 1);
        dump_string(k);
        *out += key_sep;
        json_dumps(*v, ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1, out);
      }
      newline(level);
      *out += '}';
      return;
    }
    default:
      *out += j.dump();
      return;
  }
}

const char* type_name(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  if (v.kind == Value::Kind::kNamespace) return "Namespace";
  if (v.kind == Value::Kind::kMacro || v.kind == Value::Kind::kBuiltin) return "function";
  switch (v.json.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "object";
  }
}

bool is_number(const Json& j) {
  return j.is_number() || j.is_boolean();
}
bool is_int(const Json& j) {
  return j.is_number_integer() || j.is_boolean();
}
int64_t as_int(const Json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>();
}
double as_double(const Json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
}

bool py_eq(const Json& a, const Json& b) {
  if (is_number(a) && is_number(b)) {
    if (is_int(a) && is_int(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_eq(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !py_eq(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool values_eq(const Value& a, const Value& b) {
  if (a.is_json() && b.is_json()) return py_eq(a.json, b.json);
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.kind == Value::Kind::kNamespace && b.kind == Value::Kind::kNamespace) return a.ns == b.ns;
  return false;
}

// Python `<` (-1, 0, 1) for numbers, strings and lists; throws otherwise.
int py_cmp(const Json& a, const Json& b, int line) {
  if (is_number(a) && is_number(b)) {
    if (is_int(a) && is_int(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!py_eq(a[i], b[i])) return py_cmp(a[i], b[i], line);
    }
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  fail(line, "cannot compare " + std::string(type_name(Value::of(a))) + " with " + type_name(Value::of(b)));
}

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<uint32_t> set;
  const bool custom = chars && chars->is_json() && !chars->json.is_null();
  if (custom) set = code_points(chars->json.get<std::string>());
  auto strip = [&](uint32_t cp) {
    return custom ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return from_code_points(
      std::vector<uint32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e)));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const auto cps = code_points(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < cps.size()) append_utf8(&out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Json split_string(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  Json out = Json::array();
  if (!sep || sep->is_undefined() || (sep->is_json() && sep->json.is_null())) {
    const auto cps = code_points(s);
    size_t i = 0;
    int64_t n = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && n >= maxsplit) {
        size_t e = cps.size();
        while (e > i && is_py_space(cps[e - 1])) --e;
        out.push_back(from_code_points({cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(e)}));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      out.push_back(from_code_points({cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(j)}));
      ++n;
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) fail(line, "split(): separator must be a string");
  const std::string& d = sep->json.get_ref<const std::string&>();
  if (d.empty()) fail(line, "split(): empty separator");
  size_t pos = 0;
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.push_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
    ++n;
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string py_title(const std::string& s) {
  // jinja2's title filter: first letter of each word upper, rest lower
  // (words start after whitespace, '-', '(', '{', '[', '<' and the start).
  std::string out;
  bool start = true;
  for (char c : s) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) {
      out += start ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                   : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      start = false;
    } else {
      out += c;
      start = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '-' || c == '(' || c == '{' || c == '[' ||
              c == '<' || c == '_';
      if (c == '_') start = false;
    }
  }
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python slice indices for a sequence of length n.
std::vector<size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v, int line) {
  auto get = [&](const Value& v, bool* present) -> int64_t {
    *present = !(v.is_undefined() || (v.is_json() && v.json.is_null()));
    if (!*present) return 0;
    if (!v.is_json() || !is_int(v.json)) fail(line, "slice indices must be integers or none");
    return as_int(v.json);
  };
  bool has_start, has_stop, has_step;
  int64_t step = get(step_v, &has_step);
  if (!has_step) step = 1;
  if (step == 0) fail(line, "slice step cannot be zero");
  int64_t start = get(start_v, &has_start), stop = get(stop_v, &has_stop);
  auto clamp = [&](int64_t i, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, i)); };
  if (step > 0) {
    start = has_start ? clamp(start < 0 ? start + n : start, 0, n) : 0;
    stop = has_stop ? clamp(stop < 0 ? stop + n : stop, 0, n) : n;
  } else {
    start = has_start ? clamp(start < 0 ? start + n : start, -1, n - 1) : n - 1;
    stop = has_stop ? clamp(stop < 0 ? stop + n : stop, -1, n - 1) : -1;
  }
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

// ---- the renderer ----

using Scope = std::unordered_map<std::string, Value>;

class Renderer {
 public:
  Renderer(const Json& context, const RenderOptions& options) : options_(options) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items()) scopes_[0][k] = Value::of(v);
  }

  std::string run(const Body& body) {
    std::string out;
    exec_body(body, &out);
    return out;
  }

 private:
  void step(int line) {
    if (++steps_ > options_.limits.max_steps) fail(line, "template exceeded the step limit (runaway loop?)");
  }
  void check_size(size_t n, int line) const {
    if (n > options_.limits.max_output_bytes) fail(line, "output exceeded the size limit");
  }

  // ---- statements ----

  void exec_body(const Body& body, std::string* out) {
    for (const auto& s : body) exec(*s, out);
  }

  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  void exec(const Stmt& s, std::string* out) {
    step(s.line);
    switch (s.kind) {
      case StmtKind::kText:
        *out += s.text;
        break;
      case StmtKind::kOutput: {
        Value v = eval(*s.expr);
        *out += to_output(v, s.line);
        break;
      }
      case StmtKind::kIf:
        for (const auto& [cond, branch] : s.branches) {
          if (!cond || truthy(eval(*cond))) {
            exec_body(branch, out);
            break;
          }
        }
        break;
      case StmtKind::kFor:
        exec_for(s, out);
        break;
      case StmtKind::kSet: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value target = lookup(s.targets[0]);
          if (target.kind != Value::Kind::kNamespace)
            fail(s.line, "cannot assign attribute '" + s.attr + "' on a non-namespace object");
          if (!v.is_json()) fail(s.line, "only plain values can be stored in a namespace");
          (*target.ns)[s.attr] = v.json;
        } else {
          assign(s.targets[0], std::move(v));
        }
        break;
      }
      case StmtKind::kSetBlock: {
        std::string captured;
        exec_body(s.body, &captured);
        assign(s.targets[0], Value::of(captured));
        break;
      }
      case StmtKind::kMacro: {
        Value m;
        m.kind = Value::Kind::kMacro;
        m.macro = &s;
        m.name = s.targets[0];
        assign(s.targets[0], m);
        break;
      }
      case StmtKind::kBreak:
        if (loop_depth_ == 0) fail(s.line, "'break' outside of a loop");
        throw BreakSignal{};
      case StmtKind::kContinue:
        if (loop_depth_ == 0) fail(s.line, "'continue' outside of a loop");
        throw ContinueSignal{};
    }
    check_size(out->size(), s.line);
  }

  void exec_for(const Stmt& s, std::string* out) {
    std::vector<Value> items = iterate(eval(*s.expr), s.line);
    if (s.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        scopes_.emplace_back();
        bind_targets(s, item);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.else_body, out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    for (int64_t i = 0; i < n; ++i) {
      step(s.line);
      scopes_.emplace_back();
      bind_targets(s, items[static_cast<size_t>(i)]);
      Json loop = {{"index", i + 1},  {"index0", i},        {"revindex", n - i}, {"revindex0", n - i - 1},
                   {"first", i == 0}, {"last", i == n - 1}, {"length", n},       {"depth", 1},
                   {"depth0", 0}};
      Value loop_v = Value::of(std::move(loop));
      if (i > 0 && items[static_cast<size_t>(i - 1)].is_json())
        loop_v.json["previtem"] = items[static_cast<size_t>(i - 1)].json;
      if (i + 1 < n && items[static_cast<size_t>(i + 1)].is_json())
        loop_v.json["nextitem"] = items[static_cast<size_t>(i + 1)].json;
      assign("loop", std::move(loop_v));
      bool stop = false;
      try {
        exec_body(s.body, out);
      } catch (const BreakSignal&) {
        stop = true;
      } catch (const ContinueSignal&) {
      }
      scopes_.pop_back();
      if (stop) break;
    }
    --loop_depth_;
  }

  void bind_targets(const Stmt& s, const Value& item) {
    if (s.targets.size() == 1) {
      assign(s.targets[0], item);
      return;
    }
    std::vector<Value> parts = iterate(item, s.line);
    if (parts.size() != s.targets.size())
      fail(s.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(s.targets.size()) + " loop variables");
    for (size_t i = 0; i < parts.size(); ++i) assign(s.targets[i], parts[i]);
  }

  // ---- values ----

  Value lookup(const std::string& name) {
    // Inside a macro only its own scopes and the template's globals are visible.
    const size_t floor = macro_base_.empty() ? 0 : macro_base_.back();
    for (size_t i = scopes_.size(); i-- > floor;) {
      auto hit = scopes_[i].find(name);
      if (hit != scopes_[i].end()) return hit->second;
    }
    if (floor > 0) {
      auto hit = scopes_[0].find(name);
      if (hit != scopes_[0].end()) return hit->second;
    }
    static const char* const kBuiltins[] = {"range", "namespace", "raise_exception", "strftime_now", "dict"};
    for (const char* b : kBuiltins) {
      if (name == b) {
        Value v;
        v.kind = Value::Kind::kBuiltin;
        v.name = name;
        return v;
      }
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  static bool truthy(const Value& v) {
    if (!v.is_json()) return !v.is_undefined();
    const Json& j = v.json;
    switch (j.type()) {
      case Json::value_t::null:
        return false;
      case Json::value_t::boolean:
        return j.get<bool>();
      case Json::value_t::number_integer:
        return j.get<int64_t>() != 0;
      case Json::value_t::number_unsigned:
        return j.get<uint64_t>() != 0;
      case Json::value_t::number_float:
        return j.get<double>() != 0;
      case Json::value_t::string:
        return !j.get_ref<const std::string&>().empty();
      case Json::value_t::array:
      case Json::value_t::object:
        return !j.empty();
      default:
        return true;
    }
  }

  std::string to_output(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return "";
      case Value::Kind::kJson:
        return py_str(v.json);
      case Value::Kind::kNamespace:
        return "<Namespace " + py_repr(*v.ns) + ">";
      default:
        return "<function " + v.name + ">";
    }
    (void)line;
  }

  const Json& need_json(const Value& v, int line) {
    if (v.is_undefined()) fail(line, v.name);
    if (!v.is_json()) fail(line, std::string("unsupported operand of type ") + type_name(v));
    return v.json;
  }

  std::vector<Value> iterate(const Value& v, int line) {
    std::vector<Value> out;
    if (v.is_undefined()) return out;
    if (v.kind == Value::Kind::kNamespace) fail(line, "'Namespace' object is not iterable");
    const Json& j = need_json(v, line);
    if (j.is_array()) {
      for (const auto& item : j) out.push_back(Value::of(item));
    } else if (j.is_object()) {
      for (const auto& [k, _] : j.items()) out.push_back(Value::of(k));
    } else if (j.is_string()) {
      for (uint32_t cp : code_points(j.get_ref<const std::string&>())) out.push_back(Value::of(from_code_points({cp})));
    } else {
      fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
    return out;
  }

  Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) fail(line, obj.name);
    if (obj.kind == Value::Kind::kNamespace) {
      auto it = obj.ns->find(name);
      return it == obj.ns->end() ? Value::undefined("'Namespace' object has no attribute '" + name + "'")
                                 : Value::of(*it);
    }
    if (obj.is_json() && obj.json.is_object()) {
      auto it = obj.json.find(name);
      if (it != obj.json.end()) return Value::of(*it);
    }
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
  }

  Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) fail(line, obj.name);
    if (obj.kind == Value::Kind::kNamespace && key.is_string()) return get_attr(obj, key.json.get<std::string>(), line);
    if (!obj.is_json() || !key.is_json())
      fail(line, std::string("'") + type_name(obj) + "' object is not subscriptable");
    const Json& j = obj.json;
    const std::string missing = std::string("'") + type_name(obj) + " object' has no element " + py_repr(key.json);
    if (j.is_object()) {
      if (key.json.is_string()) {
        auto it = j.find(key.json.get<std::string>());
        if (it != j.end()) return Value::of(*it);
      }
      return Value::undefined(missing);
    }
    if (j.is_array() || j.is_string()) {
      if (!is_int(key.json)) {
        if (key.json.is_string()) return Value::undefined(missing);
        fail(line, "indices must be integers");
      }
      int64_t i = as_int(key.json);
      if (j.is_array()) {
        const int64_t n = static_cast<int64_t>(j.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(missing);
        return Value::of(j[static_cast<size_t>(i)]);
      }
      const auto cps = code_points(j.get_ref<const std::string&>());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(missing);
      return Value::of(from_code_points({cps[static_cast<size_t>(i)]}));
    }
    fail(line, std::string("'") + type_name(obj) + "' object is not subscriptable");
  }

  Value eval_opt(const ExprPtr& e) { return e ? eval(*e) : Value::of(nullptr); }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return Value::of(e.literal);
      case ExprKind::kName:
        return lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        Json arr = Json::array();
        for (const auto& item : e.args) arr.push_back(need_json(eval(*item), item->line));
        return Value::of(std::move(arr));
      }
      case ExprKind::kDict: {
        Json obj = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          const Json& kj = need_json(k, e.line);
          obj[kj.is_string() ? kj.get<std::string>() : py_str(kj)] = need_json(eval(*e.args[i + 1]), e.line);
        }
        return Value::of(std::move(obj));
      }
      case ExprKind::kAttr:
        return get_attr(eval(*e.args[0]), e.name, e.line);
      case ExprKind::kSubscript:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case ExprKind::kSlice:
        return eval_slice(e);
      case ExprKind::kCall:
        return eval_call(e);
      case ExprKind::kFilter:
        return eval_filter(e);
      case ExprKind::kTest: {
        const bool r = eval_test(e);
        return Value::of(e.negated ? !r : r);
      }
      case ExprKind::kUnary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        const Json& j = need_json(v, e.line);
        if (!is_number(j)) fail(e.line, "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return Value::of(is_int(j) ? Json(as_int(j)) : j);
        return Value::of(is_int(j) ? Json(-as_int(j)) : Json(-as_double(j)));
      }
      case ExprKind::kBinary:
        return eval_binary(e);
      case ExprKind::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined");
    }
    fail(e.line, "bad expression");
  }

  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.args[0]);
    const Json& j = need_json(obj, e.line);
    const Value start = eval_opt(e.args[1]), stop = eval_opt(e.args[2]), stepv = eval_opt(e.args[3]);
    if (j.is_array()) {
      Json out = Json::array();
      for (size_t i : slice_indices(static_cast<int64_t>(j.size()), start, stop, stepv, e.line)) out.push_back(j[i]);
      return Value::of(std::move(out));
    }
    if (j.is_string()) {
      const auto cps = code_points(j.get_ref<const std::string&>());
      std::vector<uint32_t> out;
      for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, stepv, e.line))
        out.push_back(cps[i]);
      return Value::of(from_code_points(out));
    }
    fail(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    Value a = eval(*e.args[0]);
    Value b = eval(*e.args[1]);
    if (op == "==") return Value::of(values_eq(a, b));
    if (op == "!=") return Value::of(!values_eq(a, b));
    if (op == "in" || op == "not in") {
      const bool r = contains(b, a, e.line);
      return Value::of(op == "in" ? r : !r);
    }
    if (op == "~") {
      std::string s = to_output(a, e.line) + to_output(b, e.line);
      check_size(s.size(), e.line);
      return Value::of(std::move(s));
    }
    const Json& x = need_json(a, e.line);
    const Json& y = need_json(b, e.line);
    if (op == "<") return Value::of(py_cmp(x, y, e.line) < 0);
    if (op == ">") return Value::of(py_cmp(x, y, e.line) > 0);
    if (op == "<=") return Value::of(py_cmp(x, y, e.line) <= 0);
    if (op == ">=") return Value::of(py_cmp(x, y, e.line) >= 0);
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        std::string s = x.get<std::string>() + y.get_ref<const std::string&>();
        check_size(s.size(), e.line);
        return Value::of(std::move(s));
      }
      if (x.is_array() && y.is_array()) {
        Json out = x;
        for (const auto& item : y) out.push_back(item);
        return Value::of(std::move(out));
      }
    }
    if (op == "*" &&
        (((x.is_string() || x.is_array()) && is_int(y)) || ((y.is_string() || y.is_array()) && is_int(x)))) {
      const Json& seq = x.is_string() || x.is_array() ? x : y;
      const int64_t n = as_int(x.is_string() || x.is_array() ? y : x);
      const size_t unit = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.size();
      if (n > 0 && unit > 0) check_size(unit * static_cast<size_t>(std::min<int64_t>(n, 1LL << 40)), e.line);
      Json out = seq.is_string() ? Json("") : Json::array();
      for (int64_t i = 0; i < n; ++i) {
        if (seq.is_string()) {
          out.get_ref<std::string&>() += seq.get_ref<const std::string&>();
        } else {
          for (const auto& item : seq) out.push_back(item);
        }
      }
      return Value::of(std::move(out));
    }
    if (!is_number(x) || !is_number(y))
      fail(e.line, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    const bool ints = is_int(x) && is_int(y);
    if (op == "/") {
      if (as_double(y) == 0) fail(e.line, "division by zero");
      return Value::of(as_double(x) / as_double(y));
    }
    if (ints) {
      const int64_t p = as_int(x), q = as_int(y);
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(p, q, &r)) fail(e.line, "integer overflow");
        return Value::of(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(p, q, &r)) fail(e.line, "integer overflow");
        return Value::of(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(p, q, &r)) fail(e.line, "integer overflow");
        return Value::of(r);
      }
      if (op == "//" || op == "%") {
        if (q == 0) fail(e.line, "integer division or modulo by zero");
        if (p == INT64_MIN && q == -1) fail(e.line, "integer overflow");
        int64_t d = p / q, m = p % q;
        if (m != 0 && ((m < 0) != (q < 0))) {
          --d;
          m += q;
        }
        return Value::of(op == "//" ? d : m);
      }
      if (op == "**") {
        if (q < 0) return Value::of(std::pow(static_cast<double>(p), static_cast<double>(q)));
        int64_t acc = 1;
        for (int64_t i = 0; i < q; ++i) {
          if (__builtin_mul_overflow(acc, p, &acc)) fail(e.line, "integer overflow");
          if (acc == 0 || acc == 1) break;
        }
        return Value::of(acc);
      }
    }
    const double p = as_double(x), q = as_double(y);
    if (op == "+") return Value::of(p + q);
    if (op == "-") return Value::of(p - q);
    if (op == "*") return Value::of(p * q);
    if (op == "**") return Value::of(std::pow(p, q));
    if (op == "//" || op == "%") {
      if (q == 0) fail(e.line, "float division or modulo by zero");
      const double m = std::fmod(p, q);
      const double mod = (m != 0 && ((m < 0) != (q < 0))) ? m + q : m;
      return Value::of(op == "//" ? std::floor((p - mod) / q + 0.5) : mod);
    }
    fail(e.line, "unsupported operator " + op);
  }

  bool contains(const Value& container, const Value& item, int line) {
    if (container.is_undefined()) return false;
    if (container.kind == Value::Kind::kNamespace)
      return item.is_string() && container.ns->contains(item.json.get<std::string>());
    const Json& c = need_json(container, line);
    if (c.is_string()) {
      if (!item.is_string()) fail(line, "'in <string>' requires string as left operand");
      return c.get_ref<const std::string&>().find(item.json.get_ref<const std::string&>()) != std::string::npos;
    }
    if (c.is_array()) {
      for (const auto& x : c)
        if (item.is_json() && py_eq(x, item.json)) return true;
      return false;
    }
    if (c.is_object()) return item.is_string() && c.contains(item.json.get<std::string>());
    fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }

  // Positional + keyword arguments of a call, filter or test.
  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    // The argument named `name` or at position `index`; null when absent.
    const Value* get(size_t index, const char* name) const {
      for (const auto& [k, v] : kw)
        if (k == name) return &v;
      return index < pos.size() ? &pos[index] : nullptr;
    }
  };

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }

  std::string need_string(const Value* v, int line, const char* what) {
    if (!v) fail(line, std::string(what) + ": missing argument");
    const Json& j = need_json(*v, line);
    if (!j.is_string()) fail(line, std::string(what) + ": expected a string, got " + type_name(*v));
    return j.get<std::string>();
  }
  int64_t need_int(const Value* v, int line, const char* what) {
    if (!v) fail(line, std::string(what) + ": missing argument");
    const Json& j = need_json(*v, line);
    if (!is_int(j)) fail(line, std::string(what) + ": expected an integer, got " + type_name(*v));
    return as_int(j);
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    step(e.line);
    if (callee.kind == ExprKind::kAttr) {
      Value obj = eval(*callee.args[0]);
      if (obj.is_json() && (obj.json.is_string() || obj.json.is_object())) {
        Args args = eval_args(e, 1);
        std::optional<Value> r = call_method(obj, callee.name, args, e.line);
        if (r) return *r;
      }
      Value fn = get_attr(obj, callee.name, callee.line);
      return call_value(fn, eval_args(e, 1), e.line);
    }
    Value fn = eval(callee);
    return call_value(fn, eval_args(e, 1), e.line);
  }

  std::optional<Value> call_method(const Value& obj, const std::string& name, const Args& a, int line) {
    const Json& j = obj.json;
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      if (name == "strip") return Value::of(strip_chars(s, a.get(0, "chars"), true, true));
      if (name == "lstrip") return Value::of(strip_chars(s, a.get(0, "chars"), true, false));
      if (name == "rstrip") return Value::of(strip_chars(s, a.get(0, "chars"), false, true));
      if (name == "split") {
        const Value* ms = a.get(1, "maxsplit");
        return Value::of(split_string(s, a.get(0, "sep"), ms ? need_int(ms, line, "split") : -1, line));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* arg = a.get(0, "prefix");
        std::vector<std::string> options;
        if (arg && arg->is_json() && arg->json.is_array()) {
          for (const auto& o : arg->json) options.push_back(o.is_string() ? o.get<std::string>() : "");
        } else {
          options.push_back(need_string(arg, line, name.c_str()));
        }
        for (const auto& o : options) {
          if (name == "startswith" ? s.starts_with(o) : s.ends_with(o)) return Value::of(true);
        }
        return Value::of(false);
      }
      if (name == "replace") {
        const Value* c = a.get(2, "count");
        std::string r =
            replace_all(s, need_string(a.get(0, "old"), line, "replace"), need_string(a.get(1, "new"), line, "replace"),
                        c ? need_int(c, line, "replace") : -1);
        check_size(r.size(), line);
        return Value::of(std::move(r));
      }
      if (name == "upper") return Value::of(ascii_case(s, true));
      if (name == "lower") return Value::of(ascii_case(s, false));
      if (name == "title") return Value::of(py_title(s));
      if (name == "capitalize") {
        std::string r = ascii_case(s, false);
        if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
        return Value::of(r);
      }
      if (name == "find") {
        const size_t p = s.find(need_string(a.get(0, "sub"), line, "find"));
        return Value::of(p == std::string::npos ? int64_t{-1}
                                                : static_cast<int64_t>(code_points(s.substr(0, p)).size()));
      }
      if (name == "count") {
        const std::string sub = need_string(a.get(0, "sub"), line, "count");
        if (sub.empty()) return Value::of(static_cast<int64_t>(code_points(s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::of(n);
      }
      if (name == "join") {
        const Value* it = a.get(0, "iterable");
        if (!it) fail(line, "join: missing argument");
        std::string r;
        bool first = true;
        for (const Value& v : iterate(*it, line)) {
          if (!first) r += s;
          first = false;
          if (!v.is_string()) fail(line, "join: sequence item is not a string");
          r += v.json.get<std::string>();
          check_size(r.size(), line);
        }
        return Value::of(r);
      }
      if (name == "isspace" || name == "isdigit" || name == "isalpha" || name == "isalnum") {
        const auto cps = code_points(s);
        bool ok = !cps.empty();
        for (uint32_t cp : cps) {
          const bool digit = cp >= '0' && cp <= '9';
          const bool alpha = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
          if (name == "isspace") ok = ok && is_py_space(cp);
          if (name == "isdigit") ok = ok && digit;
          if (name == "isalpha") ok = ok && alpha;
          if (name == "isalnum") ok = ok && (alpha || digit);
        }
        return Value::of(ok);
      }
      return std::nullopt;
    }
    if (j.is_object()) {
      if (name == "items") {
        Json out = Json::array();
        for (const auto& [k, v] : j.items()) out.push_back(Json::array({k, v}));
        return Value::of(std::move(out));
      }
      if (name == "keys") {
        Json out = Json::array();
        for (const auto& [k, _] : j.items()) out.push_back(k);
        return Value::of(std::move(out));
      }
      if (name == "values") {
        Json out = Json::array();
        for (const auto& [_, v] : j.items()) out.push_back(v);
        return Value::of(std::move(out));
      }
      if (name == "get") {
        const Value* key = a.get(0, "key");
        if (key && key->is_string()) {
          auto it = j.find(key->json.get<std::string>());
          if (it != j.end()) return Value::of(*it);
        }
        const Value* def = a.get(1, "default");
        return def ? *def : Value::of(nullptr);
      }
    }
    return std::nullopt;
  }

  Value call_value(const Value& fn, const Args& a, int line) {
    if (fn.kind == Value::Kind::kMacro) return call_macro(*fn.macro, a, line);
    if (fn.kind != Value::Kind::kBuiltin) {
      if (fn.is_undefined()) fail(line, fn.name);
      fail(line, std::string("'") + type_name(fn) + "' object is not callable");
    }
    const std::string& name = fn.name;
    if (name == "raise_exception") {
      const Value* msg = a.get(0, "message");
      fail(line, "raise_exception: " + (msg ? to_output(*msg, line) : std::string()));
    }
    if (name == "namespace" || name == "dict") {
      auto ns = std::make_shared<Json>(Json::object());
      for (const Value& p : a.pos) {
        if (p.is_json() && p.json.is_object()) {
          for (const auto& [k, v] : p.json.items()) (*ns)[k] = v;
        } else {
          fail(line, name + "(): positional arguments must be mappings");
        }
      }
      for (const auto& [k, v] : a.kw) (*ns)[k] = need_json(v, line);
      if (name == "dict") return Value::of(*ns);
      Value v;
      v.kind = Value::Kind::kNamespace;
      v.ns = std::move(ns);
      return v;
    }
    if (name == "range") {
      int64_t start = 0, stop = 0, stepn = 1;
      if (a.pos.size() == 1) {
        stop = need_int(&a.pos[0], line, "range");
      } else if (a.pos.size() >= 2) {
        start = need_int(&a.pos[0], line, "range");
        stop = need_int(&a.pos[1], line, "range");
        if (a.pos.size() >= 3) stepn = need_int(&a.pos[2], line, "range");
      } else {
        fail(line, "range expected at least 1 argument");
      }
      if (stepn == 0) fail(line, "range() arg 3 must not be zero");
      Json out = Json::array();
      for (int64_t i = start; stepn > 0 ? i < stop : i > stop; i += stepn) {
        step(line);
        out.push_back(i);
      }
      return Value::of(std::move(out));
    }
    if (name == "strftime_now") {
      const std::string fmt = need_string(a.get(0, "format"), line, "strftime_now");
      std::time_t t =
          options_.now_epoch_seconds >= 0 ? static_cast<std::time_t>(options_.now_epoch_seconds) : std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      const size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return Value::of(std::string(buf, n));
    }
    fail(line, "unknown function '" + name + "'");
  }

  Value call_macro(const Stmt& m, const Args& a, int line) {
    if (call_depth_ >= options_.limits.max_call_depth) fail(line, "macro calls nested too deeply");
    Scope scope;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [pname, def] = m.params[i];
      const Value* v = a.get(i, pname.c_str());
      if (v) {
        scope[pname] = *v;
      } else if (def) {
        scope[pname] = eval(*def);
      } else {
        scope[pname] = Value::undefined("'" + pname + "' is undefined");
      }
    }
    if (a.pos.size() > m.params.size())
      fail(line,
           "macro '" + m.targets[0] + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
    const int saved_loop = loop_depth_;
    const size_t base = scopes_.size();
    scopes_.push_back(std::move(scope));
    macro_base_.push_back(base);
    ++call_depth_;
    loop_depth_ = 0;
    std::string out;
    struct Restore {
      Renderer* r;
      size_t base;
      int loop;
      ~Restore() {
        r->scopes_.resize(base);
        r->macro_base_.pop_back();
        r->loop_depth_ = loop;
        --r->call_depth_;
      }
    } restore{this, base, saved_loop};
    exec_body(m.body, &out);
    return Value::of(out);
  }

  // ---- filters ----

  Value eval_filter(const Expr& e) {
    Value v = eval(*e.args[0]);
    Args a = eval_args(e, 1);
    return apply_filter(e.name, v, a, e.line);
  }

  std::string join_values(const std::vector<Value>& items, const std::string& sep, int line) {
    std::string r;
    bool first = true;
    for (const Value& item : items) {
      if (!first) r += sep;
      first = false;
      r += to_output(item, line);
      check_size(r.size(), line);
    }
    return r;
  }

  Value apply_filter(const std::string& name, const Value& v, const Args& a, int line) {
    step(line);
    if (name == "default" || name == "d") {
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use_default = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use_default) return def ? *def : Value::of("");
      return v;
    }
    if (name == "length" || name == "count") {
      if (v.is_undefined()) return Value::of(int64_t{0});
      const Json& j = need_json(v, line);
      if (j.is_string()) return Value::of(static_cast<int64_t>(code_points(j.get_ref<const std::string&>()).size()));
      if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
      fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
    }
    if (name == "tojson") {
      for (const auto& [k, _] : a.kw)
        if (k != "ensure_ascii" && k != "indent" && k != "separators" && k != "sort_keys")
          fail(line, "tojson() got an unexpected keyword argument '" + k + "'");
      const Json& j = need_json(v, line);
      const Value* indent_v = a.get(1, "indent");
      int indent = -1;
      if (indent_v && !(indent_v->is_json() && indent_v->json.is_null()))
        indent = static_cast<int>(std::clamp<int64_t>(need_int(indent_v, line, "tojson indent"), 0, 64));
      const Value* ea = a.get(0, "ensure_ascii");
      const Value* sk = a.get(3, "sort_keys");
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      const Value* seps = a.get(2, "separators");
      if (seps && seps->is_json() && seps->json.is_array() && seps->json.size() == 2 && seps->json[0].is_string() &&
          seps->json[1].is_string()) {
        item_sep = seps->json[0].get<std::string>();
        key_sep = seps->json[1].get<std::string>();
      }
      std::string out;
      json_dumps(j, ea && truthy(*ea), indent, item_sep, key_sep, sk && truthy(*sk), 0, &out);
      check_size(out.size(), line);
      return Value::of(std::move(out));
    }
    if (name == "string") return Value::of(to_output(v, line));
    if (name == "safe") return v;
    if (name == "trim") {
      return Value::of(strip_chars(to_output(v, line), a.get(0, "chars"), true, true));
    }
    if (name == "upper" || name == "lower") return Value::of(ascii_case(to_output(v, line), name == "upper"));
    if (name == "title") return Value::of(py_title(to_output(v, line)));
    if (name == "capitalize") {
      std::string r = ascii_case(to_output(v, line), false);
      if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
      return Value::of(r);
    }
    if (name == "replace") {
      const Value* c = a.get(2, "count");
      std::string r = replace_all(to_output(v, line), need_string(a.get(0, "old"), line, "replace"),
                                  need_string(a.get(1, "new"), line, "replace"), c ? need_int(c, line, "replace") : -1);
      check_size(r.size(), line);
      return Value::of(std::move(r));
    }
    if (name == "first" || name == "last") {
      std::vector<Value> items = iterate(v, line);
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      Json out = Json::array();
      for (const Value& item : iterate(v, line)) out.push_back(need_json(item, line));
      return Value::of(std::move(out));
    }
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.json.get<std::string>());
        std::reverse(cps.begin(), cps.end());
        return Value::of(from_code_points(cps));
      }
      Json out = Json::array();
      std::vector<Value> items = iterate(v, line);
      for (auto it = items.rbegin(); it != items.rend(); ++it) out.push_back(need_json(*it, line));
      return Value::of(std::move(out));
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::vector<Value> items = iterate(v, line);
      if (attr) {
        for (Value& item : items) item = get_attr(item, to_output(*attr, line), line);
      }
      return Value::of(join_values(items, sep ? to_output(*sep, line) : "", line));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::of(Json::array());
      const Json& j = need_json(v, line);
      if (!j.is_object()) fail(line, "items: expected a mapping");
      Json out = Json::array();
      for (const auto& [k, val] : j.items()) out.push_back(Json::array({k, val}));
      return Value::of(std::move(out));
    }
    if (name == "int") {
      const Value* def = a.get(0, "default");
      const Json& j = v.is_json() ? v.json : Json(nullptr);
      if (is_int(j)) return Value::of(as_int(j));
      if (j.is_number_float() && std::isfinite(j.get<double>()))
        return Value::of(static_cast<int64_t>(j.get<double>()));
      if (j.is_string()) {
        const std::string s = strip_chars(j.get<std::string>(), nullptr, true, true);
        int64_t r = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), r);
        if (ec == std::errc() && p == s.data() + s.size()) return Value::of(r);
        char* endp = nullptr;
        const double d = std::strtod(s.c_str(), &endp);
        if (!s.empty() && endp == s.c_str() + s.size() && std::isfinite(d)) return Value::of(static_cast<int64_t>(d));
      }
      return def ? *def : Value::of(int64_t{0});
    }
    if (name == "float") {
      const Json& j = v.is_json() ? v.json : Json(nullptr);
      if (is_number(j)) return Value::of(as_double(j));
      if (j.is_string()) {
        char* endp = nullptr;
        const std::string s = j.get<std::string>();
        const double d = std::strtod(s.c_str(), &endp);
        if (!s.empty() && endp == s.c_str() + s.size()) return Value::of(d);
      }
      const Value* def = a.get(0, "default");
      return def ? *def : Value::of(0.0);
    }
    if (name == "abs") {
      const Json& j = need_json(v, line);
      if (is_int(j)) return Value::of(std::llabs(as_int(j)));
      if (j.is_number()) return Value::of(std::fabs(j.get<double>()));
      fail(line, "abs: expected a number");
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr_mode = name == "selectattr" || name == "rejectattr";
      const bool want = name == "select" || name == "selectattr";
      size_t next = 0;
      std::string attr;
      if (attr_mode) attr = need_string(a.pos.empty() ? nullptr : &a.pos[next++], line, name.c_str());
      std::string test = a.pos.size() > next ? need_string(&a.pos[next++], line, name.c_str()) : "";
      std::vector<Value> test_args(a.pos.begin() + static_cast<long>(std::min(next, a.pos.size())), a.pos.end());
      Json out = Json::array();
      for (const Value& item : iterate(v, line)) {
        Value subject = attr_mode ? get_attr_path(item, attr, line) : item;
        const bool r = test.empty() ? truthy(subject) : apply_test(test, subject, test_args, line);
        if (r == want) out.push_back(need_json(item, line));
      }
      return Value::of(std::move(out));
    }
    if (name == "map") {
      Json out = Json::array();
      const Value* attr = nullptr;
      for (const auto& [k, val] : a.kw)
        if (k == "attribute") attr = &val;
      const Value* def = nullptr;
      for (const auto& [k, val] : a.kw)
        if (k == "default") def = &val;
      for (const Value& item : iterate(v, line)) {
        Value r;
        if (attr) {
          r = get_attr_path(item, to_output(*attr, line), line);
          if (r.is_undefined() && def) r = *def;
        } else {
          if (a.pos.empty()) fail(line, "map: missing filter name");
          Args rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          r = apply_filter(need_string(&a.pos[0], line, "map"), item, rest, line);
        }
        out.push_back(r.is_json() ? r.json : Json(nullptr));
      }
      return Value::of(std::move(out));
    }
    if (name == "unique") {
      Json out = Json::array();
      for (const Value& item : iterate(v, line)) {
        const Json& j = need_json(item, line);
        bool seen = false;
        for (const auto& o : out) seen = seen || py_eq(o, j);
        if (!seen) out.push_back(j);
      }
      return Value::of(std::move(out));
    }
    if (name == "indent") {
      const Value* w = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      const std::string pad =
          w && w->is_string()
              ? w->json.get<std::string>()
              : std::string(static_cast<size_t>(std::clamp<int64_t>(w ? need_int(w, line, "indent") : 4, 0, 256)), ' ');
      const std::string s = to_output(v, line);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      while (start <= s.size()) {
        size_t nl = s.find('\n', start);
        const std::string ln = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool indent_it = first_line ? (first && truthy(*first)) : (!ln.empty() || (blank && truthy(*blank)));
        if (indent_it && !(first_line && ln.empty() && false)) out += pad;
        out += ln;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      check_size(out.size(), line);
      return Value::of(out);
    }
    fail(line, "no filter named '" + name + "'");
  }

  Value get_attr_path(const Value& item, const std::string& path, int line) {
    Value cur = item;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (cur.is_undefined()) return cur;
      cur = get_attr(cur, part, line);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  // ---- tests ----

  bool eval_test(const Expr& e) {
    if (e.name == "defined" || e.name == "undefined") {
      Value v = eval(*e.args[0]);
      return e.name == "defined" ? !v.is_undefined() : v.is_undefined();
    }
    Value v = eval(*e.args[0]);
    std::vector<Value> args;
    for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i]));
    for (const auto& [_, val] : e.kwargs) args.push_back(eval(*val));
    return apply_test(e.name, v, args, e.line);
  }

  bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    const bool js = v.is_json();
    const Json& j = v.json;
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return js && j.is_null();
    if (name == "string") return js && j.is_string();
    if (name == "mapping") return (js && j.is_object()) || v.kind == Value::Kind::kNamespace;
    if (name == "iterable") return v.is_undefined() || (js && (j.is_string() || j.is_array() || j.is_object()));
    if (name == "sequence") return js && (j.is_string() || j.is_array() || j.is_object());
    if (name == "number") return js && is_number(j);
    if (name == "integer") return js && j.is_number_integer();
    if (name == "float") return js && j.is_number_float();
    if (name == "boolean") return js && j.is_boolean();
    if (name == "true") return js && j.is_boolean() && j.get<bool>();
    if (name == "false") return js && j.is_boolean() && !j.get<bool>();
    if (name == "callable") return v.kind == Value::Kind::kMacro || v.kind == Value::Kind::kBuiltin;
    if (name == "lower" || name == "upper") {
      const std::string s = to_output(v, line);
      return s == ascii_case(s, name == "upper");
    }
    if (name == "odd" || name == "even") {
      const int64_t n = need_int(&v, line, name.c_str());
      return (n % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      const int64_t d = need_int(args.empty() ? nullptr : &args[0], line, "divisibleby");
      if (d == 0) fail(line, "divisibleby 0");
      return need_int(&v, line, "divisibleby") % d == 0;
    }
    if (args.empty() && (name == "eq" || name == "equalto" || name == "sameas" || name == "in" || name == "ne" ||
                         name == "lt" || name == "gt" || name == "le" || name == "ge"))
      fail(line, "test '" + name + "' needs an argument");
    if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return values_eq(v, args[0]);
    if (name == "ne" || name == "!=") return !values_eq(v, args[0]);
    if (name == "in") return contains(args[0], v, line);
    if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
      const int c = py_cmp(need_json(v, line), need_json(args[0], line), line);
      return name == "lt" ? c < 0 : name == "gt" ? c > 0 : name == "le" ? c <= 0 : c >= 0;
    }
    fail(line, "no test named '" + name + "'");
  }

  const RenderOptions& options_;
  std::vector<Scope> scopes_;
  std::vector<size_t> macro_base_;
  int64_t steps_ = 0;
  int loop_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace

StatusOr<std::string> render(const Body& body, const Json& context, const RenderOptions& options) {
  if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
  try {
    Renderer r(context, options);
    return r.run(body);
  } catch (const EvalError& e) {
    return invalid_argument("chat template error at line " + std::to_string(e.line) + ": " + e.message);
  } catch (const BreakSignal&) {
    return invalid_argument("chat template error: 'break' outside of a loop");
  } catch (const ContinueSignal&) {
    return invalid_argument("chat template error: 'continue' outside of a loop");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template error: ") + e.what());
  }
}

}  // namespace k3::tok::jinja
