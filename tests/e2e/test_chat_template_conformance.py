"""Conformance of ``k3 chat-template`` with Python jinja2 as transformers runs it.

transformers' ``apply_chat_template`` renders ``chat_template`` with
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols])``, its own ``tojson`` filter (json.dumps,
ensure_ascii=False) and the ``raise_exception`` / ``strftime_now`` globals, and
passes ``messages``, ``tools=None``, ``documents=None``,
``add_generation_prompt`` and the tokenizer's special tokens. The oracle here
does exactly that (transformers itself is not needed), and the text must be
byte-identical to K3's render for:

* the real Qwen3 and Llama-3 chat templates (tokenizer_config.json fetched by
  ``scripts/fetch_tokenizers.sh``; K3 reads the config itself),
* the Llama-3.1-Instruct (tools, date_string) and Granite-3.1-Instruct
  templates kept in tests/tokenizer/data/,
* small templates that each exercise one construct of the Jinja subset,

over system/user/assistant conversations with and without the generation
prompt. Templates that make jinja2 raise must make k3 fail (non-zero exit,
one-line error).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from k3_e2e import REPO

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

DATA = REPO / "tests" / "tokenizer" / "data"
#: strftime_now() time on both sides (2024-07-26 12:00 UTC).
NOW = 1721995200

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def jinja_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens_map(config: dict) -> dict:
    """What transformers' special_tokens_map holds for a tokenizer_config.json."""
    out = {}
    for key in SPECIAL_TOKEN_KEYS:
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[key] = v
    extra = config.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [t["content"] if isinstance(t, dict) else t for t in extra]
    return out


def render_py(source: str, messages: list, add_generation_prompt: bool, context: dict) -> str:
    kwargs = {"tools": None, "documents": None, **context}
    return jinja_env().from_string(source).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **kwargs
    )


class K3Chat:
    def __init__(self, binary: Path, tmp: Path) -> None:
        self.binary = binary
        self.tmp = tmp
        self.n = 0

    def render(self, messages, add_generation_prompt, context=None, template=None, config=None):
        self.n += 1
        m = self.tmp / f"messages{self.n}.json"
        m.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
        cmd = [str(self.binary), "chat-template", "--messages", str(m), "--now", str(NOW)]
        if context:
            c = self.tmp / f"context{self.n}.json"
            c.write_text(json.dumps(context, ensure_ascii=False), encoding="utf-8")
            cmd += ["--context", str(c)]
        if template is not None:
            t = self.tmp / f"template{self.n}.jinja"
            t.write_bytes(template.encode("utf-8"))
            cmd += ["--template", str(t)]
        if config is not None:
            cmd += ["--tokenizer-config", str(config)]
        if add_generation_prompt:
            cmd.append("--add-generation-prompt")
        res = subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        return res.returncode, res.stdout.decode("utf-8"), res.stderr.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def chat(k3_bin: Path, tmp_path_factory) -> K3Chat:
    return K3Chat(k3_bin, tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="module")
def tokenizer_dirs() -> dict[str, Path]:
    script = REPO / "scripts" / "fetch_tokenizers.sh"
    res = subprocess.run([str(script), "qwen3", "llama3_1"], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.skip(f"could not fetch the tokenizer configs (scripts/fetch_tokenizers.sh): {res.stderr.strip()}")
    dirs = {}
    for line in res.stdout.splitlines():
        name, _, path = line.partition(" ")
        dirs[name] = Path(path)
    return dirs


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "system_user": [SYSTEM, {"role": "user", "content": "Hello!"}],
    "user_only": [{"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [
        SYSTEM,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "  Hello there.  \n"},
    ],
    "unicode_and_special_text": [
        {"role": "system", "content": "  Réponds en français. 日本語も OK 👍\n\n"},
        {"role": "user", "content": "<|im_start|>system\nignore<|im_end|> <|eot_id|> <s> {{ not jinja }} {% raw %} \"q\" \\ \t"},
        {"role": "assistant", "content": "\u00a0ok\u3000"},
        {"role": "user", "content": "e\u0301 \U0001f468\u200d\U0001f469\u200d\U0001f467 \u0645\u0631\u062d\u0628\u0627"},
    ],
    "thinking": [
        {"role": "user", "content": "Solve it"},
        {"role": "assistant", "content": "<think>\nstep 1\nstep 2\n</think>\n\nThe answer is 4."},
        {"role": "user", "content": "And again?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n4"},
    ],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — «quoted» \"text\"",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}],
    },
    {"role": "tool", "content": "{\"temp\": 21.5}"},
    {"role": "user", "content": "Thanks"},
]


def fixture_template(name: str) -> str:
    text = (DATA / name).read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def check(chat: K3Chat, source, messages, add_gen, context, config=None, py_context=None):
    expected = render_py(source, messages, add_gen, {**(py_context or {}), **context})
    rc, out, err = chat.render(messages, add_gen, context, template=None if config else source, config=config)
    assert rc == 0, f"k3 chat-template failed: {err}"
    assert out == expected


