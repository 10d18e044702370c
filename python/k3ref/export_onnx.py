"""Export a K3 checkpoint's reference model to ONNX (opset 17), naive or static.

Usage (from the repository root)::

    PYTHONPATH=python .venv/bin/python -m k3ref.export_onnx --model DIR \
        --out FILE.onnx --style naive|static [--exporter torchscript|dynamo] \
        [--seq N] [--past P] [--batch B] [--phase prefill|decode|both] [--verify]

The two styles are the two ways the article's users bring an MoE model to an
ONNX runtime:

``--style naive`` -- what a developer writes first, one graph with dynamic
    axes (batch, seq, past). Inputs: ``input_ids`` [batch, seq] int64,
    ``position_ids`` [batch, seq] int64 (absolute positions; normally
    ``past + arange(seq)``), ``past_key_{i}`` / ``past_value_{i}``
    [batch, n_kv_heads, past, head_dim] per layer (``past`` may be 0 for the
    prefill). Outputs: ``logits`` [batch, seq, vocab] and
    ``present_key_{i}`` / ``present_value_{i}`` = concat(past, new) along the
    sequence axis, fed back as the next step's past. Rotary cos/sin tables
    for every position < max_seq_len are constants gathered by position_ids;
    the MoE is top-k gating then, for every expert, selection of the tokens
    routed to it (NonZero), its FFN on those rows and an index-add back.
    Two traps of this style are avoided, so the graph is correct for any
    input: rotate-half slices use the head size from the config (a Python
    constant), not ``x.shape[-1] // 2`` (which the tracer records as
    Shape->Gather->Div and Slice loses its static output shape); and every
    expert is dispatched unconditionally -- the reference model's
    ``if token_idx.numel() == 0: continue`` is Python control flow that a
    tracer evaluates once, silently baking into the graph only the experts
    the example input happened to route to.

``--style static`` -- the fix for pseudo-dynamic dimensions: two graphs with
    every shape fixed, written as ``FILE.prefill.onnx`` and
    ``FILE.decode.onnx`` (``--out model.onnx`` -> ``model.prefill.onnx``,
    ``model.decode.onnx``; ``--phase`` exports just one of them).

    * prefill: ``input_ids`` [B, N] (positions 0..N-1) -> ``logits``
      [B, N, V] and ``present_key_{i}`` / ``present_value_{i}``
      [B, n_kv_heads, P, head_dim], the prompt's keys/values in slots 0..N-1
      and zeros after, ready to feed the decode graph. A prompt shorter than
      N is right-padded (any token id): attention is causal, so the logits
      at index len-1 and the cache slots < len are exact; the padded slots
      are overwritten by the decode steps before they are ever read.
    * decode: ``input_ids`` [B, 1], ``position_ids`` [B, 1] int64 and
      ``past_key_{i}`` / ``past_value_{i}`` [B, n_kv_heads, P, head_dim] ->
      ``logits`` [B, 1, V] and the updated caches, same shape as the past.
      **Choice:** a position input rather than an attention mask.
      ``position_ids[b]`` = L_b, the number of tokens already cached for row
      b (= the new token's position): the new key/value is written into slot
      L_b (an elementwise Where, no ScatterND) and the token attends to
      slots 0..L_b only. So one decode graph is correct for every actual
      past length 0 <= L_b <= P-1, rows may differ, and present feeds back
      as past with no copy or concat. The price of fixed shapes: every step
      reads all P slots.
    * the MoE uses no data-dependent shape: prefill runs every expert on
      every token and mixes them with a dense [tokens, experts] weight
      matrix (ScatterElements of the top-k weights); decode gathers the
      chosen experts' weight matrices by index (Gather on stacked
      [E, F, D] weights) and runs only those.

``--exporter torchscript`` (default; ``torch.onnx.export(dynamo=False)``,
which works reliably in torch 2.13) or ``dynamo`` (``dynamo=True``, the
torch.export-based exporter; needs the ``onnxscript`` package). The two emit
different graphs, so the model records which one made it. Metadata
(``metadata_props``): ``k3.torch_version``, ``k3.exporter``, ``k3.style``,
``k3.phase``, ``k3.opset``, ``k3.source_config`` (the config.json text) and,
for static graphs, ``k3.batch``, ``k3.seq``, ``k3.past``.

The module also holds the helpers the tests and ``bench/peers.py`` use:
:func:`export_naive`, :func:`export_static`, :func:`op_type_histogram`,
:func:`empty_past` and :class:`OrtNaiveSession` (greedy prefill + decode with
onnxruntime).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import K3Config
from .model import K3Model, rotary_cos_sin

OPSET = 17
EXPORTERS = ("torchscript", "dynamo")
STYLES = ("naive", "static")
PHASES = ("prefill", "decode", "both")
#: Models bigger than this are saved with their weights in a side file
#: (protobuf cannot hold more than 2 GiB in one message).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

PathLike = Union[str, os.PathLike]


# --------------------------------------------------------------------------
# Pieces shared by both styles
# --------------------------------------------------------------------------


def _rotary_tables(config: K3Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_seq_len, head_dim/2] -- bit-identical to the reference's."""
    return rotary_cos_sin(torch.arange(config.max_seq_len), config.head_dim, config.rope_theta)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Rotate-half with ``half`` a Python constant (static Slice bounds)."""
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _gqa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, config: K3Config
) -> torch.Tensor:
    """Softmax attention of q [B,Hq,T,hd] over k/v [B,Hkv,S,hd] -> [B,T,Hq*hd].

    ``allowed`` [B, T, S] bool says which keys each query sees. Query head j
    reads kv head j // group: q is viewed as [B, Hkv, group, T, hd] and k/v
    broadcast over the group axis (no repeat_interleave copy).
    """
    batch, _, seq, hd = q.shape
    hkv, group = config.n_kv_heads, config.q_per_kv
    qg = q.reshape(batch, hkv, group, seq, hd)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    scores = scores.masked_fill(~allowed[:, None, None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.unsqueeze(2))  # [B, Hkv, group, T, hd]
    out = out.reshape(batch, config.n_heads, seq, hd).transpose(1, 2)
    return out.reshape(batch, seq, config.n_heads * hd)


def _expert_hidden(
    config: K3Config, up: torch.Tensor, gate: Optional[torch.Tensor]
) -> torch.Tensor:
    """The expert activation from the up (and, for swiglu, gate) projections."""
    if config.expert_type == "swiglu":
        assert gate is not None
        return F.silu(gate) * up
    return F.gelu(up, approximate="none")


class _Projections(nn.Module):
    """q/k/v projection + rotary, shared by the export wrappers."""

    def __init__(self, model: K3Model) -> None:
        super().__init__()
        self.config = model.config
        self.half = model.config.head_dim // 2
        cos, sin = _rotary_tables(model.config)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)

    def qkv(
        self, layer: nn.Module, a: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``a`` [B, T, D] -> q [B,Hq,T,hd], k, v [B,Hkv,T,hd] (q, k rotated)."""
        cfg = self.config
        batch, seq, _ = a.shape
        hd = cfg.head_dim
        attn = layer.attn
        q = attn.wq(a).reshape(batch, seq, cfg.n_heads, hd).transpose(1, 2)
        k = attn.wk(a).reshape(batch, seq, cfg.n_kv_heads, hd).transpose(1, 2)
        v = attn.wv(a).reshape(batch, seq, cfg.n_kv_heads, hd).transpose(1, 2)
        cos = self.rope_cos[position_ids].unsqueeze(1)  # [B, 1, T, half]
        sin = self.rope_sin[position_ids].unsqueeze(1)
        return _rotate(q, cos, sin, self.half), _rotate(k, cos, sin, self.half), v


