"""Bad input to the ``k3`` command line fails cleanly.

Every case must: exit with a non-zero status; not die from a signal (a
negative ``returncode``, e.g. SIGSEGV or an abort); finish within 60 s; and

* for errors the program itself detects: print exactly one stderr line,
  starting with ``k3: error:`` (often also naming the culprit: the file, the
  tensor, the config key, the token);
* for flag parse errors reported by CLI11 (out-of-range numbers, unknown
  choices, missing required flags): mention the offending flag on stderr.

Also ``k3 --help``, ``k3 generate --help`` and ``k3 init-model --help`` exit 0
and document every flag the tests rely on.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Optional, Sequence

import pytest

from k3_e2e import K3Runner

TIMEOUT = 60


def assert_k3_error(res, *needles: str) -> str:
    """A clean ``k3: error:`` failure whose message contains every needle."""
    assert res.returncode > 0, (
        f"expected a non-zero exit, got {res.returncode}\nstdout: {res.stdout!r}\nstderr: {res.stderr!r}"
    )
    lines = res.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("k3: error:"), (
        f"expected one 'k3: error:' line on stderr, got:\n{res.stderr}"
    )
    message = lines[0]
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


def assert_usage_error(res, flags: Sequence[str]) -> None:
    """A CLI11 parse error (or a k3 error) that mentions one of ``flags``."""
    assert res.returncode > 0, (
        f"expected a non-zero exit, got {res.returncode}\nstderr: {res.stderr!r}"
    )
    assert any(f in res.stderr for f in flags), f"none of {flags} in stderr: {res.stderr!r}"


def generate(k3: K3Runner, model: Optional[Path], *args: str):
    base = ["generate"]
    if model is not None:
        base += ["--model", str(model)]
    return k3.run(*base, *args, timeout=TIMEOUT)


@pytest.fixture()
def tiny(checkpoints) -> Path:
    return checkpoints["k3-tiny"]


def copy_model(src: Path, dst: Path, *, config: Optional[dict] = None,
               safetensors: Optional[bytes] = None) -> Path:  # fmt: skip
    """A checkpoint dir at ``dst``: config.json (optionally replaced) next to a
    symlink to ``src``'s model.safetensors (or the given bytes)."""
    dst.mkdir(parents=True)
    if safetensors is None:
        (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    else:
        (dst / "model.safetensors").write_bytes(safetensors)
    if config is None:
        shutil.copy(src / "config.json", dst / "config.json")
    else:
        (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def sanity_run(k3: K3Runner, model: Path):
    return generate(k3, model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--json")


def test_valid_copy_runs(k3, tiny, tmp_path: Path) -> None:
    """Control for the cases below: an unmodified copy works."""
    res = sanity_run(k3, copy_model(tiny, tmp_path / "ok"))
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------
# Model directory and config.json
# --------------------------------------------------------------------------


def test_model_dir_missing(k3, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    res = sanity_run(k3, missing)
    assert_k3_error(res, str(missing))


def test_config_missing(k3, tiny, tmp_path: Path) -> None:
    d = copy_model(tiny, tmp_path / "m")
    (d / "config.json").unlink()
    assert_k3_error(sanity_run(k3, d), "config.json")


def test_safetensors_missing(k3, tiny, tmp_path: Path) -> None:
    d = copy_model(tiny, tmp_path / "m")
    (d / "model.safetensors").unlink()
    assert_k3_error(sanity_run(k3, d), "model.safetensors")


@pytest.mark.parametrize(
    "overrides, needle",
    [
        pytest.param({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads", id="heads-not-divisible"),
        pytest.param({"head_dim": 15}, "head_dim", id="odd-head-dim"),
        pytest.param({"top_k": 5}, "top_k", id="top-k-gt-n-experts"),
        pytest.param({"top_k": 0}, "top_k", id="top-k-zero"),
        pytest.param({"norm_type": "batchnorm"}, "norm_type", id="unknown-norm-type"),
        pytest.param({"expert_type": "relu"}, "expert_type", id="unknown-expert-type"),
        pytest.param({"eos_token_id": 512}, "eos_token_id", id="eos-outside-vocab"),
        pytest.param({"d_model": -64}, "d_model", id="negative-d-model"),
        pytest.param({"vocab_size": "512"}, "vocab_size", id="string-vocab-size"),
    ],
)
def test_invalid_config_values(k3, tiny, tmp_path: Path, overrides: dict, needle: str) -> None:
    config = json.loads((tiny / "config.json").read_text())
    config.update(overrides)
    d = copy_model(tiny, tmp_path / "m", config=config)
    assert_k3_error(sanity_run(k3, d), needle)


def test_config_not_json(k3, tiny, tmp_path: Path) -> None:
    d = copy_model(tiny, tmp_path / "m")
    (d / "config.json").write_text('{"vocab_size": 512,')
    assert_k3_error(sanity_run(k3, d), "config.json")


def test_config_missing_key(k3, tiny, tmp_path: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    del config["d_ff"]
    d = copy_model(tiny, tmp_path / "m", config=config)
    assert_k3_error(sanity_run(k3, d), "d_ff")


# --------------------------------------------------------------------------
# Corrupt model.safetensors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("keep", ["half", "10-bytes", "7-bytes", "header-only"])
def test_truncated_safetensors(k3, tiny, tmp_path: Path, keep: str) -> None:
    data = (tiny / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    cut = {"half": len(data) // 2, "10-bytes": 10, "7-bytes": 7, "header-only": 8 + header_len}[keep]
    d = copy_model(tiny, tmp_path / "m", safetensors=data[:cut])
    assert_k3_error(sanity_run(k3, d), "model.safetensors")


def test_header_length_larger_than_file(k3, tiny, tmp_path: Path) -> None:
    data = (tiny / "model.safetensors").read_bytes()
    bad = struct.pack("<Q", len(data) + 100) + data[8:]
    d = copy_model(tiny, tmp_path / "m", safetensors=bad)
    assert_k3_error(sanity_run(k3, d), "model.safetensors")


def test_huge_header_length(k3, tiny, tmp_path: Path) -> None:
    data = (tiny / "model.safetensors").read_bytes()
    bad = struct.pack("<Q", 2**64 - 8) + data[8:]
    d = copy_model(tiny, tmp_path / "m", safetensors=bad)
    assert_k3_error(sanity_run(k3, d), "model.safetensors")


def test_garbage_header(k3, tiny, tmp_path: Path) -> None:
    data = (tiny / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    bad = data[:8] + b"{" * header_len + data[8 + header_len :]
    d = copy_model(tiny, tmp_path / "m", safetensors=bad)
    assert_k3_error(sanity_run(k3, d), "model.safetensors")


def _rewrite(tiny: Path, edit) -> bytes:
    from safetensors.torch import load_file, save

    tensors = load_file(str(tiny / "model.safetensors"))
    edit(tensors)
    return save(tensors)


@pytest.mark.parametrize(
    "name, edit",
    [
        pytest.param(
            "layers.1.attn.wk.weight",
            lambda t: t.__setitem__("layers.1.attn.wk.weight",
                                    t["layers.1.attn.wk.weight"][:, :-1].contiguous()),
            id="wrong-shape",
        ),  # fmt: skip
        pytest.param(
            "layers.0.moe.experts.2.w_down.weight",
            lambda t: t.__setitem__("layers.0.moe.experts.2.w_down.weight",
                                    t["layers.0.moe.experts.2.w_down.weight"].t().contiguous()),
            id="transposed",
        ),  # fmt: skip
        pytest.param("output.weight", lambda t: t.pop("output.weight"), id="missing-tensor"),
        pytest.param(
            "layers.0.attn.wq.weight",
            lambda t: t.__setitem__("layers.0.attn.wq.weight",
                                    t["layers.0.attn.wq.weight"].to(__import__("torch").int32)),
            id="integer-dtype",
        ),  # fmt: skip
    ],
)
def test_bad_tensor_is_named(k3, tiny, tmp_path: Path, name: str, edit) -> None:
    d = copy_model(tiny, tmp_path / "m", safetensors=_rewrite(tiny, edit))
    assert_k3_error(sanity_run(k3, d), name)


# --------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids, needle",
    [
        pytest.param("5,512", "512", id="id-eq-vocab"),
        pytest.param("5,100000", "100000", id="id-gt-vocab"),
        pytest.param("5,-3", "-3", id="negative-id"),
        pytest.param("5,x", "x", id="non-integer"),
        pytest.param("5,1.5", "1.5", id="float"),
        pytest.param("", None, id="empty"),
        pytest.param("5,,6", None, id="empty-element"),
        pytest.param("99999999999999999999", None, id="overflow"),
    ],
)
def test_bad_prompt_ids(k3, tiny, ids: str, needle: Optional[str]) -> None:
    res = generate(k3, tiny, "--prompt-ids", ids, "--max-new-tokens", "2")
    assert_k3_error(res, *([needle] if needle else []))


def test_no_prompt(k3, tiny) -> None:
    res = generate(k3, tiny, "--max-new-tokens", "2")
    assert res.returncode > 0 and res.returncode < 128 and res.stderr.strip(), res


def test_prompt_longer_than_ctx_size(k3, tiny) -> None:
    res = generate(k3, tiny, "-c", "8", "--prompt-ids", ",".join(["1"] * 9), "-n", "2")
    assert_k3_error(res)


def test_prompt_longer_than_max_seq_len(k3, tiny) -> None:
    # k3-tiny has max_seq_len 256.
    res = generate(k3, tiny, "--prompt-ids", ",".join(["7"] * 257), "-n", "2")
    assert_k3_error(res, "257")


def test_ctx_size_above_max_seq_len(k3, tiny) -> None:
    res = generate(k3, tiny, "-c", "100000", "--prompt-ids", "1,2", "-n", "2")
    assert_k3_error(res)


def test_prompt_ids_file_missing(k3, tiny, tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    res = generate(k3, tiny, "--prompt-ids-file", str(missing), "-n", "2")
    assert res.returncode > 0 and res.returncode < 128, res
    assert str(missing) in res.stderr


def test_prompt_ids_file_bad_line(k3, tiny, tmp_path: Path) -> None:
    f = tmp_path / "prompts.txt"
    f.write_text("1,2,3\n4,oops\n")
    res = generate(k3, tiny, "--prompt-ids-file", str(f), "-n", "2")
    assert_k3_error(res, "oops")


# --------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, flags",
    [
        pytest.param(["--top-p", "0"], ["--top-p"], id="top-p-0"),
        pytest.param(["--top-p", "1.5"], ["--top-p"], id="top-p-1.5"),
        pytest.param(["--top-p", "-0.5"], ["--top-p"], id="top-p-negative"),
        pytest.param(["--temperature", "-1"], ["--temperature", "--temp"], id="temperature-neg"),
        pytest.param(["--threads", "-1"], ["--threads"], id="threads-neg"),
        pytest.param(["--max-new-tokens", "-5"], ["--max-new-tokens"], id="max-new-neg"),
        pytest.param(["--top-k", "-1"], ["--top-k"], id="top-k-neg"),
        pytest.param(["--isa", "neon"], ["--isa"], id="unknown-isa"),
        pytest.param(["--prefetch", "l3"], ["--prefetch"], id="unknown-prefetch"),
        pytest.param(["--isa", "scalar", "--prefetch", "l1"], ["--prefetch"], id="prefetch-without-a-choice"),
        pytest.param(["--ctx-size", "-4"], ["--ctx-size"], id="ctx-neg"),
        pytest.param(["--prefill-chunk", "0"], ["--prefill-chunk"], id="prefill-chunk-0"),
        pytest.param(["--max-new-tokens", "ten"], ["--max-new-tokens"], id="max-new-text"),
        pytest.param(["--no-such-flag"], ["--no-such-flag"], id="unknown-flag"),
    ],
)
def test_bad_flag_values(k3, tiny, args: list[str], flags: list[str]) -> None:
    res = generate(k3, tiny, "--prompt-ids", "1,2", "-n", "2", *args)
    if res.stderr.startswith("k3: error:"):
        assert_k3_error(res)
    assert_usage_error(res, flags)
    assert res.returncode < 128


@pytest.mark.parametrize(
    "args, needle",
    [
        pytest.param(["--cpus", "x"], "'x'", id="cpus-text"),
        pytest.param(["--cpus", "1-0"], "'1-0'", id="cpus-reversed-range"),
        pytest.param(["--cpus", "0,"], "''", id="cpus-empty-entry"),
        pytest.param(["--cpus", "99999"], "CPU 99999", id="cpus-not-allowed"),
        pytest.param(["--cpus", "0,0"], "twice", id="cpus-twice"),
        pytest.param(["--cpus", "0", "--threads", "2"], "one CPU per thread", id="cpus-vs-threads"),
    ],
)
def test_bad_cpus(k3, tiny, args: list[str], needle: str) -> None:
    res = generate(k3, tiny, "--prompt-ids", "1,2", "-n", "2", *args)
    assert_k3_error(res, "--cpus", needle)


def test_dump_logits_with_two_prompts(k3, tiny, tmp_path: Path) -> None:
    dump = tmp_path / "x.npy"
    res = generate(k3, tiny, "--prompt-ids", "1", "--prompt-ids", "2", "-n", "2",
                   "--dump-logits", str(dump))  # fmt: skip
    assert_k3_error(res, "--dump-logits")
    assert not dump.exists()


def test_dump_logits_unwritable(k3, tiny, tmp_path: Path) -> None:
    dump = tmp_path / "no-such-dir" / "x.npy"
    res = generate(k3, tiny, "--prompt-ids", "1", "-n", "2", "--dump-logits", str(dump))
    assert_k3_error(res, str(dump))


def test_missing_model_flag(k3) -> None:
    res = generate(k3, None, "--prompt-ids", "1", "-n", "2")
    assert_usage_error(res, ["--model"])
    assert res.returncode < 128


def test_unknown_subcommand(k3) -> None:
    res = k3.run("frobnicate", timeout=TIMEOUT)
    assert res.returncode > 0 and res.returncode < 128
    assert "frobnicate" in res.stderr or "subcommand" in res.stderr.lower(), res.stderr


def test_no_subcommand(k3) -> None:
    res = k3.run(timeout=TIMEOUT)
    assert res.returncode > 0 and res.returncode < 128
    assert "subcommand" in res.stderr.lower(), res.stderr


# --------------------------------------------------------------------------
# init-model
# --------------------------------------------------------------------------


def test_init_model_unknown_preset(k3, tmp_path: Path) -> None:
    out = tmp_path / "m"
    res = k3.run("init-model", "--preset", "k3-huge", "--seed", "1", "--out", out, timeout=TIMEOUT)
    assert_k3_error(res, "k3-huge")
    assert not (out / "model.safetensors").exists()


def test_init_model_preset_and_config(k3, tiny, tmp_path: Path) -> None:
    res = k3.run("init-model", "--preset", "k3-tiny", "--config", tiny / "config.json",
                 "--seed", "1", "--out", tmp_path / "m", timeout=TIMEOUT)  # fmt: skip
    assert_k3_error(res, "--preset", "--config")


def test_init_model_neither_preset_nor_config(k3, tmp_path: Path) -> None:
    res = k3.run("init-model", "--seed", "1", "--out", tmp_path / "m", timeout=TIMEOUT)
    assert_k3_error(res, "--preset", "--config")


def test_init_model_invalid_config(k3, tiny, tmp_path: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    config["head_dim"] = 15
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(config))
    res = k3.run("init-model", "--config", cfg, "--seed", "1", "--out", tmp_path / "m",
                 timeout=TIMEOUT)  # fmt: skip
    assert_k3_error(res, "head_dim")


def test_init_model_bad_dtype(k3, tmp_path: Path) -> None:
    res = k3.run("init-model", "--preset", "k3-tiny", "--seed", "1", "--out", tmp_path / "m",
                 "--dtype", "f8", timeout=TIMEOUT)  # fmt: skip
    assert_usage_error(res, ["--dtype"])
    assert res.returncode < 128


def test_init_model_from_config_matches_preset(k3, tiny, tmp_path: Path) -> None:
    """--config with the preset's own config.json writes the same bytes."""
    res = k3.run("init-model", "--config", tiny / "config.json", "--seed", "7",
                 "--out", tmp_path / "m", timeout=TIMEOUT)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == (
        tiny / "model.safetensors"
    ).read_bytes()


# --------------------------------------------------------------------------
# Help
# --------------------------------------------------------------------------

GENERATE_FLAGS = [
    "--model", "--prompt-ids", "--prompt-ids-file", "--max-new-tokens", "--temperature",
    "--top-k", "--top-p", "--seed", "--threads", "--json", "--dump-logits", "--reference",
    "--isa", "--prefetch", "--ctx-size", "--prefill-chunk",
]  # fmt: skip
INIT_MODEL_FLAGS = ["--preset", "--config", "--seed", "--out", "--dtype"]


def test_top_level_help(k3) -> None:
    res = k3.run("--help", timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    for word in ("init-model", "generate", "--help"):
        assert word in res.stdout, word


def test_generate_help(k3) -> None:
    res = k3.run("generate", "--help", timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    missing = [f for f in GENERATE_FLAGS if f not in res.stdout]
    assert not missing, f"generate --help does not mention {missing}"
    for short in ("-c,", "-m,", "-n,", "-s,", "-t,"):
        assert short in res.stdout, short


def test_init_model_help(k3, tmp_path: Path) -> None:
    res = k3.run("init-model", "--help", timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    missing = [f for f in INIT_MODEL_FLAGS if f not in res.stdout]
    assert not missing, f"init-model --help does not mention {missing}"
    # Every preset init-model accepts (its unknown-preset error lists the
    # preset table) is named in the help.
    err = k3.run("init-model", "--preset", "no-such", "--seed", "1", "--out", tmp_path / "m", timeout=TIMEOUT)
    known = re.search(r"\(known: ([^)]*)\)", err.stderr)
    assert known, err.stderr
    presets = [p.strip() for p in known.group(1).split(",")]
    assert {"k3-tiny", "k3-base", "moe-swiglu-base"} <= set(presets), presets
    missing = [p for p in presets if p not in res.stdout]
    assert not missing, f"init-model --help does not name the presets {missing}"