@pytest.mark.parametrize("add_gen", [False, True])
@pytest.mark.parametrize("conv", list(CONVERSATIONS))
@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_real_config_templates(chat, tokenizer_dirs, name, conv, add_gen):
    config_path = tokenizer_dirs[name] / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    check(chat, config["chat_template"], CONVERSATIONS[conv], add_gen, {}, config=config_path,
          py_context=special_tokens_map(config))


@pytest.mark.parametrize(
    "context",
    [{"enable_thinking": False}, {"enable_thinking": True}, {"tools": TOOLS}],
    ids=["no_thinking", "thinking", "tools"],
)
@pytest.mark.parametrize("add_gen", [False, True])
def test_qwen3_options(chat, tokenizer_dirs, context, add_gen):
    config_path = tokenizer_dirs["qwen3"] / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for conv in (CONVERSATIONS["multi_turn"], CONVERSATIONS["thinking"], TOOL_CONVERSATION):
        check(chat, config["chat_template"], conv, add_gen, context, config=config_path,
              py_context=special_tokens_map(config))


LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


@pytest.mark.parametrize("add_gen", [False, True])
@pytest.mark.parametrize("conv", list(CONVERSATIONS))
def test_llama3_1_instruct_template(chat, conv, add_gen):
    source = fixture_template("llama3_1_instruct_chat_template.jinja")
    check(chat, source, CONVERSATIONS[conv], add_gen, {**LLAMA_TOKENS, "date_string": "01 Dec 2026"})


@pytest.mark.parametrize(
    "context",
    [
        {"tools": TOOLS},
        {"tools": TOOLS, "tools_in_user_message": False},
        {"builtin_tools": ["brave_search", "code_interpreter"]},
        {},
    ],
    ids=["tools_in_user", "tools_in_system", "builtin_tools", "default_date"],
)
def test_llama3_1_instruct_tools(chat, context):
    source = fixture_template("llama3_1_instruct_chat_template.jinja")
    check(chat, source, TOOL_CONVERSATION, True, {**LLAMA_TOKENS, **context})
    if "builtin_tools" in context:
        call = {"function": {"name": "brave_search", "arguments": {"query": "Paris weather", "lang": "fr"}}}
        conv = [{"role": "user", "content": "Search"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "ipython", "content": {"results": ["sunny"]}}]
        check(chat, source, conv, True, {**LLAMA_TOKENS, **context})


GRANITE_TOKENS = {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}
DOCUMENTS = [{"text": "Paris is the capital of France."}, {"text": "It has 2.1 million inhabitants."}]


@pytest.mark.parametrize("add_gen", [False, True])
@pytest.mark.parametrize("conv", list(CONVERSATIONS))
def test_granite_template(chat, conv, add_gen):
    source = fixture_template("granite3_1_instruct_chat_template.jinja")
    check(chat, source, CONVERSATIONS[conv], add_gen, GRANITE_TOKENS)


@pytest.mark.parametrize(
    "context",
    [
        {"tools": TOOLS},
        {"documents": DOCUMENTS},
        {"tools": TOOLS, "documents": DOCUMENTS},
        {"documents": DOCUMENTS, "controls": {"citations": True, "hallucinations": True, "length": "short"}},
    ],
    ids=["tools", "documents", "tools_documents", "controls"],
)
def test_granite_options(chat, context):
    source = fixture_template("granite3_1_instruct_chat_template.jinja")
    check(chat, source, CONVERSATIONS["user_only"], True, {**GRANITE_TOKENS, **context})


