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


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
# kind -> (config class, model class, defaults over COMMON). eos_token_id is
# cleared where a family's default lies outside the tiny vocabulary.
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", MOE),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**MOE, "shared_expert_intermediate_size": 80}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": None,
                                                  "pad_token_id": None}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "eos_token_id": None, "bos_token_id": None,
        "embedding_multiplier": 3.0, "residual_multiplier": 0.6, "attention_multiplier": 0.2, "logits_scaling": 2.5}),
}


def build(kind: str, path: Path, shard: str | None = None, fused: bool = False, **overrides) -> Path:
    torch.manual_seed(0)
    cfg_cls, model_cls, defaults = FAMILIES[kind]
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **defaults, **overrides})
    model = getattr(transformers, model_cls)(cfg)
    # Random init at std 0.02 gives near-uniform logits; widen so greedy
    # choices are well separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
        # Norm weights start at 1 and biases at 0, which would leave those
        # code paths untested; randomize them too.
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
    # fused: the experts as transformers 5 holds them (3-D gate_up_proj and
    # down_proj) instead of the per-expert tensors it saves by default.
    kwargs = {**({"max_shard_size": shard} if shard else {}), **({"save_original_format": False} if fused else {})}
    model.eval().save_pretrained(path, **kwargs)
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
    "llama-attention-bias": ("llama", {"attention_bias": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2-untied": ("qwen2", {"tie_word_embeddings": False}),
    "qwen3": ("qwen3", {"head_dim": 32}),
    "qwen3-tied-bias": ("qwen3", {"tie_word_embeddings": True, "attention_bias": True}),
    "qwen3_moe-norm": ("qwen3_moe", {"norm_topk_prob": True}),
    "qwen3_moe-nonorm-dense0": ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [0]}),
    "qwen3_moe-step2": ("qwen3_moe", {"norm_topk_prob": True, "decoder_sparse_step": 2, "num_hidden_layers": 3}),
    "qwen2_moe-norm": ("qwen2_moe", {"norm_topk_prob": True}),
    "qwen2_moe-nonorm-dense0": ("qwen2_moe", {"norm_topk_prob": False, "mlp_only_layers": [0], "tie_word_embeddings": True}),
    "qwen2_moe-step2": ("qwen2_moe", {"decoder_sparse_step": 2, "num_hidden_layers": 3}),
    "olmoe": ("olmoe", {}),
    "olmoe-norm-clip": ("olmoe", {"norm_topk_prob": True, "clip_qkv": 0.8}),
    "granitemoe": ("granitemoe", {}),
    "granitemoe-tied-top1": ("granitemoe", {"tie_word_embeddings": True, "num_experts_per_tok": 1}),
    # RoPE scaling, with scales and original contexts small enough to change
    # the tiny model's tables at the positions generated here.
    "llama-rope-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    "llama-rope-llama3": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "qwen3-rope-yarn": ("qwen3", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}}),
    "qwen2-rope-yarn-attention-factor": ("qwen2", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 64,
        "attention_factor": 1.3, "beta_fast": 16.0, "beta_slow": 2.0}}),
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


FUSED_CASES = ["mixtral", "qwen3_moe-step2", "qwen2_moe-nonorm-dense0", "olmoe"]


@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_expert_layout_matches_transformers(k3: K3Runner, tmp_path, case):
    """Experts stored fused (mlp.experts.gate_up_proj [E, 2F, D], down_proj
    [E, D, F]) load as slices: the same tokens and logits as transformers,
    dense layers of sparse-step models included."""
    kind, overrides = CASES[case]
    path = build(kind, tmp_path / case, fused=True, **overrides)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "np") as f:
        names = list(f.keys())
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in names), names[:8]
    assert not any(".experts.0." in n for n in names)
    want_ids, want_logits = hf_greedy(path)
    dump = tmp_path / "logits.npy"
    res = k3.run("generate", "--model", path, "--prompt-ids", ",".join(map(str, PROMPT)), "-n", STEPS,
                 "--temp", 0, "--dump-logits", dump, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["generated_ids"] == [want_ids]
    np.testing.assert_allclose(np.load(dump)[0], want_logits, rtol=1e-4, atol=1e-4)


def test_sharded_checkpoint_matches_transformers(k3: K3Runner, tmp_path):
    """save_pretrained's shards + model.safetensors.index.json load like one file."""
    path = build("qwen2_moe", tmp_path / "m", shard="60KB", norm_topk_prob=True)
    assert (path / "model.safetensors.index.json").exists() and not (path / "model.safetensors").exists()
    assert len(list(path.glob("model-*.safetensors"))) > 1
    want_ids, _ = hf_greedy(path)
    assert k3.generate_ids(path, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids]
    out = tmp_path / "m.k3m"
    assert k3.run("compile", path, "--out", out).returncode == 0
    assert k3.generate_ids(out, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids]


def test_rope_scaling_4x_config_form(k3: K3Runner, tmp_path):
    """transformers 4.x writes rope_theta + rope_scaling {type, ...}: the same model."""
    path = build("llama", tmp_path / "m", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    want_ids, _ = hf_greedy(path)
    cfg = json.loads((path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    cfg["rope_scaling"] = params
    (path / "config.json").write_text(json.dumps(cfg))
    assert k3.generate_ids(path, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids]


def test_eos_list_stops_on_any(k3: K3Runner, tmp_path):
    """Every id of an eos_token_id list ends generation (from the directory and from a .k3m)."""
    path = build("qwen2", tmp_path / "m")
    want_ids, _ = hf_greedy(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = [159, want_ids[2]]
    (path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "m.k3m"
    assert k3.run("compile", path, "--out", out).returncode == 0
    stop = next(i for i, t in enumerate(want_ids) if t in cfg["eos_token_id"])
    for model in (path, out):
        assert k3.generate_ids(model, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids[:stop + 1]]


def test_sliding_window_caps_the_context(k3: K3Runner, tmp_path):
    path = build("mistral", tmp_path / "m", sliding_window=16)
    res = k3.run("generate", "--model", path, "--prompt-ids", ",".join(["1"] * 20), "-n", 2)
    assert_k3_error(res, "16")


@pytest.mark.parametrize(
    "edit, needle",
    [
        ({"model_type": "gemma"}, "gemma"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "dynamic"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "longrope"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unsupported_configs_are_named(k3: K3Runner, tmp_path, edit, needle):
    path = build("llama", tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(edit)
    (path / "config.json").write_text(json.dumps(cfg))
    assert_k3_error(k3.run("generate", "--model", path, "--prompt-ids", "1,2", "-n", 1), needle)


def test_tied_embeddings_follow_the_file(k3: K3Runner, tmp_path):
    """Tying is decided by the tensors present, not the config's flag: a tied
    file (no lm_head) under a config that says untied still runs tied, with
    the tokens transformers gives for the file as saved."""
    path = build("llama", tmp_path / "m", tie_word_embeddings=True)
    want_ids, _ = hf_greedy(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(cfg))
    assert k3.generate_ids(path, [PROMPT], max_new_tokens=STEPS, temperature=0) == [want_ids]


def test_unexpected_tensor_is_named(k3: K3Runner, tmp_path):
    """A tensor the family's layout does not have is an error naming it, not ignored."""
    from safetensors.numpy import load_file, save_file

    path = build("llama", tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.mlp.extra.weight"] = np.zeros((4, 4), dtype=np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert_k3_error(k3.run("generate", "--model", path, "--prompt-ids", "1,2", "-n", 1),
                    "model.layers.0.mlp.extra.weight")