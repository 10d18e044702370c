// Jinja parser for chat templates (see jinja_parser.h): statements if/for/
// set/macro/break/continue (plus transformers' no-op generation block) and
// expressions with jinja2's precedence (parser.py): conditional < or < and <
// not < comparisons/in < + - < ~ < * / // % < ** < unary - + < postfix
// (. [] ()) and filters/tests.
#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "tokenizer/jinja_lexer.h"

namespace k3::tok::jinja {
namespace {

constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  StatusOr<Body> run() {
    Body body;
    std::string end;
    K3_RETURN_IF_ERROR(statements({}, &body, &end));
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOp && peek(ahead).value == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).value == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kText:
        return "text";
      case TokenKind::kVarBegin:
        return "'{{'";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kEof:
        return "end of template";
      case TokenKind::kString:
        return "string";
      default:
        return "'" + t.value + "'";
    }
  }

  Status error_at(int line, const std::string& what) const {
    return invalid_argument("chat template syntax error at line " + std::to_string(line) + ": " + what);
  }
  Status error(const std::string& what) const { return error_at(peek().line, what); }
  Status unexpected(const std::string& expected) const {
    return error("unexpected " + describe(peek()) + ", expected " + expected);
  }
  Status expect_op(const char* op) {
    if (!skip_op(op)) return unexpected(std::string("'") + op + "'");
    return Status::ok_status();
  }
  Status expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) return unexpected("end of statement block '%}'");
    next();
    return Status::ok_status();
  }
  StatusOr<std::string> expect_ident() {
    if (peek().kind != TokenKind::kName) return unexpected("a name");
    return next().value;
  }

  static ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  struct DepthGuard {
    explicit DepthGuard(int* d) : d_(d) { ++*d_; }
    ~DepthGuard() { --*d_; }
    int* d_;
  };

  // ---- statements ----

  // Parses statements until `{% <one of ends>` (consumed up to and including
  // the tag name, which lands in *end) or the end of the template.
  Status statements(const std::vector<std::string>& ends, Body* body, std::string* end) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return error("statements nested too deeply");
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEof) {
        if (ends.empty()) return Status::ok_status();
        return error("unexpected end of template, expected '" + ends.back() + "'");
      }
      if (t.kind == TokenKind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = next().value;
        body->push_back(std::move(s));
      } else if (t.kind == TokenKind::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = next().line;
        K3_ASSIGN_OR_RETURN(s->expr, tuple_expr(true));
        if (peek().kind != TokenKind::kVarEnd) return unexpected("end of print statement '}}'");
        next();
        body->push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        next();
        if (peek().kind != TokenKind::kName) return unexpected("a tag name");
        const std::string name = peek().value;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          next();
          *end = name;
          return Status::ok_status();
        }
        K3_RETURN_IF_ERROR(statement(body, ends));
      } else {
        return error("unexpected " + describe(t));
      }
    }
  }

  Status statement(Body* body, const std::vector<std::string>& ends) {
    const Token& t = next();
    const std::string name = t.value;
    const int line = t.line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (name == "if") {
      s->kind = StmtKind::kIf;
      K3_ASSIGN_OR_RETURN(ExprPtr cond, tuple_expr(true));
      while (true) {
        K3_RETURN_IF_ERROR(expect_block_end());
        Body branch;
        std::string end;
        K3_RETURN_IF_ERROR(statements({"elif", "else", "endif"}, &branch, &end));
        s->branches.emplace_back(std::move(cond), std::move(branch));
        if (end == "endif") break;
        if (end == "elif") {
          K3_ASSIGN_OR_RETURN(cond, tuple_expr(true));
          continue;
        }
        K3_RETURN_IF_ERROR(expect_block_end());
        Body else_branch;
        K3_RETURN_IF_ERROR(statements({"endif"}, &else_branch, &end));
        s->branches.emplace_back(nullptr, std::move(else_branch));
        break;
      }
      K3_RETURN_IF_ERROR(expect_block_end());
    } else if (name == "for") {
      s->kind = StmtKind::kFor;
      do {
        K3_ASSIGN_OR_RETURN(std::string target, expect_ident());
        s->targets.push_back(target);
      } while (skip_op(","));
      if (!skip_name("in")) return unexpected("'in'");
      K3_ASSIGN_OR_RETURN(s->expr, tuple_expr(false));
      if (skip_name("if")) {
        K3_ASSIGN_OR_RETURN(s->filter, expression(true));
      }
      if (is_name("recursive")) return error("recursive for loops are not supported");
      K3_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      K3_RETURN_IF_ERROR(statements({"else", "endfor"}, &s->body, &end));
      if (end == "else") {
        K3_RETURN_IF_ERROR(expect_block_end());
        K3_RETURN_IF_ERROR(statements({"endfor"}, &s->else_body, &end));
      }
      K3_RETURN_IF_ERROR(expect_block_end());
    } else if (name == "set") {
      K3_ASSIGN_OR_RETURN(std::string target, expect_ident());
      s->targets.push_back(target);
      if (skip_op(".")) {
        K3_ASSIGN_OR_RETURN(s->attr, expect_ident());
      }
      if (skip_op("=")) {
        s->kind = StmtKind::kSet;
        K3_ASSIGN_OR_RETURN(s->expr, tuple_expr(true));
        K3_RETURN_IF_ERROR(expect_block_end());
      } else {
        if (!s->attr.empty()) return unexpected("'='");
        s->kind = StmtKind::kSetBlock;
        K3_RETURN_IF_ERROR(expect_block_end());
        std::string end;
        K3_RETURN_IF_ERROR(statements({"endset"}, &s->body, &end));
        K3_RETURN_IF_ERROR(expect_block_end());
      }
    } else if (name == "macro") {
      s->kind = StmtKind::kMacro;
      K3_ASSIGN_OR_RETURN(std::string macro_name, expect_ident());
      s->targets.push_back(macro_name);
      K3_RETURN_IF_ERROR(expect_op("("));
      while (!is_op(")")) {
        K3_ASSIGN_OR_RETURN(std::string param, expect_ident());
        ExprPtr def;
        if (skip_op("=")) {
          K3_ASSIGN_OR_RETURN(def, expression(true));
        }
        s->params.emplace_back(param, std::move(def));
        if (!skip_op(",")) break;
      }
      K3_RETURN_IF_ERROR(expect_op(")"));
      K3_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      K3_RETURN_IF_ERROR(statements({"endmacro"}, &s->body, &end));
      K3_RETURN_IF_ERROR(expect_block_end());
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      K3_RETURN_IF_ERROR(expect_block_end());
    } else if (name == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      K3_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      Body inner;
      K3_RETURN_IF_ERROR(statements({"endgeneration"}, &inner, &end));
      K3_RETURN_IF_ERROR(expect_block_end());
      for (auto& st : inner) body->push_back(std::move(st));
      return Status::ok_status();
    } else if (name == "filter" || name == "with" || name == "call" || name == "block" || name == "extends" ||
               name == "include" || name == "import" || name == "from" || name == "autoescape") {
      return error_at(line, "the '" + name + "' tag is not supported");
    } else {
      return error_at(line, "unknown tag '" + name + "'");
    }
    body->push_back(std::move(s));
    return Status::ok_status();
  }

  // ---- expressions ----

  // An expression, or a bare tuple `a, b` (jinja's parse_tuple).
  StatusOr<ExprPtr> tuple_expr(bool with_condexpr) {
    const int line = peek().line;
    K3_ASSIGN_OR_RETURN(ExprPtr first, expression(with_condexpr));
    if (!is_op(",")) return first;
    auto tuple = make(ExprKind::kTuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().kind == TokenKind::kBlockEnd || peek().kind == TokenKind::kVarEnd) break;
      K3_ASSIGN_OR_RETURN(ExprPtr item, expression(with_condexpr));
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  StatusOr<ExprPtr> expression(bool with_condexpr = true) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return error("expression nested too deeply");
    if (!with_condexpr) return or_expr();
    K3_ASSIGN_OR_RETURN(ExprPtr e, or_expr());
    while (is_name("if")) {
      const int line = next().line;
      auto cond = make(ExprKind::kCond, line);
      K3_ASSIGN_OR_RETURN(ExprPtr test, or_expr());
      ExprPtr otherwise;
      if (skip_name("else")) {
        K3_ASSIGN_OR_RETURN(otherwise, expression(true));
      }
      cond->args.push_back(std::move(e));
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  StatusOr<ExprPtr> binary(ExprPtr lhs, const std::string& op, ExprPtr rhs, int line) {
    auto e = make(ExprKind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(lhs));
    e->args.push_back(std::move(rhs));
    return e;
  }

  StatusOr<ExprPtr> or_expr() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, and_expr());
    while (is_name("or")) {
      const int line = next().line;
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, and_expr());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), "or", std::move(rhs), line));
    }
    return e;
  }

  StatusOr<ExprPtr> and_expr() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, not_expr());
    while (is_name("and")) {
      const int line = next().line;
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, not_expr());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), "and", std::move(rhs), line));
    }
    return e;
  }

  StatusOr<ExprPtr> not_expr() {
    if (is_name("not")) {
      DepthGuard guard(&depth_);
      if (depth_ > kMaxDepth) return error("expression nested too deeply");
      const int line = next().line;
      auto e = make(ExprKind::kUnary, line);
      e->name = "not";
      K3_ASSIGN_OR_RETURN(ExprPtr operand, not_expr());
      e->args.push_back(std::move(operand));
      return e;
    }
    return compare();
  }

  StatusOr<ExprPtr> compare() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, math1());
    while (true) {
      const int line = peek().line;
      std::string op;
      if (peek().kind == TokenKind::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return e;
      }
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, math1());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), op, std::move(rhs), line));
    }
  }

  StatusOr<ExprPtr> math1() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, concat());
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, concat());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), t.value, std::move(rhs), t.line));
    }
    return e;
  }

  StatusOr<ExprPtr> concat() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, math2());
    while (is_op("~")) {
      const int line = next().line;
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, math2());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), "~", std::move(rhs), line));
    }
    return e;
  }

  StatusOr<ExprPtr> math2() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, pow());
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), t.value, std::move(rhs), t.line));
    }
    return e;
  }

  StatusOr<ExprPtr> pow() {
    K3_ASSIGN_OR_RETURN(ExprPtr e, unary(true));
    while (is_op("**")) {
      const int line = next().line;
      K3_ASSIGN_OR_RETURN(ExprPtr rhs, unary(true));
      K3_ASSIGN_OR_RETURN(e, binary(std::move(e), "**", std::move(rhs), line));
    }
    return e;
  }

  StatusOr<ExprPtr> unary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return error("expression nested too deeply");
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(ExprKind::kUnary, t.line);
      e->name = t.value;
      K3_ASSIGN_OR_RETURN(ExprPtr operand, unary(false));
      e->args.push_back(std::move(operand));
    } else {
      K3_ASSIGN_OR_RETURN(e, primary());
    }
    K3_ASSIGN_OR_RETURN(e, postfix(std::move(e)));
    if (with_filter) {
      K3_ASSIGN_OR_RETURN(e, filters(std::move(e)));
    }
    return e;
  }

  StatusOr<ExprPtr> primary() {
    const Token& t = peek();
    const int line = t.line;
    if (t.kind == TokenKind::kName) {
      const std::string v = next().value;
      auto e = make(ExprKind::kLiteral, line);
      if (v == "true" || v == "True") {
        e->literal = true;
      } else if (v == "false" || v == "False") {
        e->literal = false;
      } else if (v == "none" || v == "None") {
        e->literal = nullptr;
      } else {
        e->kind = ExprKind::kName;
        e->name = v;
      }
      return e;
    }
    if (t.kind == TokenKind::kString) {
      std::string s = next().value;
      while (peek().kind == TokenKind::kString) s += next().value;  // adjacent literals concatenate
      auto e = make(ExprKind::kLiteral, line);
      e->literal = s;
      return e;
    }
    if (t.kind == TokenKind::kInt) {
      const std::string digits = next().value;
      int64_t v = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      auto e = make(ExprKind::kLiteral, line);
      if (ec != std::errc()) {
        e->literal = std::strtod(digits.c_str(), nullptr);
      } else {
        e->literal = v;
      }
      return e;
    }
    if (t.kind == TokenKind::kFloat) {
      auto e = make(ExprKind::kLiteral, line);
      e->literal = std::strtod(next().value.c_str(), nullptr);
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(ExprKind::kTuple, line);
      K3_ASSIGN_OR_RETURN(ExprPtr inner, expression(true));
      if (is_op(",")) {
        auto tuple = make(ExprKind::kTuple, line);
        tuple->args.push_back(std::move(inner));
        while (skip_op(",")) {
          if (is_op(")")) break;
          K3_ASSIGN_OR_RETURN(ExprPtr item, expression(true));
          tuple->args.push_back(std::move(item));
        }
        inner = std::move(tuple);
      }
      K3_RETURN_IF_ERROR(expect_op(")"));
      return inner;
    }
    if (skip_op("[")) {
      auto list = make(ExprKind::kList, line);
      while (!is_op("]")) {
        K3_ASSIGN_OR_RETURN(ExprPtr item, expression(true));
        list->args.push_back(std::move(item));
        if (!skip_op(",")) break;
      }
      K3_RETURN_IF_ERROR(expect_op("]"));
      return list;
    }
    if (skip_op("{")) {
      auto dict = make(ExprKind::kDict, line);
      while (!is_op("}")) {
        K3_ASSIGN_OR_RETURN(ExprPtr key, expression(true));
        K3_RETURN_IF_ERROR(expect_op(":"));
        K3_ASSIGN_OR_RETURN(ExprPtr value, expression(true));
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(value));
        if (!skip_op(",")) break;
      }
      K3_RETURN_IF_ERROR(expect_op("}"));
      return dict;
    }
    return unexpected("an expression");
  }

  Status call_args(Expr* call) {
    // '(' already consumed.
    while (!is_op(")")) {
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        const std::string key = next().value;
        next();
        K3_ASSIGN_OR_RETURN(ExprPtr value, expression(true));
        call->kwargs.emplace_back(key, std::move(value));
      } else {
        if (!call->kwargs.empty()) return error("positional argument after keyword argument");
        K3_ASSIGN_OR_RETURN(ExprPtr value, expression(true));
        call->args.push_back(std::move(value));
      }
      if (!skip_op(",")) break;
    }
    return expect_op(")");
  }

  StatusOr<ExprPtr> postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (skip_op(".")) {
        auto attr = make(ExprKind::kAttr, line);
        if (peek().kind == TokenKind::kInt) {
          attr->kind = ExprKind::kSubscript;
          auto idx = make(ExprKind::kLiteral, line);
          idx->literal = std::stoll(next().value);
          attr->args.push_back(std::move(e));
          attr->args.push_back(std::move(idx));
        } else {
          K3_ASSIGN_OR_RETURN(attr->name, expect_ident());
          attr->args.push_back(std::move(e));
        }
        e = std::move(attr);
      } else if (skip_op("[")) {
        ExprPtr parts[3];
        bool is_slice = false;
        for (int i = 0; i < 3; ++i) {
          if (!is_op(":") && !is_op("]")) {
            K3_ASSIGN_OR_RETURN(parts[i], expression(true));
          }
          if (i < 2 && skip_op(":")) {
            is_slice = true;
          } else {
            break;
          }
        }
        K3_RETURN_IF_ERROR(expect_op("]"));
        auto sub = make(is_slice ? ExprKind::kSlice : ExprKind::kSubscript, line);
        sub->args.push_back(std::move(e));
        if (is_slice) {
          for (auto& p : parts) sub->args.push_back(std::move(p));
        } else {
          if (!parts[0]) return error_at(line, "empty subscript");
          sub->args.push_back(std::move(parts[0]));
        }
        e = std::move(sub);
      } else if (skip_op("(")) {
        auto call = make(ExprKind::kCall, line);
        call->args.push_back(std::move(e));
        K3_RETURN_IF_ERROR(call_args(call.get()));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> filters(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (skip_op("|")) {
        auto f = make(ExprKind::kFilter, line);
        K3_ASSIGN_OR_RETURN(f->name, expect_ident());
        f->args.push_back(std::move(e));
        if (skip_op("(")) K3_RETURN_IF_ERROR(call_args(f.get()));
        e = std::move(f);
      } else if (skip_name("is")) {
        auto test = make(ExprKind::kTest, line);
        test->negated = skip_name("not");
        K3_ASSIGN_OR_RETURN(test->name, expect_ident());
        test->args.push_back(std::move(e));
        const Token& t = peek();
        if (skip_op("(")) {
          K3_RETURN_IF_ERROR(call_args(test.get()));
        } else if (t.kind == TokenKind::kString || t.kind == TokenKind::kInt || t.kind == TokenKind::kFloat ||
                   is_op("[") || is_op("{") ||
                   (t.kind == TokenKind::kName && t.value != "else" && t.value != "or" && t.value != "and" &&
                    t.value != "if" && t.value != "not" && t.value != "in" && t.value != "is")) {
          K3_ASSIGN_OR_RETURN(ExprPtr arg, primary());
          K3_ASSIGN_OR_RETURN(arg, postfix(std::move(arg)));
          test->args.push_back(std::move(arg));
        }
        e = std::move(test);
      } else if (skip_op("(")) {
        auto call = make(ExprKind::kCall, line);
        call->args.push_back(std::move(e));
        K3_RETURN_IF_ERROR(call_args(call.get()));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<Body> parse_template(std::string_view source) {
  K3_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace k3::tok::jinja