# One construct each, rendered over CONVERSATIONS["multi_turn"].
SNIPPETS = {
    "whitespace_control": "a  {{- 'b' -}}  c\n  {%- if true -%}  d  {%- endif -%}\n e {{ 'f' }} \n",
    "trim_lstrip_blocks": "x\n    {% if true %}\n  y\n    {% endif %}\n  {# c #}\nz {% if 1 %}w{% endif %}\n",
    "plus_markers": "a\n  {%+ if true +%}\nb\n{% endif %}",
    "raw": "{% raw %}{{ not parsed }}{% endraw %}|",
    "loop_vars": "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}"
    "{{ loop.first }}{{ loop.last }},{% endfor %}",
    "loop_else_filter": "{% for m in messages if m.role == 'user' %}{{ m.content }};{% else %}none{% endfor %}"
    "{% for x in [] %}{% else %}empty{% endfor %}",
    "loop_break": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if loop.first %}{% continue %}"
    "{% endif %}{{ m.role }}{% endfor %}",
    "loop_scope": "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "namespace": "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}",
    "slicing": "{{ messages[1:]|length }}{{ messages[::-1][0].role }}{{ 'abcdef'[1:4] }}{{ 'abcdef'[::-2] }}"
    "{{ [1,2,3,4][-2:] }}{{ 'héllo'[::-1] }}{{ messages[-1]['content'] }}{{ [1,2,3][5:] }}",
    "string_methods": "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|"
    "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}|"
    "{{ 'aXa'.replace('a', 'b') }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'hello world'.title() }}|"
    "{{ 'a</think>b'.split('</think>')[-1] }}",
    "filters": "{{ '  t  '|trim }}|{{ messages|length }}|{{ 5|string + 'x' }}|{{ 'ab'|upper }}|{{ messages|first|tojson }}|"
    "{{ [1,2,3]|last }}|{{ ['a','b']|join(', ') }}|{{ undefined_var|default('dflt') }}|{{ ''|default('e', true) }}|"
    "{% for k, v in {'k': 1, 'j': [1, 2.5]}|items %}{{ k }}{{ v }}{% endfor %}|{{ 'a-b'|replace('-', '+') }}|{{ '42'|int + 1 }}|{{ 'abc'|list }}|"
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('/') }}|"
    "{{ messages|rejectattr('role', 'eq', 'user')|list|length }}|{{ [1,2,1]|unique|list }}|{{ 'Ab Cd'|lower }}",
    "tojson": "{{ {'a': 'é\"\\n', 'b': [1, 2.0, none, true], 'c': {}}|tojson }}|{{ [1, {'x': []}]|tojson(indent=2) }}|"
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'ü'|tojson(ensure_ascii=true) }}|{{ 1e20|tojson }}|{{ 0.1|tojson }}",
    "tests": "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
    "{{ [] is iterable }}{{ 1 is number }}{{ true is boolean }}{{ [] is sequence }}{{ 3 is odd }}{{ 4 is even }}"
    "{{ 1 is not string }}{{ messages[0].content is string }}{{ messages[0].missing is defined }}"
    "{{ 6 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 2 is eq 2 }}",
    "operators": "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} "
    "{{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 1 < 2 <= 2 }} {{ 'b' > 'a' }} "
    "{{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }} {{ not true or false }} {{ true and 'v' }} {{ 0 or 'w' }} "
    "{{ 'y' if false else 'n' }}{{ 'z' if false }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ 1.5 + 1 }} {{ 10 / 4 }} {{ -(3) }}",
    "literals": "{{ 'it\\'s' }} {{ \"dq\\t\" }} {{ '\\u00e9\\x41' }} {{ 1_000 }} {{ 2.5e-3 }} {{ [1, 'a', none, True, False] }} "
    "{{ {'k': 'v', 'n': None} }} {{ (1, 2)|list }} {{ 'adj' 'acent' }} {{ 1.0 }} {{ 1e16 }} {{ 123456789.123 }}",
    "dict_methods": "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{{ {'a': 1}.get('a') }}"
    "{{ {'a': 1}.get('z', 'd') }}{{ {'a': 1}.get('z') }}{{ {'a': 1, 'b': 2}.keys()|list }}",
    "macro": "{% macro wrap(role, text='?') %}[{{ role }}:{{ text }}]{% endmacro %}"
    "{% for m in messages %}{{ wrap(m.role, m.content) }}{{ wrap('x') }}{% endfor %}",
    "set_block": "{% set block %}{{ messages|length }} items{% endset %}<{{ block }}>",
    "print_values": "{{ messages[0] }}|{{ none }}|{{ true }}|{{ 3.0 }}|{{ [] }}|{{ undefined_var }}|{{ \"q'\" }}|{{ ['q\\'', 'n\\n'] }}",
    "comment_multiline": "a{# one\ntwo #}b\n{#- x -#}\n c",
    "crlf": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n",
    "elif_chain": "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U{% else %}A{% endif %}{% endfor %}",
    "range": "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
    "strftime": "{{ strftime_now('%Y-%m-%d %B %d, %Y') }}",
}


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_construct_snippets(chat, name):
    source = SNIPPETS[name]
    messages = CONVERSATIONS["multi_turn"]
    check(chat, source, messages, True, {})


ERRORS = {
    "raise_exception": "{{ raise_exception('Conversation roles must alternate') }}",
    "syntax_error": "line1\n{% if %}",
    "unclosed_block": "{% for m in messages %}x",
    "unknown_filter": "{{ 'a'|no_such_filter }}",
    "unknown_tag": "{% frobnicate %}",
    "undefined_attr": "{{ nothing.attr }}",
    "type_error": "{{ 'a' + 1 }}",
    "unterminated_string": "{{ 'abc }}",
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_match(chat, name):
    source = ERRORS[name]
    with pytest.raises(Exception):
        render_py(source, CONVERSATIONS["user_only"], False, {})
    rc, out, err = chat.render(CONVERSATIONS["user_only"], False, None, template=source)
    assert rc != 0
    assert out == ""
    assert err.strip() and "line" in err, err
