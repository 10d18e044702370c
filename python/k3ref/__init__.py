"""K3 reference model: the PyTorch oracle the C++ engine is tested against.

The package loads a K3 checkpoint directory (``config.json`` +
``model.safetensors``), runs the model in fp32 and greedily decodes tokens.
It is deliberately written in the plain "textbook" style (top-k gating then
dispatch by index, KV cache by concatenation) so that it is easy to audit.

Modules:
    config      -- :class:`K3Config`, loading and validation of config.json
    checkpoint  -- loading and validation of model.safetensors
    model       -- :class:`K3Model`, the forward pass
    generate    -- greedy decoding and the ``python3 -m k3ref.generate`` CLI
"""

from .checkpoint import CheckpointError, expected_tensor_shapes, load_checkpoint, load_tensors
from .config import ConfigError, K3Config, load_config
from .model import K3Model, KVCache

__all__ = [
    "CheckpointError",
    "ConfigError",
    "K3Config",
    "K3Model",
    "KVCache",
    "expected_tensor_shapes",
    "load_checkpoint",
    "load_config",
    "load_tensors",
]
