"""Intermediate-tensor dump of the reference model, under the engine's node names.

Usage (from the repository root)::

    PYTHONPATH=python python3 -m k3ref.dump --model DIR --prompt-ids 5,17,42 --out DUMP

Runs the same two steps as ``k3 generate --dump-tensors`` (docs/debugging.md):

* step 0: prefill of the whole prompt (positions 0..P-1);
* step 1: one decode step with the greedy next token (argmax of the step-0
  logits, lowest id on ties) at position P.

and writes, per step, ``DUMP/stepN/<node name>.npy`` (float32, ``[rows, cols]``,
rows = the tokens of that step) plus ``DUMP/stepN/index.json`` listing the
nodes in the engine's execution order with op and shape. ``select_rows``,
``norm`` and ``logits`` hold only the last row of the step (the engine only
computes the row whose logits are needed).

Tensors come from forward hooks on the reference modules (no change to the
model): module outputs for the norms, projections, MoE and final layers;
module inputs for what the reference does not name -- the attention output
before ``wo`` (input of ``attn.wo``), the attention residual (input of
``moe_norm``), the final hidden state (input of ``norm``); the block output for
``moe.residual``. The rotary outputs ``attn.rope_q``/``rope_k`` are recomputed
from the ``wq``/``wk`` outputs with the model's own ``apply_rotary``. Names the
reference cannot provide would be listed under ``"skipped"`` in the index
(none today).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .checkpoint import CheckpointError
from .config import ConfigError
from .generate import _parse_ids
from .model import K3Model, KVCache, apply_rotary, rotary_cos_sin

def engine_nodes(model: K3Model) -> list[tuple[str, str]]:
    """(engine node name, engine op name) in the engine's execution order
    (src/frontend/checkpoint/build_graph.cc)."""
    cfg = model.config
    norm_op = "LayerNorm" if cfg.norm_type == "layernorm" else "RmsNorm"
    nodes = [("embed", "Embedding")]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        nodes += [
            (p + "attn_norm", norm_op),
            (p + "attn.wq", "Linear"),
            (p + "attn.wk", "Linear"),
            (p + "attn.wv", "Linear"),
            (p + "attn.rope_q", "Rope"),
            (p + "attn.rope_k", "Rope"),
            (p + "attn.attention", "CachedAttention"),
            (p + "attn.wo", "Linear"),
            (p + "attn.residual", "Add"),
            (p + "moe_norm", norm_op),
            (p + "moe", "Moe"),
            (p + "moe.residual", "Add"),
        ]
    nodes += [("select_rows", "GatherRows"), ("norm", norm_op), ("logits", "Linear")]
    return nodes


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[1, T, ...] -> [T, cols] float32 (batch 1)."""
    t = t.detach()
    return t.reshape(t.shape[1], -1).to(torch.float32).clone()


def run_step(
    model: K3Model,
    token_ids: Sequence[int],
    past: Optional[KVCache],
    start_pos: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, KVCache]:
    """One forward step with hooks: (tensors by engine name, last logits row, cache)."""
    cfg = model.config
    seq = len(token_ids)
    positions = torch.arange(start_pos, start_pos + seq)
    cos, sin = rotary_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    got: dict[str, torch.Tensor] = {}
    handles = []

    def out_hook(name: str, pick: Callable = lambda o: o) -> Callable:
        def hook(_module, _inputs, output):
            got[name] = _rows(pick(output))

        return hook

    def in_hook(name: str) -> Callable:
        def hook(_module, inputs):
            got[name] = _rows(inputs[0])

        return hook

    def rope_hook(name: str, n_heads: int) -> Callable:
        # The model's own rotation of q/k: view as heads, rotate, back to rows.
        def hook(_module, _inputs, output):
            x = output.view(1, seq, n_heads, cfg.head_dim).transpose(1, 2)
            got[name] = _rows(apply_rotary(x, cos, sin).transpose(1, 2))

        return hook

    def reg_out(module: torch.nn.Module, hook: Callable) -> None:
        handles.append(module.register_forward_hook(hook))

    def reg_in(module: torch.nn.Module, hook: Callable) -> None:
        handles.append(module.register_forward_pre_hook(hook))

    reg_out(model.tok_embeddings, out_hook("embed"))
    for layer, block in enumerate(model.layers):
        p = f"layers.{layer}."
        reg_out(block.attn_norm, out_hook(p + "attn_norm"))
        reg_out(block.attn.wq, out_hook(p + "attn.wq"))
        reg_out(block.attn.wk, out_hook(p + "attn.wk"))
        reg_out(block.attn.wv, out_hook(p + "attn.wv"))
        reg_out(block.attn.wq, rope_hook(p + "attn.rope_q", cfg.n_heads))
        reg_out(block.attn.wk, rope_hook(p + "attn.rope_k", cfg.n_kv_heads))
        reg_in(block.attn.wo, in_hook(p + "attn.attention"))
        reg_out(block.attn.wo, out_hook(p + "attn.wo"))
        reg_in(block.moe_norm, in_hook(p + "attn.residual"))  # h + attention output
        reg_out(block.moe_norm, out_hook(p + "moe_norm"))
        reg_out(block.moe, out_hook(p + "moe"))
        reg_out(block, out_hook(p + "moe.residual", lambda o: o[0]))
    reg_in(model.norm, in_hook("select_rows"))
    reg_out(model.norm, out_hook("norm"))
    reg_out(model.output, out_hook("logits"))
    try:
        logits, cache = model(torch.tensor([list(token_ids)], dtype=torch.long), past, start_pos)
    finally:
        for h in handles:
            h.remove()
    # The engine runs the final norm and projection on the needed row only.
    for name in ("select_rows", "norm", "logits"):
        got[name] = got[name][-1:].clone()
    return got, logits[0, -1], cache


