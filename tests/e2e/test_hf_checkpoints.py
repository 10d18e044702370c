"""Hugging Face checkpoints: tiny random models of each supported family,
built locally with PyPI transformers and saved with save_pretrained, run by
``k3 generate`` with the greedy tokens of transformers and its logits within
1e-4 at every generated position. Unsupported configurations fail with one
line naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from k3_e2e import K3Runner
from test_cli_errors import assert_k3_error

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

PROMPT = [5, 17, 42, 99, 3, 64]
STEPS = 8
COMMON = dict(
    vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
)


def build(kind: str, path: Path, **overrides) -> Path:
    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(**{**COMMON, "num_local_experts": 4, "num_experts_per_tok": 2, **overrides})
        model = transformers.MixtralForCausalLM(cfg)
    elif kind == "llama":
        cfg = transformers.LlamaConfig(**{**COMMON, **overrides})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.MistralConfig(**{**COMMON, **overrides})
        model = transformers.MistralForCausalLM(cfg)
    # Random init at std 0.02 gives near-uniform logits; widen so greedy
    # choices are well separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.eval().save_pretrained(path)
    return path


def hf_greedy(path: Path) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and the logits that chose each."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = list(PROMPT)
    rows = []
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            rows.append(logits.numpy())
            ids.append(int(logits.argmax()))
    return ids[len(PROMPT):], np.stack(rows)


CASES = {
    "mixtral": ("mixtral", {}),
    "mixtral-top1": ("mixtral", {"num_experts_per_tok": 1}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-untied": ("llama", {"tie_word_embeddings": False, "head_dim": 32}),
    "mistral-window": ("mistral", {"sliding_window": 64}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hf_family_matches_transformers(k3: K3Runner, tmp_path, case):
    kind, overrides = CASES[case]
    path = build(kind, tmp_path / case, **overrides)
    want_ids, want_logits = hf_greedy(path)
    dump = tmp_path / "logits.npy"
    got = k3.generate_ids(path, [PROMPT], max_new_tokens=STEPS, temperature=0)
    assert got == [want_ids]
    res = k3.run("generate", "--model", path, "--prompt-ids", ",".join(map(str, PROMPT)), "-n", STEPS,
                 "--temp", 0, "--dump-logits", dump)
    assert res.returncode == 0, res.stderr
    np.testing.assert_allclose(np.load(dump)[0], want_logits, rtol=1e-4, atol=1e-4)
    # The compiled form runs the same.
    out = tmp_path / "m.k3m"
    assert k3.run("compile", path, "--out", out).returncode == 0
    assert k3.generate_ids(out, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids]


def test_sliding_window_caps_the_context(k3: K3Runner, tmp_path):
    path = build("mistral", tmp_path / "m", sliding_window=16)
    res = k3.run("generate", "--model", path, "--prompt-ids", ",".join(["1"] * 20), "-n", 2)
    assert_k3_error(res, "16")


@pytest.mark.parametrize(
    "edit, needle",
    [
        ({"model_type": "qwen2_moe"}, "qwen2_moe"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}, "llama3"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unsupported_configs_are_named(k3: K3Runner, tmp_path, edit, needle):
    path = build("llama", tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(edit)
    (path / "config.json").write_text(json.dumps(cfg))
    assert_k3_error(k3.run("generate", "--model", path, "--prompt-ids", "1,2", "-n", 1), needle)


def test_unexpected_tensor_is_named(k3: K3Runner, tmp_path):
    """A family/config mismatch (here: an untied config over a tied file) is an error, not a guess."""
    path = build("llama", tmp_path / "m", tie_word_embeddings=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(cfg))
    assert_k3_error(k3.run("generate", "--model", path, "--prompt-ids", "1,2", "-n", 1), "lm_head.weight")
