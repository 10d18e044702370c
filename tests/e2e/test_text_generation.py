"""``k3 generate --prompt TEXT``: text in, text out through the model's
Hugging Face tokenizer.

The tokenizer is a small byte-level BPE trained here with PyPI's
``tokenizers`` and saved next to a random checkpoint whose vocabulary has
exactly its size. The oracle is the same library plus the PyTorch reference:
prompt ids equal ``Tokenizer.encode``, generated ids the reference's greedy
tokens, and text ``Tokenizer.decode`` of them (streamed or not)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3_e2e import K3Runner
from k3ref.generate import greedy_generate
from test_cli_errors import assert_k3_error

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello K3 mixture of experts",
    "caf\u00e9 na\u00efve \u4f60\u597d \u4e16\u754c",
] * 20
STEPS = 12


@pytest.fixture(scope="module")
def text_model(k3: K3Runner, checkpoints, tmp_path_factory) -> tuple[Path, object]:
    """A k3-tiny-shaped checkpoint with a trained tokenizer of its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    root = tmp_path_factory.mktemp("text_model")
    cfg = json.loads((checkpoints["k3-tiny"] / "config.json").read_text())
    cfg["vocab_size"] = tok.get_vocab_size()
    cfg.pop("eos_token_id", None)
    (root / "cfg.json").write_text(json.dumps(cfg))
    model = root / "model"
    res = k3.run("init-model", "--config", root / "cfg.json", "--seed", 11, "--out", model)
    assert res.returncode == 0, res.stderr
    tok.save(str(model / "tokenizer.json"))
    return model, tok


def generate_json(k3: K3Runner, model: Path, *args) -> dict:
    res = k3.run("generate", "--model", model, "-n", STEPS, "--temp", 0, "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_text_prompt_matches_tokenizer_and_reference(k3: K3Runner, ref_model, text_model):
    model, tok = text_model
    prompts = ["hello world", "the lazy fox \u4f60\u597d"]
    out = generate_json(k3, model, "--prompt", prompts[0], "--prompt", prompts[1])
    assert out["prompt_ids"] == [tok.encode(p).ids for p in prompts]
    ref = ref_model(model)
    want = [greedy_generate(ref, tok.encode(p).ids, STEPS)[0] for p in prompts]
    assert out["generated_ids"] == want
    assert out["text"] == [tok.decode(ids, skip_special_tokens=True) for ids in want]


def test_single_prompt_streams_the_same_text(k3: K3Runner, text_model, tmp_path):
    model, tok = text_model
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello K3\nmixture of experts", encoding="utf-8")
    res = k3.run("generate", "--model", model, "-n", STEPS, "--temp", 0, "--prompt-file", prompt)
    assert res.returncode == 0, res.stderr
    out = generate_json(k3, model, "--prompt-file", prompt)
    assert out["prompt_ids"] == [tok.encode(prompt.read_text(encoding="utf-8")).ids]
    assert res.stdout == out["text"][0] + "\n"


def test_tokenizer_eos_token_stops_generation(k3: K3Runner, text_model, tmp_path):
    """The eos_token of tokenizer_config.json ends a sequence (the config has none)."""
    model, tok = text_model
    ids = generate_json(k3, model, "--prompt", "hello world")["generated_ids"][0]
    stop = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    local = tmp_path / "tok"
    local.mkdir()
    (local / "tokenizer.json").write_text((model / "tokenizer.json").read_text())
    (local / "tokenizer_config.json").write_text(json.dumps({"eos_token": tok.id_to_token(ids[stop])}))
    out = generate_json(k3, model, "--prompt", "hello world", "--tokenizer", local)
    assert out["generated_ids"] == [ids[: stop + 1]]
    assert out["finish_reason"] == ["eos"]


def test_special_token_text_in_prompt(k3: K3Runner, text_model):
    model, tok = text_model
    special = tok.token_to_id("<|endoftext|>")
    assert generate_json(k3, model, "--prompt", "<|endoftext|>")["prompt_ids"] == [[special]]
    plain = generate_json(k3, model, "--prompt", "<|endoftext|>", "--no-parse-special")["prompt_ids"][0]
    assert special not in plain and len(plain) > 1


def test_text_prompt_errors(k3: K3Runner, checkpoints, text_model, tmp_path):
    model, _ = text_model
    # No tokenizer next to the model.
    assert_k3_error(k3.run("generate", "--model", checkpoints["k3-tiny"], "--prompt", "hi"), "tokenizer")
    # A tokenizer with more ids than the model's vocabulary.
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] -= 10
    (tmp_path / "small.json").write_text(json.dumps(cfg))
    assert k3.run("init-model", "--config", tmp_path / "small.json", "--seed", 1, "--out", tmp_path / "m").returncode == 0
    assert_k3_error(
        k3.run("generate", "--model", tmp_path / "m", "--prompt", "hi", "--tokenizer", model / "tokenizer.json"),
        "vocabulary",
    )
    assert_k3_error(k3.run("generate", "--model", model, "--prompt", "hi", "--tokenizer", tmp_path / "no.json"), "no.json")
    assert_k3_error(k3.run("generate", "--model", model, "--prompt", "hi", "--prompt-ids", "1,2"), "not both")
    assert_k3_error(k3.run("generate", "--model", model, "--prompt-file", tmp_path / "nope.txt"), "nope.txt")
    assert_k3_error(k3.run("generate", "--model", model, "--prompt", ""), "empty")
    long = " ".join(["hello world"] * 200)
    assert_k3_error(k3.run("generate", "--model", model, "--prompt", long, "-c", "32"), "context")


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(text_model, tmp_path_factory) -> Path:
    """The text model with a tokenizer_config.json holding a chat template."""
    import shutil

    model, _ = text_model
    d = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(model, d)
    (d / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE})
    )
    return d


