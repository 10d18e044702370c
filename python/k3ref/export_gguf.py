"""Export a K3 checkpoint (rmsnorm + swiglu, e.g. ``moe-swiglu-base``) to GGUF,
so llama.cpp runs the identical weights as a peer.

Usage (from the repository root)::

    PYTHONPATH=python .venv/bin/python -m k3ref.export_gguf --model DIR \
        --out FILE.gguf [--type f32|bf16|q8_0]

The model is written as llama.cpp's ``llama`` architecture with experts (the
Mixtral layout): ``token_embd``, per block ``attn_norm``, ``attn_q/k/v``,
``attn_output``, ``ffn_norm``, ``ffn_gate_inp`` and the stacked expert
tensors ``ffn_gate_exps``/``ffn_up_exps`` [E, F, D] and ``ffn_down_exps``
[E, D, F], then ``output_norm`` and ``output``. Two things differ from a
plain tensor copy, both for the math to be the same:

* Rotary embedding: K3 rotates halves (``u[i]`` with ``u[i + hd/2]``, the
  Hugging Face convention); llama.cpp's ``llama`` rotates adjacent pairs. As
  llama.cpp's own converter does for Hugging Face checkpoints, the rows of
  ``wq`` and ``wk`` are permuted per head so that adjacent pairs of the
  exported projection are the halves of the original one; q.k products, and
  so attention, are unchanged.
* Routing: llama.cpp's softmax over all experts, top-k, then renormalizing
  the chosen weights equals K3's softmax over the chosen logits.

Only the architectures llama.cpp has are exported: layernorm or GeLU
experts (``k3-base``) are refused with a message. K3 has no tokenizer for
these random-weight models, so the file carries a synthetic SentencePiece-
style vocabulary (``<unk>``, ``<s>``, ``</s>``, 256 byte tokens, then
``▁t{i}``) of the model's size: llama.cpp needs one to load, and the peer
benchmark feeds token ids directly.

``--type``: f32 keeps everything f32; bf16 and q8_0 convert the 2-D weight
matrices (norm weights and the router stay f32, as llama.cpp's converter
keeps 1-D tensors f32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .checkpoint import load_checkpoint
from .config import K3Config

TYPES = ("f32", "bf16", "q8_0")


def rotate_half_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Permute the rows of a [n_heads * hd, D] projection per head so that row
    pair (2j, 2j+1) of the result holds rows (j, j + hd/2) of the input."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def check_exportable(config: K3Config) -> None:
    if config.norm_type != "rmsnorm" or config.expert_type != "swiglu":
        raise ValueError(
            f"llama.cpp has no architecture for norm_type={config.norm_type}, expert_type={config.expert_type}; "
            "GGUF export needs rmsnorm + swiglu (e.g. the moe-swiglu-base preset)"
        )


def gguf_tensors(config: K3Config, tensors: dict) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, f32 array) in file order."""
    f = lambda name: tensors[name].float().numpy()  # noqa: E731
    out = [("token_embd.weight", f("tok_embeddings.weight"))]
    for layer in range(config.n_layers):
        p, b = f"layers.{layer}.", f"blk.{layer}."
        out += [
            (b + "attn_norm.weight", f(p + "attn_norm.weight")),
            (b + "attn_q.weight", rotate_half_to_interleaved(f(p + "attn.wq.weight"), config.n_heads)),
            (b + "attn_k.weight", rotate_half_to_interleaved(f(p + "attn.wk.weight"), config.n_kv_heads)),
            (b + "attn_v.weight", f(p + "attn.wv.weight")),
            (b + "attn_output.weight", f(p + "attn.wo.weight")),
            (b + "ffn_norm.weight", f(p + "moe_norm.weight")),
            (b + "ffn_gate_inp.weight", f(p + "moe.gate.weight")),
        ]
        experts = range(config.n_experts)
        for ours, theirs in (("w_gate", "ffn_gate_exps"), ("w_up", "ffn_up_exps"), ("w_down", "ffn_down_exps")):
            stacked = np.stack([f(f"{p}moe.experts.{e}.{ours}.weight") for e in experts])
            out.append((b + theirs + ".weight", stacked))
    out += [("output_norm.weight", f("norm.weight")), ("output.weight", f("output.weight"))]
    return out


def synthetic_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    import gguf

    tokens, types = ["<unk>", "<s>", "</s>"], [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(len(tokens), n)]
    types += [gguf.TokenType.NORMAL] * (n - len(types))
    tokens, types = tokens[:n], types[:n]
    return tokens, [-float(i) for i in range(n)], [int(t) for t in types]


def export_gguf(model_dir: str | Path, out: str | Path, type_name: str = "f32") -> None:
    import gguf

    if type_name not in TYPES:
        raise ValueError(f"--type must be one of {', '.join(TYPES)}")
    config, tensors = load_checkpoint(model_dir)
    check_exportable(config)
    if config.vocab_size < 259:
        raise ValueError("vocab_size must be at least 259 for llama.cpp's byte tokens")
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(Path(model_dir).name)
    w.add_context_length(config.max_seq_len)
    w.add_embedding_length(config.d_model)
    w.add_block_count(config.n_layers)
    w.add_feed_forward_length(config.d_ff)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_expert_count(config.n_experts)
    w.add_expert_used_count(config.top_k)
    w.add_vocab_size(config.vocab_size)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[type_name]  # fmt: skip
    w.add_file_type(ftype)
    tokens, scores, types = synthetic_vocab(config.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(config.eos_token_id if config.eos_token_id is not None else 2)
    w.add_add_bos_token(False)
    for name, arr in gguf_tensors(config, tensors):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if type_name == "f32" or arr.ndim < 2 or name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(name, arr)
        elif type_name == "bf16":
            w.add_tensor(name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)  # fmt: skip
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="K3 checkpoint directory")
    ap.add_argument("--out", required=True, help="output .gguf file")
    ap.add_argument("--type", default="f32", choices=TYPES, help="weight type of the 2-D matrices")
    args = ap.parse_args(argv)
    try:
        export_gguf(args.model, args.out, args.type)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"export_gguf: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