# --------------------------------------------------------------------------
# Naive style: one graph, dynamic axes, concat KV cache, dispatch by index
# --------------------------------------------------------------------------


class NaiveExportModel(_Projections):
    """The reference forward pass written for export (dynamic batch/seq/past).

    ``forward(input_ids, position_ids, past_key_0, past_value_0, ...)`` ->
    ``(logits, present_key_0, present_value_0, ...)``.
    """

    def __init__(self, model: K3Model) -> None:
        super().__init__(model)
        self.model = model

    def moe(self, layer: nn.Module, m: torch.Tensor) -> torch.Tensor:
        """Top-k gating then per-expert dispatch by index, for any routing."""
        cfg = self.config
        flat = m.reshape(-1, cfg.d_model)  # [N, D]
        # ONNX TopK puts the lower index first among equal values, like the
        # reference's stable descending sort.
        top_logits, top_idx = torch.topk(layer.moe.gate(flat), cfg.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)  # [N, top_k]
        y = torch.zeros_like(flat)
        for e, expert in enumerate(layer.moe.experts):
            # No "skip if empty" branch: it would be decided once at trace
            # time. An expert with no tokens runs on a [0, D] slice.
            token_idx, slot = torch.where(top_idx == e)
            w = weights[token_idx, slot].unsqueeze(-1)
            y = y.index_add(0, token_idx, expert(flat[token_idx]) * w)
        return y.reshape(m.shape)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        model = self.model
        h = model.tok_embeddings(input_ids)
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(model.layers):
            q, k, v = self.qkv(layer, layer.attn_norm(h), position_ids)
            k = torch.cat((past[2 * i], k), dim=2)  # KV cache by concatenation
            v = torch.cat((past[2 * i + 1], v), dim=2)
            presents += [k, v]
            # Key s sits at absolute position s; query t at position_ids[:, t].
            key_pos = torch.arange(k.shape[2], device=k.device)
            allowed = key_pos[None, None, :] <= position_ids[:, :, None]
            h = h + layer.attn.wo(_gqa_attention(q, k, v, allowed, self.config))
            h = h + self.moe(layer, layer.moe_norm(h))
        logits = model.output(model.norm(h))
        return (logits, *presents)


