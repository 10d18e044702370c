"""The K3 model forward pass in plain PyTorch (fp32), the reference oracle.

Written the way the original article writes its model:

* attention with rotary position embedding (rotate-half convention), grouped
  query attention, and a KV cache that grows by concatenating past and new
  keys/values (``torch.cat``);
* a mixture-of-experts feed-forward: top-k gating over the gate logits, then
  dispatch by index -- for each expert, the tokens routed to it are selected
  with ``torch.where`` and its weighted output is ``index_add``-ed back.

Module and buffer names mirror the checkpoint tensor names, so
``K3Model.state_dict()`` has exactly the keys of ``model.safetensors``.
All computation is in float32.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import load_checkpoint, validate_tensors
from .config import K3Config

# One (keys, values) pair per layer, each [B, n_kv_heads, seq_len, head_dim];
# keys are stored after the rotary embedding has been applied.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


# --------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables, each [len(positions), head_dim // 2], float32.

    angle_i = p * theta^(-2i / head_dim) for i < head_dim / 2. The angles are
    computed in float64 and only cos/sin are cast to float32 -- the C++ engine
    does the same, so both sides agree even at large positions.
    """
    half = head_dim // 2
    exponent = torch.arange(half, dtype=torch.float64) * 2.0 / head_dim
    inv_freq = torch.pow(torch.tensor(theta, dtype=torch.float64), -exponent)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).to(torch.float32), torch.sin(angles).to(torch.float32)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, head_dim] with tables ``cos``/``sin`` [T, head_dim/2].

    Rotate-half convention: with half = head_dim / 2,
    u'[i] = u[i] cos - u[i+half] sin and u'[i+half] = u[i+half] cos + u[i] sin.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# --------------------------------------------------------------------------
# Building blocks (weights are buffers: the reference is inference only)
# --------------------------------------------------------------------------


class Linear(nn.Module):
    """y = x W^T with W stored as ``weight`` [out_features, in_features]."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight.t())


class Embedding(nn.Module):
    """Token embedding table ``weight`` [vocab_size, d_model]."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.empty(vocab_size, d_model))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class Norm(nn.Module):
    """LayerNorm (weight + bias, biased variance) or RMSNorm (weight only)."""

    def __init__(self, dim: int, norm_type: str, eps: float) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.eps = eps
        self.register_buffer("weight", torch.empty(dim))
        if norm_type == "layernorm":
            self.register_buffer("bias", torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_type == "layernorm":
            mean = x.mean(dim=-1, keepdim=True)
            var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
            return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
        mean_sq = (x * x).mean(dim=-1, keepdim=True)
        return x / torch.sqrt(mean_sq + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head attention with rotary embedding, GQA and a KV cache."""

    def __init__(self, config: K3Config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        d = config.d_model
        self.wq = Linear(d, config.n_heads * config.head_dim)
        self.wk = Linear(d, config.n_kv_heads * config.head_dim)
        self.wv = Linear(d, config.n_kv_heads * config.head_dim)
        self.wo = Linear(config.n_heads * config.head_dim, d)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: Optional[tuple[torch.Tensor, torch.Tensor]],
        start_pos: int,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` [B, T, D] at positions start_pos..start_pos+T-1 -> [B, T, D]."""
        batch, seq, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(batch, seq, self.n_heads, hd).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, hd).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)

        # KV cache: concatenate the past keys/values with the new ones.
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)

        # GQA: query head j reads kv head j // (n_heads / n_kv_heads).
        group = self.n_heads // self.n_kv_heads
        k_rep = k.repeat_interleave(group, dim=1)  # [B, Hq, S, hd]
        v_rep = v.repeat_interleave(group, dim=1)

        scores = torch.matmul(q, k_rep.transpose(-2, -1)) / math.sqrt(hd)  # [B,Hq,T,S]
        # Causal mask: the query at absolute position start_pos + t sees keys
        # at absolute positions 0..start_pos + t (key s sits at position s).
        total = k.shape[2]
        q_pos = torch.arange(start_pos, start_pos + seq)[:, None]
        k_pos = torch.arange(total)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v_rep)  # [B, Hq, T, hd]
        out = out.transpose(1, 2).reshape(batch, seq, self.n_heads * hd)
        return self.wo(out), present


class Expert(nn.Module):
    """One feed-forward expert: GeLU (exact, erf) or SwiGLU."""

    def __init__(self, d_model: int, d_ff: int, expert_type: str) -> None:
        super().__init__()
        self.expert_type = expert_type
        self.w_up = Linear(d_model, d_ff)
        if expert_type == "swiglu":
            self.w_gate = Linear(d_model, d_ff)
        self.w_down = Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.expert_type == "swiglu":
            return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        return self.w_down(F.gelu(self.w_up(x), approximate="none"))


