"""GGUF export (python/k3ref/export_gguf.py): the file holds the llama-with-
experts layout llama.cpp expects, with every tensor's values equal to the
checkpoint's (rows of wq/wk permuted from rotate-half to adjacent pairs, and
undoing the permutation gives the original), in f32, bf16 and q8_0; models
llama.cpp has no architecture for are refused."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # installed by scripts/setup.sh

from k3ref.checkpoint import load_checkpoint  # noqa: E402
from k3ref.export_gguf import export_gguf, main, rotate_half_to_interleaved  # noqa: E402


def read(path):
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    fields = {k: reader.fields[k] for k in reader.fields}
    return tensors, fields


def field_int(fields, key):
    f = fields[key]
    return int(f.parts[f.data[0]][0])


def as_f32(t) -> np.ndarray:
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF stores ggml order
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)


def test_rotate_half_permutation_pairs_the_halves():
    hd, heads, cols = 8, 2, 3
    w = np.arange(heads * hd * cols, dtype=np.float32).reshape(heads * hd, cols)
    p = rotate_half_to_interleaved(w, heads)
    for h in range(heads):
        for j in range(hd // 2):
            np.testing.assert_array_equal(p[h * hd + 2 * j], w[h * hd + j])
            np.testing.assert_array_equal(p[h * hd + 2 * j + 1], w[h * hd + j + hd // 2])


@pytest.mark.parametrize("type_name,rtol", [("f32", 0.0), ("bf16", 2**-8), ("q8_0", 2**-6)])
def test_export_layout_and_values(checkpoints, tmp_path, type_name, rtol):
    src = checkpoints["moe-swiglu-small"]
    out = tmp_path / f"m.{type_name}.gguf"
    export_gguf(src, out, type_name)
    config, ck = load_checkpoint(src)
    tensors, fields = read(out)
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert field_int(fields, "llama.block_count") == config.n_layers
    assert field_int(fields, "llama.expert_count") == config.n_experts
    assert field_int(fields, "llama.expert_used_count") == config.top_k
    assert field_int(fields, "llama.attention.head_count_kv") == config.n_kv_heads
    assert len(fields["tokenizer.ggml.tokens"].data) == config.vocab_size
    assert len(tensors) == 2 + config.n_layers * 10 + 1

    def check(name, want):
        got = as_f32(tensors[name])
        assert got.shape == want.shape, name
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= rtol * scale + 1e-12, name

    f = lambda n: ck[n].float().numpy()  # noqa: E731
    check("token_embd.weight", f("tok_embeddings.weight"))
    check("output.weight", f("output.weight"))
    check("output_norm.weight", f("norm.weight"))
    layer = config.n_layers - 1
    p, b = f"layers.{layer}.", f"blk.{layer}."
    check(b + "attn_q.weight", rotate_half_to_interleaved(f(p + "attn.wq.weight"), config.n_heads))
    check(b + "attn_k.weight", rotate_half_to_interleaved(f(p + "attn.wk.weight"), config.n_kv_heads))
    check(b + "attn_v.weight", f(p + "attn.wv.weight"))
    check(b + "ffn_gate_inp.weight", f(p + "moe.gate.weight"))
    for ours, theirs in (("w_gate", "ffn_gate_exps"), ("w_up", "ffn_up_exps"), ("w_down", "ffn_down_exps")):
        want = np.stack([f(f"{p}moe.experts.{e}.{ours}.weight") for e in range(config.n_experts)])
        check(b + theirs + ".weight", want)
    # The router and norms stay f32 whatever --type says.
    assert tensors[b + "ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert tensors[b + "attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_refuses_architectures_llama_cpp_lacks(checkpoints, tmp_path, capsys):
    assert main(["--model", str(checkpoints["k3-small"]), "--out", str(tmp_path / "x.gguf")]) == 2
    assert "rmsnorm + swiglu" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_llama_cpp_reproduces_reference_tokens(checkpoints, ref_model, tmp_path):
    """Only where llama-cpp-python is installed (built from source; see
    bench/peers.py): llama.cpp on the f32 export decodes the reference's greedy
    tokens, teacher-forced, with logits close to the reference's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from k3ref.generate import greedy_generate

    src = checkpoints["moe-swiglu-small"]
    out = tmp_path / "m.gguf"
    export_gguf(src, out, "f32")
    prompt = [5, 17, 42, 99, 300, 7]
    ids, logits = greedy_generate(ref_model(src), prompt, 12)
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, n_threads=2, verbose=False)
    vocab = llm.n_vocab()
    llm.reset()
    llm.eval(prompt)
    for i in range(12):
        got = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).copy()
        want = logits[i].numpy()
        assert int(np.argmax(got)) == ids[i], i
        assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max(), i
        llm.eval([ids[i]])
