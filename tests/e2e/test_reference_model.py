"""Self-tests of the PyTorch reference model (python/k3ref).

The reference is the oracle the C++ engine is checked against, so it is
checked here on its own: KV-cache decoding vs full forward, by-index MoE
dispatch vs a dense masked loop, rotary relative-position property, config
and checkpoint validation, BF16/F16 loading, GQA and both norm/expert types,
top-k tie-breaking, an independent float64 per-token implementation of the
spec, and the ``k3ref.generate`` command line.

Run from the repository root: ``python3 -m pytest tests/e2e/test_reference_model.py``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

_REPO = Path(__file__).resolve().parents[2]
_PYTHON_DIR = _REPO / "python"
for _p in (str(_PYTHON_DIR), str(Path(__file__).resolve().parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from k3ref import CheckpointError, ConfigError, K3Config, K3Model, load_checkpoint  # noqa: E402
from k3ref.generate import greedy_generate  # noqa: E402
from k3ref.model import apply_rotary, rotary_cos_sin, top_k_route  # noqa: E402
from make_tiny_checkpoint import (  # noqa: E402
    random_tensors,
    tiny_config,
    write_checkpoint,
    write_random_checkpoint,
)

VARIANTS = [
    pytest.param({"norm_type": "layernorm", "expert_type": "gelu"}, id="layernorm-gelu"),
    pytest.param({"norm_type": "rmsnorm", "expert_type": "swiglu"}, id="rmsnorm-swiglu"),
]


def make_model(seed: int = 0, **overrides: Any) -> K3Model:
    config_dict = tiny_config(**overrides)
    return K3Model(K3Config.from_dict(config_dict), random_tensors(config_dict, seed))


def random_tokens(model: K3Model, batch: int, seq: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen)


# --------------------------------------------------------------------------
# (a) incremental decoding with the KV cache == full forward
# --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunks", [[5, 1, 1, 1, 1, 1, 1, 1], [1] * 12, [4, 3, 5]])
def test_kv_cache_matches_full_forward(variant: dict[str, Any], chunks: list[int]) -> None:
    model = make_model(seed=1, **variant)
    tokens = random_tokens(model, batch=2, seq=sum(chunks), seed=2)
    full_logits, full_kv = model(tokens, None, 0)

    pieces = []
    cache = None
    pos = 0
    for n in chunks:
        logits, cache = model(tokens[:, pos : pos + n], cache, pos)
        pieces.append(logits)
        pos += n
    incremental = torch.cat(pieces, dim=1)

    assert incremental.shape == (2, sum(chunks), model.config.vocab_size)
    torch.testing.assert_close(incremental, full_logits, atol=1e-4, rtol=1e-4)
    for (k_inc, v_inc), (k_full, v_full) in zip(cache, full_kv):
        torch.testing.assert_close(k_inc, k_full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v_inc, v_full, atol=1e-5, rtol=1e-5)


def test_forward_rejects_inconsistent_start_pos_and_overlong_sequence() -> None:
    model = make_model(max_seq_len=8)
    tokens = random_tokens(model, 1, 4, seed=0)
    _, cache = model(tokens, None, 0)
    with pytest.raises(ValueError, match="start_pos"):
        model(tokens[:, :1], cache, 3)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(random_tokens(model, 1, 9, seed=0), None, 0)
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[64]]), None, 0)


# --------------------------------------------------------------------------
# (b) by-index MoE dispatch == dense loop over every expert with a mask
# --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_moe_dispatch_matches_dense_masked_loop(variant: dict[str, Any], top_k: int) -> None:
    model = make_model(seed=3, top_k=top_k, **variant)
    moe = model.layers[1].moe
    n_experts = model.config.n_experts
    gen = torch.Generator().manual_seed(4)
    m = torch.randn(3, 7, model.config.d_model, generator=gen)

    dispatched = moe(m)

    # Dense reference: every expert on every token, masked by routing weights
    # chosen with an explicit Python sort (descending logit, then lower index).
    flat = m.reshape(-1, m.shape[-1])
    gate_logits = flat @ moe.gate.weight.t()
    mask = torch.zeros(flat.shape[0], n_experts)
    for t in range(flat.shape[0]):
        row = gate_logits[t].tolist()
        chosen = sorted(range(n_experts), key=lambda e: (-row[e], e))[:top_k]
        w = torch.softmax(torch.tensor([row[e] for e in chosen]), dim=0)
        for e, weight in zip(chosen, w):
            mask[t, e] = weight
    dense = torch.zeros_like(flat)
    for e in range(n_experts):
        dense += mask[:, e : e + 1] * moe.experts[e](flat)

    torch.testing.assert_close(dispatched, dense.view_as(m), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------
# (c) rotary embedding
# --------------------------------------------------------------------------


def _rotate(vec: torch.Tensor, pos: int, theta: float = 10000.0) -> torch.Tensor:
    cos, sin = rotary_cos_sin(torch.tensor([pos]), vec.shape[-1], theta)
    return apply_rotary(vec[None, :], cos, sin)[0]


@pytest.mark.parametrize("p", [3, 10, 200, 1000])
def test_rotary_scores_depend_only_on_relative_position(p: int) -> None:
    head_dim = 16
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(head_dim, generator=gen)
    k = torch.randn(head_dim, generator=gen)
    score_a = torch.dot(_rotate(q, p), _rotate(k, p - 3))
    score_b = torch.dot(_rotate(q, p + 5), _rotate(k, p + 2))
    torch.testing.assert_close(score_a, score_b, atol=1e-4, rtol=1e-4)
    # ...and a different relative offset gives a different score.
    score_c = torch.dot(_rotate(q, p), _rotate(k, p - 4))
    assert not torch.allclose(score_a, score_c, atol=1e-3)


def test_rotary_matches_rotate_half_formula() -> None:
    head_dim, pos, theta = 8, 7, 500.0
    half = head_dim // 2
    u = torch.arange(1.0, head_dim + 1.0)
    got = _rotate(u, pos, theta)
    for i in range(half):
        angle = pos * theta ** (-2.0 * i / head_dim)
        c, s = math.cos(angle), math.sin(angle)
        assert got[i].item() == pytest.approx(u[i].item() * c - u[i + half].item() * s, abs=1e-5)
        assert got[i + half].item() == pytest.approx(
            u[i + half].item() * c + u[i].item() * s, abs=1e-5
        )


# --------------------------------------------------------------------------
# (d) config and checkpoint validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_heads": 4, "n_kv_heads": 3}, "divisible by n_kv_heads"),
        ({"head_dim": 7}, "head_dim must be even"),
        ({"top_k": 5, "n_experts": 4}, "top_k"),
        ({"top_k": 0}, "top_k"),
        ({"norm_type": "batchnorm"}, "norm_type"),
        ({"expert_type": "relu"}, "expert_type"),
        ({"architecture": "llama"}, "architecture"),
        ({"d_model": 0}, "d_model must be a positive integer"),
        ({"vocab_size": 64.5}, "vocab_size must be a positive integer"),
        ({"norm_eps": -1.0}, "norm_eps"),
        ({"eos_token_id": 64}, "eos_token_id"),
    ],
)
def test_config_validation_rejects(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        K3Config.from_dict(tiny_config(**overrides))


def test_config_missing_key_and_defaults(tmp_path: Path) -> None:
    config = tiny_config()
    del config["d_ff"]
    with pytest.raises(ConfigError, match="d_ff"):
        K3Config.from_dict(config)

    minimal = tiny_config()
    for key in ("rope_theta", "norm_eps", "norm_type", "expert_type", "eos_token_id"):
        del minimal[key]
    cfg = K3Config.from_dict(minimal)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.norm_type, cfg.expert_type, cfg.eos_token_id) == (
        10000.0,
        1e-5,
        "layernorm",
        "gelu",
        None,
    )


def test_checkpoint_rejects_missing_tensor(tmp_path: Path) -> None:
    config = tiny_config()
    tensors = random_tensors(config, seed=0)
    del tensors["layers.1.attn.wk.weight"]
    write_checkpoint(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match=r"missing .*layers\.1\.attn\.wk\.weight"):
        load_checkpoint(tmp_path)


def test_checkpoint_rejects_wrong_shape(tmp_path: Path) -> None:
    config = tiny_config()
    tensors = random_tensors(config, seed=0)
    tensors["layers.0.moe.experts.2.w_down.weight"] = torch.zeros(32, 47)
    write_checkpoint(tmp_path, config, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"layers\.0\.moe\.experts\.2\.w_down\.weight has shape \[32, 47\], expected \[32, 48\]",
    ):
        load_checkpoint(tmp_path)


def test_checkpoint_rejects_unexpected_tensor(tmp_path: Path) -> None:
    # An rmsnorm checkpoint must not carry norm biases.
    config = tiny_config(norm_type="rmsnorm")
    tensors = random_tensors(config, seed=0)
    tensors["norm.bias"] = torch.zeros(32)
    write_checkpoint(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match=r"unexpected .*norm\.bias"):
        load_checkpoint(tmp_path)


# --------------------------------------------------------------------------
# (e) half-precision checkpoints are upcast to fp32
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_checkpoint_matches_fp32_of_same_rounded_weights(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    config = tiny_config()
    half = write_random_checkpoint(tmp_path / "half", config, seed=6, dtype=dtype)
    write_checkpoint(tmp_path / "fp32", config, {k: v.float() for k, v in half.items()})

    cfg, half_loaded = load_checkpoint(tmp_path / "half")
    assert all(t.dtype == torch.float32 for t in half_loaded.values())
    model_half = K3Model(cfg, half_loaded)
    model_fp32 = K3Model.from_pretrained(tmp_path / "fp32")

    tokens = random_tokens(model_fp32, 2, 9, seed=7)
    logits_half, _ = model_half(tokens, None, 0)
    logits_fp32, _ = model_fp32(tokens, None, 0)
    assert torch.equal(logits_half, logits_fp32)


# --------------------------------------------------------------------------
# (f) GQA and both norm / expert types
# --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_variants_run(tmp_path: Path, variant: dict[str, Any], n_kv_heads: int) -> None:
    config = tiny_config(n_kv_heads=n_kv_heads, **variant)
    write_random_checkpoint(tmp_path, config, seed=8)
    model = K3Model.from_pretrained(tmp_path)
    tokens = random_tokens(model, 2, 6, seed=9)
    logits, cache = model(tokens, None, 0)
    assert logits.shape == (2, 6, 64) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert len(cache) == 2 and cache[0][0].shape == (2, n_kv_heads, 6, 8)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gqa_equals_mha_with_duplicated_kv_heads(variant: dict[str, Any]) -> None:
    n_heads, n_kv, hd, d = 4, 2, 8, 32
    gqa_config = tiny_config(n_heads=n_heads, n_kv_heads=n_kv, **variant)
    gqa_tensors = random_tensors(gqa_config, seed=10)
    mha_config = tiny_config(n_heads=n_heads, n_kv_heads=n_heads, **variant)
    mha_tensors = dict(gqa_tensors)
    for layer in range(gqa_config["n_layers"]):
        for w in ("wk", "wv"):
            name = f"layers.{layer}.attn.{w}.weight"
            heads = gqa_tensors[name].view(n_kv, hd, d)
            mha_tensors[name] = heads.repeat_interleave(n_heads // n_kv, dim=0).reshape(-1, d)
    gqa = K3Model(K3Config.from_dict(gqa_config), gqa_tensors)
    mha = K3Model(K3Config.from_dict(mha_config), mha_tensors)
    tokens = random_tokens(gqa, 1, 10, seed=11)
    torch.testing.assert_close(gqa(tokens)[0], mha(tokens)[0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------
# (g) top-k tie-breaking: lower expert index wins
# --------------------------------------------------------------------------


def test_top_k_route_ties_prefer_lower_index() -> None:
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.5], [3.0, 3.0, 3.0, 3.0], [0.0, 1.0, 0.0, 1.0]])
    idx1, w1 = top_k_route(logits, 1)
    assert idx1.tolist() == [[1], [0], [1]]
    assert torch.equal(w1, torch.ones(3, 1))
    idx2, w2 = top_k_route(logits, 2)
    assert idx2.tolist() == [[1, 2], [0, 1], [1, 3]]
    torch.testing.assert_close(w2, torch.full((3, 2), 0.5))
    idx3, _ = top_k_route(logits, 3)
    assert idx3.tolist() == [[1, 2, 0], [0, 1, 2], [1, 3, 0]]


def test_moe_tie_routes_to_lower_expert() -> None:
    model = make_model(seed=12, top_k=1)
    moe = model.layers[0].moe
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(model.config.d_model, generator=gen)
    # Experts 1 and 2 share a gate row (equal logits); 0 and 3 get -w.
    moe.gate.weight.copy_(torch.stack([-w, w, w, -w]))
    m = torch.randn(16, model.config.d_model, generator=gen)
    m = m * torch.sign(m @ w).unsqueeze(-1)  # make w . m > 0 so experts 1, 2 lead
    out = moe(m)
    torch.testing.assert_close(out, moe.experts[1](m))
    assert not torch.allclose(out, moe.experts[2](m))


# --------------------------------------------------------------------------
# Independent float64 per-token implementation of the spec
# --------------------------------------------------------------------------


def _naive_logits(cfg: K3Config, t: dict[str, torch.Tensor], tokens: list[int]) -> np.ndarray:
    """Literal, loop-based float64 transcription of the K3 math (one sequence)."""
    W = {k: v.double().numpy() for k, v in t.items()}
    hd, half = cfg.head_dim, cfg.head_dim // 2
    group = cfg.n_heads // cfg.n_kv_heads

    def norm(x: np.ndarray, prefix: str) -> np.ndarray:
        if cfg.norm_type == "layernorm":
            mu = x.mean()
            var = ((x - mu) ** 2).mean()
            return (x - mu) / math.sqrt(var + cfg.norm_eps) * W[f"{prefix}.weight"] + W[
                f"{prefix}.bias"
            ]
        return x / math.sqrt((x * x).mean() + cfg.norm_eps) * W[f"{prefix}.weight"]

    def rope(u: np.ndarray, p: int) -> np.ndarray:
        out = u.copy()
        for i in range(half):
            ang = p * cfg.rope_theta ** (-2.0 * i / hd)
            c, s = math.cos(ang), math.sin(ang)
            out[i] = u[i] * c - u[i + half] * s
            out[i + half] = u[i + half] * c + u[i] * s
        return out

    def gelu(x: np.ndarray) -> np.ndarray:
        return np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])

    keys: list[list[list[np.ndarray]]] = [[] for _ in range(cfg.n_layers)]
    values: list[list[list[np.ndarray]]] = [[] for _ in range(cfg.n_layers)]
    all_logits = []
    for p, tok in enumerate(tokens):
        h = W["tok_embeddings.weight"][tok].copy()
        for l in range(cfg.n_layers):
            pre = f"layers.{l}"
            a = norm(h, f"{pre}.attn_norm")
            q = W[f"{pre}.attn.wq.weight"] @ a
            k = W[f"{pre}.attn.wk.weight"] @ a
            v = W[f"{pre}.attn.wv.weight"] @ a
            keys[l].append([rope(k[j * hd : (j + 1) * hd], p) for j in range(cfg.n_kv_heads)])
            values[l].append([v[j * hd : (j + 1) * hd] for j in range(cfg.n_kv_heads)])
            heads = []
            for j in range(cfg.n_heads):
                qj = rope(q[j * hd : (j + 1) * hd], p)
                kv = j // group
                scores = np.array([qj @ keys[l][s][kv] for s in range(p + 1)]) / math.sqrt(hd)
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                heads.append(sum(probs[s] * values[l][s][kv] for s in range(p + 1)))
            h = h + W[f"{pre}.attn.wo.weight"] @ np.concatenate(heads)

            m = norm(h, f"{pre}.moe_norm")
            g = W[f"{pre}.moe.gate.weight"] @ m
            chosen = sorted(range(cfg.n_experts), key=lambda e: (-g[e], e))[: cfg.top_k]
            cg = np.array([g[e] for e in chosen])
            weights = np.exp(cg - cg.max())
            weights /= weights.sum()
            y = np.zeros_like(h)
            for e, we in zip(chosen, weights):
                ex = f"{pre}.moe.experts.{e}"
                up = W[f"{ex}.w_up.weight"] @ m
                if cfg.expert_type == "swiglu":
                    gate = W[f"{ex}.w_gate.weight"] @ m
                    act = gate / (1.0 + np.exp(-gate)) * up
                else:
                    act = gelu(up)
                y += we * (W[f"{ex}.w_down.weight"] @ act)
            h = h + y
        all_logits.append(W["output.weight"] @ norm(h, "norm"))
    return np.stack(all_logits)


@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_naive_float64_transcription(variant: dict[str, Any]) -> None:
    config_dict = tiny_config(rope_theta=500.0, **variant)
    tensors = random_tensors(config_dict, seed=14)
    cfg = K3Config.from_dict(config_dict)
    model = K3Model(cfg, tensors)
    tokens = [3, 17, 42, 5, 63, 0, 17]
    logits, _ = model(torch.tensor([tokens]), None, 0)
    expected = _naive_logits(cfg, tensors, tokens)
    np.testing.assert_allclose(logits[0].double().numpy(), expected, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------
# Greedy generation and the command line
# --------------------------------------------------------------------------


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(_PYTHON_DIR))
    return subprocess.run(
        [sys.executable, "-m", "k3ref.generate", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        check=False,
    )


def test_greedy_generate_matches_full_forward_argmax() -> None:
    model = make_model(seed=15)
    prompt = [5, 17, 42]
    generated, step_logits = greedy_generate(model, prompt, 6)
    assert len(generated) == 6 and step_logits.shape == (6, 64)
    full, _ = model(torch.tensor([prompt + generated]), None, 0)
    expected_steps = full[0, len(prompt) - 1 : len(prompt) - 1 + 6]
    torch.testing.assert_close(step_logits, expected_steps, atol=1e-4, rtol=1e-4)
    assert generated == expected_steps.argmax(dim=-1).tolist()


def test_generate_stops_at_max_seq_len() -> None:
    model = make_model(seed=15, max_seq_len=8)
    generated, logits = greedy_generate(model, [1, 2, 3, 4, 5], 10)
    assert len(generated) == 3 and logits.shape == (3, 64)
    generated, logits = greedy_generate(model, list(range(8)), 10)
    assert generated == [] and logits.shape == (0, 64)
    with pytest.raises(ValueError, match="max_seq_len"):
        greedy_generate(model, list(range(9)), 1)


def test_cli_json_eos_and_dump_logits(tmp_path: Path) -> None:
    config = tiny_config()
    write_random_checkpoint(tmp_path / "model", config, seed=16)

    res = _run_cli(
        "--model", str(tmp_path / "model"),
        "--prompt-ids", "5,17,42", "--prompt-ids", "1",
        "--max-new-tokens", "5", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert list(out) == ["generated_ids"]
    first, second = out["generated_ids"]
    assert len(first) == 5 and len(second) == 5

    model = K3Model.from_pretrained(tmp_path / "model")
    assert first == greedy_generate(model, [5, 17, 42], 5)[0]

    # With eos = the 3rd generated token, decoding stops right after emitting it.
    eos = first[2]
    write_random_checkpoint(tmp_path / "eos", dict(config, eos_token_id=eos), seed=16)
    dump = tmp_path / "logits.npy"
    res = _run_cli(
        "--model", str(tmp_path / "eos"), "--prompt-ids", "5,17,42",
        "--max-new-tokens", "5", "--json", "--dump-logits", str(dump),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    expected = first[: first.index(eos) + 1]
    assert json.loads(res.stdout) == {"generated_ids": [expected]}
    arr = np.load(dump)
    assert arr.dtype == np.float32 and arr.shape == (1, len(expected), 64)
    assert arr[0].argmax(axis=-1).tolist() == expected

    # Plain output: one comma-separated line per prompt.
    res = _run_cli("--model", str(tmp_path / "model"), "--prompt-ids", "5,17,42",
                   "--max-new-tokens", "5")  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == ",".join(map(str, first))

    # --dump-logits needs exactly one prompt.
    res = _run_cli(
        "--model", str(tmp_path / "model"), "--prompt-ids", "1", "--prompt-ids", "2",
        "--max-new-tokens", "2", "--dump-logits", str(dump),
    )  # fmt: skip
    assert res.returncode != 0 and "exactly one" in res.stderr


def test_cli_reports_bad_checkpoint(tmp_path: Path) -> None:
    config = tiny_config()
    tensors = random_tensors(config, seed=0)
    del tensors["output.weight"]
    write_checkpoint(tmp_path, config, tensors)
    res = _run_cli("--model", str(tmp_path), "--prompt-ids", "1", "--max-new-tokens", "1")
    assert res.returncode == 1 and "output.weight" in res.stderr
