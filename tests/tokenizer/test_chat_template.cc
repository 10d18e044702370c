// Unit tests of the chat-template Jinja subset: whitespace control
// (markers, trim_blocks, lstrip_blocks), loops and loop variables, scoping,
// namespaces, slicing, filters, tests, string methods, tojson, macros, the
// tokenizer_config.json loader, and errors (raise_exception, syntax errors
// naming the line, unknown filters, runaway loops) coming back as Status.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace k3::tok {
namespace {

using Json = nlohmann::ordered_json;

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

// Renders `source` over kChat (add_generation_prompt on), failing the test on error.
std::string render(const std::string& source, const Json& extra = Json::object(),
                   const std::vector<ChatMessage>& messages = kChat) {
  auto t = ChatTemplate::parse(source);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return "<parse error>";
  auto out = t->render(messages, true, extra);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : "<render error>";
}

// The error message of parsing + rendering `source` (empty if it succeeded).
std::string error_of(const std::string& source, const Json& extra = Json::object()) {
  auto t = ChatTemplate::parse(source);
  if (!t.ok()) return t.status().message();
  jinja::RenderOptions options;
  options.limits.max_steps = 100000;
  auto out = t->render(kChat, false, extra, options);
  return out.ok() ? "" : out.status().message();
}

TEST(ChatTemplate, TextAndOutput) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("{{ messages[1].content }}|{{ messages[1]['role'] }}"), "Hi|user");
  EXPECT_EQ(render("{{ add_generation_prompt }} {{ tools }} {{ bos_token }}", Json{{"bos_token", "<s>"}}),
            "True None <s>");
  EXPECT_EQ(render("a\n"), "a");  // one trailing newline dropped, like jinja2
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a \n {%- if true -%} \n b \n {%- endif %}"), "ab");
  EXPECT_EQ(render("x {#- comment -#} y"), "xy");
}

TEST(ChatTemplate, TrimAndLstripBlocks) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before one goes. Neither applies to {{ }}.
  EXPECT_EQ(render("{% if true %}\n  yes\n{% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("    {% if true %}\nx\n    {% endif %}\n"), "x\n");
  EXPECT_EQ(render("  {{ 'v' }}\n"), "  v");
  EXPECT_EQ(render("a  {% if true %}b{% endif %}"), "a  b");  // not at line start: kept
  EXPECT_EQ(render("  {%+ if true %}b{% endif %}"), "  b");   // + disables lstrip
  EXPECT_EQ(render("{% if true +%}\nb{% endif %}"), "\nb");   // + disables trim
  EXPECT_EQ(render("  {# c #}\nz"), "z");
}

TEST(ChatTemplate, IfElifElse) {
  EXPECT_EQ(render("{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U{% else %}A"
                   "{% endif %}{% endfor %}"),
            "SUAU");
}

TEST(ChatTemplate, LoopVariables) {
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex0 }}{{ loop.length }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},{% endfor %}"),
            "1034F,2124,3214,4304L,");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for m in messages if m.role == 'user' %}{{ loop.index }}{{ m.content }}{% endfor %}"),
            "1Hi2Bye");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}"
                   "{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}"),
            "user");
}

TEST(ChatTemplate, LoopScopeAndNamespace) {
  // set inside a loop is per iteration and does not leak; namespace attributes do.
  EXPECT_EQ(render("{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "22221");
  EXPECT_EQ(render("{% set ns = namespace(n=0, found=false) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                   "{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.n }}"
                   "{{ ns.found }}"),
            "4True");
  EXPECT_EQ(render("{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}"), "set in if");
}

TEST(ChatTemplate, Slicing) {
  EXPECT_EQ(render("{{ messages[1:]|length }}{{ messages[::-1][0].content }}{{ messages[-1].content }}"), "3ByeBye");
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }}|{{ 'abcdef'[::-2] }}|{{ [1, 2, 3, 4][-2:] }}|{{ [1, 2][5:] }}"),
            "bcd|fdb|[3, 4]|[]");
  EXPECT_EQ(render("{{ 'h\xC3\xA9llo'[::-1] }}{{ 'h\xC3\xA9llo'[1] }}"), "oll\xC3\xA9h\xC3\xA9");
}

TEST(ChatTemplate, Operators) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "7 3 -4 2 3.5 1024");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 1 == 1.0 }} {{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }}"),
            "a1None True True True");
  EXPECT_EQ(render("{{ 0 or 'w' }} {{ true and 'v' }} {{ not none }} {{ 'y' if false else 'n' }}[{{ 'z' if false }}]"),
            "w v True n[]");
  EXPECT_EQ(render("{{ messages|length - 1 }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ 0.1 + 0.2 }}"),
            "3 [1, 2] abab 0.30000000000000004");
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(render("{{ '  t \n'|trim }}|{{ 5|string + 'x' }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ [1, 2]|first }}"
                   "{{ [1, 2]|last }}|{{ ['a', 'b']|join(', ') }}"),
            "t|5x|AB|ab|12|a, b");
  EXPECT_EQ(
      render("{{ nope|default('d') }}|{{ ''|default('e', true) }}|{{ 'a-b'|replace('-', '+') }}|{{ '42'|int + 1 }}"
             "|{{ 'ab'|list }}|{{ 'hello world'|title }}"),
      "d|e|a+b|43|['a', 'b']|Hello World");
  EXPECT_EQ(
      render(
          "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('/') }}|"
          "{{ messages|rejectattr('role', 'eq', 'user')|list|length }}|{{ ['a', 'b']|reject('equalto', 'a')|join }}"),
      "Hi/Bye|2|b");
  EXPECT_EQ(render("{% for k, v in {'x': 1}|items %}{{ k }}={{ v }}{% endfor %}"), "x=1");
}