def write_step(
    out_dir: Path,
    step: int,
    kind: str,
    nodes: list[tuple[str, str]],
    tensors: dict[str, torch.Tensor],
    tokens: Sequence[int],
    positions: Sequence[int],
    next_token: int,
) -> None:
    sdir = out_dir / f"step{step}"
    sdir.mkdir(parents=True, exist_ok=True)
    entries, skipped = [], []
    for name, op in nodes:
        t = tensors.get(name)
        if t is None:
            skipped.append(name)
            continue
        array = np.ascontiguousarray(t.numpy().astype(np.float32))
        with open(sdir / f"{name}.npy", "wb") as handle:  # keep dots in the name
            np.save(handle, array)
        entries.append({"file": f"{name}.npy", "name": name, "op": op, "shape": list(array.shape)})
    head = {
        "greedy_next_token": int(next_token),
        "kind": kind,
        "positions": [int(p) for p in positions],
        "producer": "k3ref",
        "skipped": skipped,
        "step": step,
        "tokens": [int(t) for t in tokens],
    }
    text = json.dumps(head, separators=(",", ":"))[:-1] + ',\n "nodes": ['
    text += ",".join("\n  " + json.dumps(e, separators=(",", ":")) for e in entries)
    text += "\n ]\n}\n"
    (sdir / "index.json").write_text(text)


def dump(model: K3Model, prompt: Sequence[int], out_dir: Path) -> int:
    """Writes the two-step dump; returns the number of tensors written."""
    cfg = model.config
    if len(prompt) == 0:
        raise ValueError("prompt must contain at least one token")
    if len(prompt) + 1 > cfg.max_seq_len:
        raise ValueError(
            f"prompt of {len(prompt)} tokens leaves no position for the decode step "
            f"(max_seq_len {cfg.max_seq_len})"
        )
    nodes = engine_nodes(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors0, last0, cache = run_step(model, prompt, None, 0)
    next0 = int(torch.argmax(last0).item())  # lowest id among equal maxima
    write_step(out_dir, 0, "prefill", nodes, tensors0, prompt, range(len(prompt)), next0)
    tensors1, last1, _ = run_step(model, [next0], cache, len(prompt))
    next1 = int(torch.argmax(last1).item())
    write_step(out_dir, 1, "decode", nodes, tensors1, [next0], [len(prompt)], next1)
    return len(tensors0) + len(tensors1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m k3ref.dump",
        description="Dump the reference model's intermediate tensors (prefill + one "
        "greedy decode step) under the k3 engine's node names.",
    )
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--prompt-ids", required=True, type=_parse_ids, metavar="ID,ID,...")
    parser.add_argument("--out", required=True, help="output directory (step0/, step1/)")
    args = parser.parse_args(argv)
    try:
        model = K3Model.from_pretrained(args.model)
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        n = dump(model, args.prompt_ids, Path(args.out))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the dump to {args.out}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {n} tensors (2 steps) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
