// Jinja parser for chat templates: the syntax tree (expressions and
// statements) and the recursive-descent parser that builds it from
// jinja_lexer tokens, with jinja2's operator precedence.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace k3::tok::jinja {

using Json = nlohmann::ordered_json;

enum class ExprKind {
  kLiteral,    // literal
  kName,       // name
  kList,       // args: items
  kTuple,      // args: items
  kDict,       // args: key, value, key, value...
  kAttr,       // args[0].name
  kSubscript,  // args[0][args[1]]
  kSlice,      // args[0][args[1]:args[2]:args[3]] (each bound may be null)
  kCall,       // args[0](args[1..], kwargs)
  kFilter,     // args[0] | name(args[1..], kwargs)
  kTest,       // args[0] is [not] name(args[1..])
  kUnary,      // name args[0]: "not", "-", "+"
  kBinary,     // args[0] name args[1]
  kCond,       // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  Json literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // `is not`
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (cond null for else)
  kFor,       // for targets in expr [if filter]: body [else else_body]
  kSet,       // set targets[0][.attr] = expr
  kSetBlock,  // set targets[0] %} body {% endset
  kMacro,     // macro name(params): body
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;  // set ns.attr
  ExprPtr filter;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters, default may be null
};

// Parses a whole template. Errors name the line and the problem.
StatusOr<Body> parse_template(std::string_view source);

}  // namespace k3::tok::jinja