TEST(ChatTemplate, ToJson) {
  EXPECT_EQ(render("{{ {'a': '\xC3\xA9\"\\n<>', 'b': [1, 2.0, none, true], 'c': {}}|tojson }}"),
            "{\"a\": \"\xC3\xA9\\\"\\n<>\", \"b\": [1, 2.0, null, true], \"c\": {}}");
  EXPECT_EQ(render("{{ [1, {'x': []}]|tojson(indent=2) }}"), "[\n  1,\n  {\n    \"x\": []\n  }\n]");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render("{{ messages[0]|tojson }}"), "{\"role\": \"system\", \"content\": \"Be brief.\"}");
}

TEST(ChatTemplate, Tests) {
  EXPECT_EQ(
      render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
             "{{ [] is iterable }}{{ 1 is number }}{{ true is boolean }}{{ [] is sequence }}{{ 1 is not string }}"),
      "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ messages[0].content is string }}{{ messages[0].reasoning is defined }}{{ 6 is divisibleby 3 }}"),
            "TrueFalseTrue");
  EXPECT_EQ(render("{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}",
                   Json{{"enable_thinking", false}}),
            "off");
}

TEST(ChatTemplate, StringMethods) {
  EXPECT_EQ(render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\na'.lstrip('\\n') }}|{{ 'a \n'.rstrip() }}"),
            "a b|a|a|a");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}"
                   "{{ 'abc'.endswith('bc') }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}"),
            "['a', 'b', '', 'c']|['a', 'b']|TrueTrue|bXb|HIhi");
  EXPECT_EQ(render("{{ '<think>r</think>\\n\\nans'.split('</think>')[-1].lstrip('\\n') }}"), "ans");
  EXPECT_EQ(render("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 'd') }}{{ {'a': 1}.get('z') }}"), "1dNone");
}

TEST(ChatTemplate, LiteralsAndPrinting) {
  EXPECT_EQ(render("{{ 'it\\'s' }} {{ \"t\\tb\" }} {{ '\\u00e9' }} {{ 1_000 }} {{ 2.5e-3 }} {{ 1.0 }} {{ 1e16 }}"),
            "it's t\tb \xC3\xA9 1000 0.0025 1.0 1e+16");
  EXPECT_EQ(render("{{ [1, 'a', none, True] }} {{ {'k': \"q'\"} }} {{ 'adj' 'acent' }}"),
            "[1, 'a', None, True] {'k': \"q'\"} adjacent");
  EXPECT_EQ(render("{% raw %}{{ kept }}{% endraw %}"), "{{ kept }}");
}

TEST(ChatTemplate, MacrosAndSetBlocks) {
  EXPECT_EQ(
      render("{% macro tag(role, text='?') %}[{{ role }}:{{ text }}]{% endmacro %}{{ tag('u', 'x') }}{{ tag('a') }}"),
      "[u:x][a:?]");
  EXPECT_EQ(render("{% set block %}{{ messages|length }} items{% endset %}<{{ block }}>"), "<4 items>");
}

TEST(ChatTemplate, GenerationPromptFlag) {
  auto t = ChatTemplate::parse("{% if add_generation_prompt %}<gen>{% endif %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render(kChat, true), "<gen>");
  EXPECT_EQ(*t->render(kChat, false), "");
}

TEST(ChatTemplate, Errors) {
  EXPECT_EQ(error_of("{{ raise_exception('roles must alternate') }}"),
            "chat template error at line 1: raise_exception: roles must alternate");
  EXPECT_EQ(error_of("ok\n\n{% if %}"),
            "chat template syntax error at line 3: unexpected '%}', expected an expression");
  EXPECT_NE(error_of("a\n{{ 'x'|no_such_filter }}").find("line 2: no filter named 'no_such_filter'"),
            std::string::npos);
  EXPECT_NE(error_of("{% for m in messages %}").find("expected 'endfor'"), std::string::npos);
  EXPECT_NE(error_of("{% frobnicate %}").find("unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{# open").find("missing end of comment"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ x is no_such_test }}").find("no test named"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 // 0 }}").find("by zero"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a loop"), std::string::npos);
}

TEST(ChatTemplate, WorkIsBounded) {
  // A nested loop of 10^10 iterations stops at the step limit instead of hanging.
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}").find("limit"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("nested too deeply"),
            std::string::npos);
  const std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("size limit"), std::string::npos);
}

TEST(ChatTemplateConfig, StringAndNamedForms) {
  Json plain = {{"chat_template", "{{ bos_token }}"},
                {"bos_token", "<s>"},
                {"eos_token", {{"content", "</s>"}}},
                {"unk_token", nullptr}};
  auto c = chat_template_config_from_json(plain);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->source, "{{ bos_token }}");
  EXPECT_EQ(c->special_tokens, (Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}));

  Json named = {{"chat_template", Json::array({Json{{"name", "tool_use"}, {"template", "T"}},
                                               Json{{"name", "default"}, {"template", "D"}}})}};
  EXPECT_EQ(chat_template_config_from_json(named)->source, "D");
  EXPECT_EQ(chat_template_config_from_json(named, "tool_use")->source, "T");
  EXPECT_FALSE(chat_template_config_from_json(named, "missing").ok());
  EXPECT_FALSE(chat_template_config_from_json(Json{{"bos_token", "<s>"}}).ok());
}

}  // namespace
}  // namespace k3::tok