def k3_chat(k3: K3Runner, model: Path, lines: list[str], *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(k3.binary), "chat", "--model", str(model), "-n", "8", "--temp", "0", *map(str, args)],
        input="".join(line + "\n" for line in lines), capture_output=True, text=True, timeout=120, check=False,
    )


def test_chat_turns_follow_the_template_and_the_reference(k3: K3Runner, ref_model, text_model, chat_model):
    """Each turn's prompt is the jinja2 rendering of the conversation so far
    (earlier replies included), tokenized; each reply is the reference's
    greedy continuation; streamed text equals the --json text."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    _, tok = text_model
    users = ["hello world", "the lazy fox"]
    res = k3_chat(k3, chat_model, users, "--json", "--system", "be brief")
    assert res.returncode == 0, res.stderr
    turns = [json.loads(line) for line in res.stdout.splitlines()]
    assert [t["turn"] for t in turns] == [1, 2]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(CHAT_TEMPLATE)
    ref = ref_model(chat_model)
    messages = [{"role": "system", "content": "be brief"}]
    for user, turn in zip(users, turns):
        messages.append({"role": "user", "content": user})
        text = template.render(messages=messages, add_generation_prompt=True, eos_token="<|endoftext|>")
        ids = tok.encode(text, add_special_tokens=False).ids
        assert turn["prompt_ids"] == ids
        assert turn["generated_ids"] == greedy_generate(ref, ids, 8)[0]
        assert turn["text"] == tok.decode(turn["generated_ids"], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": turn["text"]})
    streamed = k3_chat(k3, chat_model, users, "--system", "be brief")
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == "".join(t["text"] + "\n" for t in turns)


def test_chat_errors(k3: K3Runner, text_model, chat_model, tmp_path):
    model, _ = text_model
    # A tokenizer without tokenizer_config.json: no template to render with.
    assert_k3_error(k3_chat(k3, model, ["hi"]), "chat_template")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    assert_k3_error(k3_chat(k3, chat_model, ["hi"], "--chat-template", bad), "line")
    # A conversation longer than the context.
    assert_k3_error(k3_chat(k3, chat_model, ["hello world " * 100], "-c", "32"), "context")