def top_k_route(gate_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the ``top_k`` experts per token and their mixing weights.

    ``gate_logits`` [N, E] -> (indices [N, top_k] int64, weights [N, top_k]).
    Experts are ordered by descending logit; ties go to the lower expert index
    (a stable descending sort -- ``torch.topk`` does not guarantee this).
    The weights are a softmax over the chosen logits only.
    """
    order = torch.sort(gate_logits, dim=-1, descending=True, stable=True).indices
    indices = order[:, :top_k]
    chosen = torch.gather(gate_logits, -1, indices)
    return indices, torch.softmax(chosen, dim=-1)


class MoE(nn.Module):
    """Mixture of experts: top-k gating, then dispatch to the experts by index."""

    def __init__(self, config: K3Config) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.gate = Linear(config.d_model, config.n_experts)
        self.experts = nn.ModuleList(
            Expert(config.d_model, config.d_ff, config.expert_type)
            for _ in range(config.n_experts)
        )

    def route(self, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` [N, D] -> (expert indices [N, top_k], weights [N, top_k])."""
        return top_k_route(self.gate(m), self.top_k)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        shape = m.shape
        flat = m.reshape(-1, shape[-1])  # [N, D]
        indices, weights = self.route(flat)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            # Tokens routed to expert e, and in which of their top-k slots.
            token_idx, slot = torch.where(indices == e)
            if token_idx.numel() == 0:
                continue
            out = expert(flat[token_idx]) * weights[token_idx, slot].unsqueeze(-1)
            y.index_add_(0, token_idx, out)
        return y.view(shape)


class Block(nn.Module):
    """One transformer layer: pre-norm attention, then pre-norm MoE."""

    def __init__(self, config: K3Config) -> None:
        super().__init__()
        self.attn_norm = Norm(config.d_model, config.norm_type, config.norm_eps)
        self.attn = Attention(config)
        self.moe_norm = Norm(config.d_model, config.norm_type, config.norm_eps)
        self.moe = MoE(config)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: Optional[tuple[torch.Tensor, torch.Tensor]],
        start_pos: int,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn_out, present = self.attn(self.attn_norm(h), cos, sin, past, start_pos)
        h = h + attn_out
        h = h + self.moe(self.moe_norm(h))
        return h, present


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------


class K3Model(nn.Module):
    """The K3 mixture-of-experts decoder (inference only, fp32)."""

    def __init__(self, config: K3Config, tensors: dict[str, torch.Tensor]) -> None:
        """Build the model from a config and its checkpoint tensors.

        ``tensors`` maps checkpoint names to tensors (any float dtype; they are
        upcast to fp32). Names and shapes are validated against ``config``.
        """
        super().__init__()
        validate_tensors(config, tensors)
        self.config = config
        self.tok_embeddings = Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = Norm(config.d_model, config.norm_type, config.norm_eps)
        self.output = Linear(config.d_model, config.vocab_size)
        self.load_state_dict(
            {name: t.to(torch.float32) for name, t in tensors.items()}, strict=True
        )
        self.eval()

    @classmethod
    def from_pretrained(cls, directory: Union[str, Path]) -> "K3Model":
        """Load a model from a checkpoint directory (config.json + model.safetensors)."""
        config, tensors = load_checkpoint(directory)
        return cls(config, tensors)

    @torch.no_grad()
    def forward(
        self,
        token_ids: torch.Tensor,
        past_kv: Optional[KVCache] = None,
        start_pos: int = 0,
    ) -> tuple[torch.Tensor, KVCache]:
        """Run tokens at positions start_pos..start_pos+T-1.

        Args:
            token_ids: LongTensor [B, T].
            past_kv: the cache returned by the previous call (covering
                positions 0..start_pos-1), or None when start_pos == 0.
            start_pos: absolute position of token_ids[:, 0].

        Returns:
            (logits [B, T, vocab_size] float32, present_kv covering
            positions 0..start_pos+T-1).
        """
        cfg = self.config
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids must be [B, T], got shape {list(token_ids.shape)}")
        batch, seq = token_ids.shape
        if seq == 0:
            raise ValueError("token_ids must contain at least one token")
        if token_ids.min() < 0 or token_ids.max() >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size})")
        past_len = 0 if past_kv is None else past_kv[0][0].shape[2]
        if past_kv is not None and len(past_kv) != cfg.n_layers:
            raise ValueError(f"past_kv has {len(past_kv)} layers, expected {cfg.n_layers}")
        if start_pos != past_len:
            raise ValueError(f"start_pos ({start_pos}) must equal the cached length ({past_len})")
        if start_pos + seq > cfg.max_seq_len:
            raise ValueError(
                f"sequence length {start_pos + seq} exceeds max_seq_len {cfg.max_seq_len}"
            )

        positions = torch.arange(start_pos, start_pos + seq)
        cos, sin = rotary_cos_sin(positions, cfg.head_dim, cfg.rope_theta)

        h = self.tok_embeddings(token_ids.long())
        present_kv: KVCache = []
        for layer_idx, layer in enumerate(self.layers):
            past = None if past_kv is None else past_kv[layer_idx]
            h, present = layer(h, cos, sin, past, start_pos)
            present_kv.append(present)
        logits = self.output(self.norm(h))
        return logits, present_kv
