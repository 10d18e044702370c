"""Test helper: write small random K3 checkpoints for the reference model.

``write_random_checkpoint(dir, config_dict, seed)`` writes ``config.json`` and
``model.safetensors`` (random torch weights, saved with
``safetensors.torch.save_file``) so the reference model can be tested on its
own, without the C++ checkpoint tool. Also runnable as a script::

    python3 tests/e2e/make_tiny_checkpoint.py OUT_DIR [--seed 0] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from safetensors.torch import save_file

_PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"
if str(_PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(_PYTHON_DIR))

from k3ref.checkpoint import expected_tensor_shapes  # noqa: E402
from k3ref.config import K3Config  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """A small valid config dict (d_model 32, 2 layers, vocab 64), with overrides."""
    config: dict[str, Any] = {
        "architecture": "k3",
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 8,
        "n_experts": 4,
        "top_k": 2,
        "d_ff": 48,
        "max_seq_len": 64,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "norm_type": "layernorm",
        "expert_type": "gelu",
        "eos_token_id": None,
    }
    config.update(overrides)
    return config


def random_tensors(
    config_dict: Mapping[str, Any], seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Random weights for every tensor the config requires, in ``dtype``.

    Matrices are N(0, 1/in_features) so activations stay O(1); norm weights
    are around 1 and norm biases around 0.
    """
    config = K3Config.from_dict(config_dict)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("norm.bias"):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif name == "tok_embeddings.weight":
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        tensors[name] = t.to(dtype).contiguous()
    return tensors


def write_checkpoint(
    directory: Union[str, Path],
    config_dict: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` as given (no validation)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(config_dict), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def write_random_checkpoint(
    directory: Union[str, Path],
    config_dict: Mapping[str, Any],
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Write a random checkpoint for ``config_dict``; return its tensors (in ``dtype``)."""
    tensors = random_tensors(config_dict, seed, dtype)
    write_checkpoint(directory, config_dict, tensors)
    return tensors


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    parser.add_argument("--norm-type", default="layernorm")
    parser.add_argument("--expert-type", default="gelu")
    args = parser.parse_args(argv)
    config = tiny_config(norm_type=args.norm_type, expert_type=args.expert_type)
    write_random_checkpoint(args.out_dir, config, args.seed, DTYPES[args.dtype])
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