# --------------------------------------------------------------------------
# Static style: fixed-shape prefill and decode graphs
# --------------------------------------------------------------------------


class _StaticBase(_Projections):
    """Stacked expert weights [E, F, D] / [E, D, F] for shape-static MoE."""

    def __init__(self, model: K3Model) -> None:
        super().__init__(model)
        self.model = model
        self.swiglu = model.config.expert_type == "swiglu"
        for i, layer in enumerate(model.layers):
            experts = layer.moe.experts
            self.register_buffer(f"up_{i}", torch.stack([e.w_up.weight for e in experts]))
            self.register_buffer(f"down_{i}", torch.stack([e.w_down.weight for e in experts]))
            if self.swiglu:
                self.register_buffer(f"gate_{i}", torch.stack([e.w_gate.weight for e in experts]))

    def stacked(self, i: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        gate = getattr(self, f"gate_{i}") if self.swiglu else None
        return getattr(self, f"up_{i}"), getattr(self, f"down_{i}"), gate

    def route(self, layer: nn.Module, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top_logits, top_idx = torch.topk(layer.moe.gate(flat), self.config.top_k, dim=-1)
        return top_idx, torch.softmax(top_logits, dim=-1)


class StaticPrefillModel(_StaticBase):
    """Prefill graph: ``input_ids`` [B, N] -> logits [B, N, V], caches [B, Hkv, P, hd]."""

    def __init__(self, model: K3Model, batch: int, seq: int, past: int) -> None:
        super().__init__(model)
        if seq > past:
            raise ValueError(f"prefill length {seq} exceeds the cache size {past}")
        self.batch, self.seq, self.past = batch, seq, past

    def moe(self, i: int, layer: nn.Module, m: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, mixed by a dense [N, E] weight matrix."""
        cfg = self.config
        flat = m.reshape(self.batch * self.seq, cfg.d_model)
        top_idx, weights = self.route(layer, flat)
        dense_w = torch.zeros(flat.shape[0], cfg.n_experts).scatter(1, top_idx, weights)
        up_w, down_w, gate_w = self.stacked(i)
        up = torch.matmul(flat.unsqueeze(0), up_w.transpose(1, 2))  # [E, N, F]
        gate = (
            torch.matmul(flat.unsqueeze(0), gate_w.transpose(1, 2)) if gate_w is not None else None
        )
        out = torch.matmul(_expert_hidden(cfg, up, gate), down_w.transpose(1, 2))  # [E, N, D]
        y = (out * dense_w.t().unsqueeze(-1)).sum(dim=0)
        return y.reshape(m.shape)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, model = self.config, self.model
        positions = torch.arange(self.seq).unsqueeze(0).expand(self.batch, self.seq)
        allowed = positions[:, None, :] <= positions[:, :, None]  # causal [B, N, N]
        pad = torch.zeros(self.batch, cfg.n_kv_heads, self.past - self.seq, cfg.head_dim)
        h = model.tok_embeddings(input_ids)
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(model.layers):
            q, k, v = self.qkv(layer, layer.attn_norm(h), positions)
            presents += [torch.cat((k, pad), dim=2), torch.cat((v, pad), dim=2)]
            h = h + layer.attn.wo(_gqa_attention(q, k, v, allowed, cfg))
            h = h + self.moe(i, layer, layer.moe_norm(h))
        return (model.output(model.norm(h)), *presents)


class StaticDecodeModel(_StaticBase):
    """Decode graph: one token per row into a fixed P-slot cache (see module doc)."""

    def __init__(self, model: K3Model, batch: int, past: int) -> None:
        super().__init__(model)
        self.batch, self.past = batch, past

    def moe(self, i: int, layer: nn.Module, m: torch.Tensor) -> torch.Tensor:
        """Gather the chosen experts' weights by index and run only those."""
        cfg = self.config
        flat = m.reshape(self.batch, cfg.d_model)  # one token per row
        top_idx, weights = self.route(layer, flat)  # [B, k]
        up_w, down_w, gate_w = self.stacked(i)
        x = flat[:, None, :, None]  # [B, 1, D, 1]
        up = torch.matmul(up_w[top_idx], x)  # [B, k, F, 1]
        gate = torch.matmul(gate_w[top_idx], x) if gate_w is not None else None
        out = torch.matmul(down_w[top_idx], _expert_hidden(cfg, up, gate))  # [B, k, D, 1]
        y = (out.squeeze(-1) * weights.unsqueeze(-1)).sum(dim=1)
        return y.reshape(m.shape)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        cfg, model = self.config, self.model
        slots = torch.arange(self.past)
        write = (slots[None, :] == position_ids).reshape(self.batch, 1, self.past, 1)
        allowed = (slots[None, :] <= position_ids).reshape(self.batch, 1, self.past)
        h = model.tok_embeddings(input_ids)
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(model.layers):
            q, k_new, v_new = self.qkv(layer, layer.attn_norm(h), position_ids)
            k = torch.where(write, k_new, past[2 * i])  # new k/v into slot L
            v = torch.where(write, v_new, past[2 * i + 1])
            presents += [k, v]
            h = h + layer.attn.wo(_gqa_attention(q, k, v, allowed, cfg))
            h = h + self.moe(i, layer, layer.moe_norm(h))
        return (model.output(model.norm(h)), *presents)


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------


def past_names(n_layers: int, prefix: str = "past") -> list[str]:
    """``[prefix_key_0, prefix_value_0, prefix_key_1, ...]``."""
    names: list[str] = []
    for i in range(n_layers):
        names += [f"{prefix}_key_{i}", f"{prefix}_value_{i}"]
    return names


def empty_past(config: K3Config, batch: int, length: int = 0) -> list[np.ndarray]:
    """Zero caches [batch, n_kv_heads, length, head_dim] float32, two per layer."""
    shape = (batch, config.n_kv_heads, length, config.head_dim)
    return [np.zeros(shape, dtype=np.float32) for _ in range(2 * config.n_layers)]


def _export(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    out: Path,
    exporter: str,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: Optional[dict[str, dict[int, str]]],
    n_fixed: int = 2,
) -> None:
    """Run one of the two torch exporters into ``out`` (opset 17).

    ``n_fixed``: how many inputs come before the ``*past`` varargs of forward.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    module.eval()
    quiet = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")
    levels = {name: logging.getLogger(name).level for name in quiet}
    for name in quiet:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer/deprecation chatter
            _run_exporter(
                module, args, out, exporter, input_names, output_names, dynamic_axes, n_fixed
            )
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _run_exporter(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    out: Path,
    exporter: str,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: Optional[dict[str, dict[int, str]]],
    n_fixed: int,
) -> None:
    """The export call itself (see :func:`_export`)."""
    if exporter == "torchscript":
        torch.onnx.export(
            module,
            args,
            str(out),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    elif exporter == "dynamo":
        dynamic_shapes = None
        if dynamic_axes:
            dims: dict[str, Any] = {}

            def spec(inp: str) -> dict[int, Any]:
                return {
                    axis: dims.setdefault(name, torch.export.Dim.DYNAMIC)
                    for axis, name in dynamic_axes.get(inp, {}).items()
                }

            # torch.export sees forward(a, b, *past) as (a, b, past-tuple).
            specs = [spec(inp) for inp in input_names]
            dynamic_shapes = (*specs[:n_fixed], tuple(specs[n_fixed:]))
        program = torch.onnx.export(
            module,
            args,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            # The dynamo exporter only implements opset >= 18; its own
            # down-conversion fails on ReduceMean's axes input, while the
            # onnx converter on the saved model succeeds (below).
            opset_version=18,
            dynamo=True,
            external_data=False,
            optimize=True,
            verbose=False,
        )
        assert program is not None
        program.save(str(out), external_data=False)
        _convert_opset(out, OPSET)
    else:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")


def _convert_opset(path: Path, opset: int) -> None:
    """Rewrite the model at ``path`` to the default-domain ``opset``."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(path))
    if any(o.domain in ("", "ai.onnx") and o.version == opset for o in model.opset_import):
        return
    converted = version_converter.convert_version(model, opset)
    # The converter moves Reduce* axes from input to attribute but keeps
    # opset-18's noop_with_empty_axes, which opset <= 17 does not know
    # (except ReduceSum). With axes now given, dropping it changes nothing.
    for node in converted.graph.node:
        if node.op_type.startswith("Reduce") and node.op_type != "ReduceSum":
            keep = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
            del node.attribute[:]
            node.attribute.extend(keep)
    onnx.checker.check_model(converted)
    onnx.save_model(converted, str(path))


def _finish(out: Path, config: K3Config, source_config: str, props: dict[str, Any]) -> None:
    """Add K3 metadata; move the weights to a side file if the model is huge."""
    import onnx

    model = onnx.load(str(out), load_external_data=False)
    keep = [p for p in model.metadata_props if not p.key.startswith("k3.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    base = {
        "k3.torch_version": torch.__version__,
        "k3.onnx_version": onnx.__version__,
        "k3.opset": str(OPSET),
        "k3.source_config": source_config,
    }
    for key, value in {**base, **props}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    model.producer_name = model.producer_name or "pytorch"
    size = sum(t.ByteSize() for t in model.graph.initializer)
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(
            model,
            str(out),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=out.name + ".data",
        )
    else:
        onnx.save_model(model, str(out))


def _source_config(model_dir: Optional[PathLike], config: K3Config) -> str:
    if model_dir is not None and (Path(model_dir) / "config.json").is_file():
        return (Path(model_dir) / "config.json").read_text(encoding="utf-8")
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def export_naive(
    model: K3Model,
    out: PathLike,
    exporter: str = "torchscript",
    model_dir: Optional[PathLike] = None,
) -> Path:
    """Export the naive (dynamic-axes) graph to ``out``; returns the path."""
    cfg = model.config
    out = Path(out)
    wrapper = NaiveExportModel(model)
    # Example sizes all >= 2 and distinct, so no exporter specialises an axis.
    batch, seq, past_len = 2, 3, 5
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    pos = (torch.arange(seq) + past_len).unsqueeze(0).expand(batch, seq).contiguous()
    past = [
        torch.randn(batch, cfg.n_kv_heads, past_len, cfg.head_dim, generator=gen)
        for _ in range(2 * cfg.n_layers)
    ]
    inputs = ["input_ids", "position_ids", *past_names(cfg.n_layers)]
    outputs = ["logits", *past_names(cfg.n_layers, "present")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch", 1: "seq"},
    }
    for name in past_names(cfg.n_layers):
        axes[name] = {0: "batch", 2: "past"}
    for name in past_names(cfg.n_layers, "present"):
        axes[name] = {0: "batch", 2: "total"}
    _export(wrapper, (ids, pos, *past), out, exporter, inputs, outputs, axes)
    _finish(
        out,
        cfg,
        _source_config(model_dir, cfg),
        {"k3.exporter": exporter, "k3.style": "naive", "k3.phase": "any"},
    )
    return out


def static_paths(out: PathLike) -> dict[str, Path]:
    """``FILE.onnx`` -> {"prefill": FILE.prefill.onnx, "decode": FILE.decode.onnx}."""
    out = Path(out)
    stem = out.name[: -len(".onnx")] if out.name.endswith(".onnx") else out.name
    return {phase: out.with_name(f"{stem}.{phase}.onnx") for phase in ("prefill", "decode")}


def export_static(
    model: K3Model,
    out: PathLike,
    batch: int = 1,
    seq: int = 128,
    past: Optional[int] = None,
    phase: str = "both",
    exporter: str = "torchscript",
    model_dir: Optional[PathLike] = None,
) -> dict[str, Path]:
    """Export the fixed-shape prefill and/or decode graph(s); returns phase -> path."""
    cfg = model.config
    past = cfg.max_seq_len if past is None else past
    if not 1 <= seq <= past:
        raise ValueError(f"need 1 <= seq ({seq}) <= past ({past})")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    paths = static_paths(out)
    source = _source_config(model_dir, cfg)
    common = {"k3.exporter": exporter, "k3.style": "static", "k3.batch": batch, "k3.past": past}
    written: dict[str, Path] = {}
    gen = torch.Generator().manual_seed(0)
    if phase in ("prefill", "both"):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
        _export(
            StaticPrefillModel(model, batch, seq, past),
            (ids,),
            paths["prefill"],
            exporter,
            ["input_ids"],
            ["logits", *past_names(cfg.n_layers, "present")],
            None,
        )
        _finish(paths["prefill"], cfg, source, {**common, "k3.phase": "prefill", "k3.seq": seq})
        written["prefill"] = paths["prefill"]
    if phase in ("decode", "both"):
        ids = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen)
        pos = torch.randint(0, past, (batch, 1), generator=gen)
        caches = [
            torch.randn(batch, cfg.n_kv_heads, past, cfg.head_dim, generator=gen)
            for _ in range(2 * cfg.n_layers)
        ]
        _export(
            StaticDecodeModel(model, batch, past),
            (ids, pos, *caches),
            paths["decode"],
            exporter,
            ["input_ids", "position_ids", *past_names(cfg.n_layers)],
            ["logits", *past_names(cfg.n_layers, "present")],
            None,
        )
        _finish(paths["decode"], cfg, source, {**common, "k3.phase": "decode", "k3.seq": 1})
        written["decode"] = paths["decode"]
    return written


# --------------------------------------------------------------------------
# Inspection and running
# --------------------------------------------------------------------------


def op_type_histogram(model: Any) -> dict[str, int]:
    """op_type -> count over the graph, its subgraphs and local functions.

    ``model`` is an ``onnx.ModelProto`` or a path (weights are not loaded).
    """
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    counts: collections.Counter[str] = collections.Counter()

    def walk(nodes: Iterable[Any]) -> None:
        for node in nodes:
            counts[node.op_type] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g.node)
                for g in attr.graphs:
                    walk(g.node)

    walk(model.graph.node)
    for function in model.functions:
        walk(function.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def metadata(model_path: PathLike) -> dict[str, str]:
    """The model's metadata_props as a dict."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


class OrtNaiveSession:
    """onnxruntime session on a naive export, with a prefill/decode API.

    ``graph_optimization`` is an ``onnxruntime.GraphOptimizationLevel``
    (default ORT_ENABLE_ALL); ``threads`` sets intra_op_num_threads (0 =
    onnxruntime's default).
    """

    def __init__(
        self,
        path: PathLike,
        config: K3Config,
        threads: int = 0,
        graph_optimization: Any = None,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if graph_optimization is None
            else graph_optimization
        )
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.config = config
        self.past_inputs = past_names(config.n_layers)

    def step(
        self, input_ids: np.ndarray, past: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Feed ``input_ids`` [B, T] after ``past`` -> (logits [B,T,V], present)."""
        batch, seq = input_ids.shape
        start = past[0].shape[2]
        positions = np.broadcast_to(np.arange(start, start + seq, dtype=np.int64), (batch, seq))
        feed: dict[str, np.ndarray] = {
            "input_ids": np.ascontiguousarray(input_ids, dtype=np.int64),
            "position_ids": np.ascontiguousarray(positions),
        }
        feed.update(zip(self.past_inputs, past))
        outputs = self.session.run(None, feed)
        return outputs[0], list(outputs[1:])

    def greedy(self, prompt_ids: Sequence[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        """Greedy decoding of one prompt: (generated ids, logits [steps, V])."""
        logits, past = self.step(
            np.array([list(prompt_ids)], dtype=np.int64), empty_past(self.config, 1)
        )
        generated: list[int] = []
        rows: list[np.ndarray] = []
        last = logits[0, -1]
        for step in range(new_tokens):
            token = int(np.argmax(last))
            generated.append(token)
            rows.append(last.copy())
            if step + 1 == new_tokens:
                break
            logits, past = self.step(np.array([[token]], dtype=np.int64), past)
            last = logits[0, -1]
        return generated, np.stack(rows) if rows else np.zeros((0, self.config.vocab_size))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _verify_naive(model: K3Model, path: Path, threads: int = 0) -> float:
    """Max |logit error| of the export vs the reference: prefill + 3 decode steps."""
    cfg = model.config
    session = OrtNaiveSession(path, cfg, threads=threads)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, min(7, cfg.max_seq_len - 4)), generator=gen)
    ref_logits, ref_cache = model(prompt, None, 0)
    logits, past = session.step(prompt.numpy(), empty_past(cfg, 1))
    err = float(np.abs(logits - ref_logits.numpy()).max())
    pos = prompt.shape[1]
    for _ in range(3):
        token = torch.argmax(ref_logits[:, -1], dim=-1, keepdim=True)
        ref_logits, ref_cache = model(token, ref_cache, pos)
        logits, past = session.step(token.numpy(), past)
        err = max(err, float(np.abs(logits - ref_logits.numpy()).max()))
        pos += 1
    return err


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m k3ref.export_onnx",
        description="Export a K3 checkpoint's reference model to ONNX (opset 17).",
    )
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument(
        "--out", required=True, help="output FILE.onnx (static: FILE.{prefill,decode}.onnx)"
    )
    parser.add_argument("--style", choices=STYLES, required=True)
    parser.add_argument(
        "--exporter",
        choices=EXPORTERS,
        default="torchscript",
        help="torch.onnx exporter (default: torchscript, i.e. dynamo=False)",
    )
    parser.add_argument(
        "--seq",
        type=int,
        default=128,
        help="static: prefill length N (default 128, at most --past)",
    )
    parser.add_argument(
        "--past", type=int, default=None, help="static: KV cache slots P (default max_seq_len)"
    )
    parser.add_argument("--batch", type=int, default=1, help="static: batch size B (default 1)")
    parser.add_argument("--phase", choices=PHASES, default="both", help="static: which graph(s)")
    parser.add_argument(
        "--verify", action="store_true", help="naive: compare with the reference in onnxruntime"
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the op histogram")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    try:
        model = K3Model.from_pretrained(args.model)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.style == "naive":
        paths = {"naive": export_naive(model, args.out, args.exporter, args.model)}
    else:
        seq = min(args.seq, args.past or model.config.max_seq_len)
        try:
            paths = export_static(
                model, args.out, args.batch, seq, args.past, args.phase, args.exporter, args.model
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    for label, path in paths.items():
        hist = op_type_histogram(path)
        print(f"{label}: {path} ({sum(hist.values())} nodes, exporter {args.exporter})")
        if not args.quiet:
            print("  " + ", ".join(f"{op} {n}" for op, n in hist.items()))
    if args.verify and args.style == "naive":
        err = _verify_naive(model, paths["naive"])
        print(f"verify: max |logit error| vs reference = {err:.3e}")
        if err > 1e-4:
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
