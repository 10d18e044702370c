"""Loading and validation of a K3 checkpoint's ``model.safetensors``.

Every tensor the config implies must be present with exactly the expected
shape, and no other tensor may be present. Tensors may be stored as F32, F16
or BF16; they are all upcast to fp32 on load (the reference computes in fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch
from safetensors import safe_open

from .config import K3Config, load_config

SAFETENSORS_FILE = "model.safetensors"
ALLOWED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class CheckpointError(ValueError):
    """Raised when model.safetensors is missing tensors or has wrong shapes."""


def expected_tensor_shapes(config: K3Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint for ``config`` must contain.

    Weight matrices use the PyTorch Linear layout ``[out_features, in_features]``.
    """
    d, v, f = config.d_model, config.vocab_size, config.d_ff
    q_dim = config.n_heads * config.head_dim
    kv_dim = config.n_kv_heads * config.head_dim
    has_bias = config.norm_type == "layernorm"

    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (v, d)}

    def add_norm(prefix: str) -> None:
        shapes[f"{prefix}.weight"] = (d,)
        if has_bias:
            shapes[f"{prefix}.bias"] = (d,)

    for layer in range(config.n_layers):
        p = f"layers.{layer}"
        add_norm(f"{p}.attn_norm")
        shapes[f"{p}.attn.wq.weight"] = (q_dim, d)
        shapes[f"{p}.attn.wk.weight"] = (kv_dim, d)
        shapes[f"{p}.attn.wv.weight"] = (kv_dim, d)
        shapes[f"{p}.attn.wo.weight"] = (d, q_dim)
        add_norm(f"{p}.moe_norm")
        shapes[f"{p}.moe.gate.weight"] = (config.n_experts, d)
        for expert in range(config.n_experts):
            e = f"{p}.moe.experts.{expert}"
            shapes[f"{e}.w_up.weight"] = (f, d)
            if config.expert_type == "swiglu":
                shapes[f"{e}.w_gate.weight"] = (f, d)
            shapes[f"{e}.w_down.weight"] = (d, f)
    add_norm("norm")
    shapes["output.weight"] = (v, d)
    return shapes


def validate_tensors(config: K3Config, tensors: dict[str, torch.Tensor]) -> None:
    """Check names, shapes and dtypes of ``tensors`` against ``config``.

    Raises :class:`CheckpointError` naming the offending tensor(s).
    """
    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise CheckpointError(
            f"checkpoint is missing {len(missing)} tensor(s): {', '.join(missing)}"
        )
    unexpected = sorted(name for name in tensors if name not in expected)
    if unexpected:
        raise CheckpointError(
            f"checkpoint has {len(unexpected)} unexpected tensor(s): "
            f"{', '.join(unexpected)}"
        )
    for name, shape in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"tensor {name} has shape {list(tensor.shape)}, expected {list(shape)}"
            )
        if tensor.dtype not in ALLOWED_DTYPES:
            raise CheckpointError(
                f"tensor {name} has dtype {tensor.dtype}, expected one of "
                f"float32, float16, bfloat16"
            )


def load_tensors(path: Union[str, Path], config: K3Config) -> dict[str, torch.Tensor]:
    """Load, validate and upcast to fp32 the tensors of a checkpoint.

    ``path`` may be the checkpoint directory or the .safetensors file itself.
    """
    path = Path(path)
    if path.is_dir():
        path = path / SAFETENSORS_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    raw: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                raw[name] = handle.get_tensor(name)
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises several exception types
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    validate_tensors(config, raw)
    return {name: t.to(torch.float32).contiguous() for name, t in raw.items()}


def load_checkpoint(directory: Union[str, Path]) -> tuple[K3Config, dict[str, torch.Tensor]]:
    """Load config.json and model.safetensors from a checkpoint directory."""
    directory = Path(directory)
    config = load_config(directory / "config.json")
    tensors = load_tensors(directory / SAFETENSORS_FILE, config)
    return config, tensors
