"""Loading and validation of a K3 checkpoint's ``config.json``.

The config describes the model's hyper-parameters. Every key is required
except those with a documented default (``rope_theta``, ``norm_eps``,
``norm_type``, ``expert_type``, ``eos_token_id``). Keys this module does not
know are ignored, so tools may add metadata without breaking the reference.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

NORM_TYPES = ("layernorm", "rmsnorm")
EXPERT_TYPES = ("gelu", "swiglu")
ARCHITECTURE = "k3"

_REQUIRED_INT_KEYS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "n_experts",
    "top_k",
    "d_ff",
    "max_seq_len",
)


class ConfigError(ValueError):
    """Raised when config.json is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class K3Config:
    """Hyper-parameters of a K3 model (the contents of config.json)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    d_ff: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    norm_type: str = "layernorm"
    expert_type: str = "gelu"
    eos_token_id: Optional[int] = None
    architecture: str = ARCHITECTURE

    def __post_init__(self) -> None:
        self.validate()

    @property
    def q_per_kv(self) -> int:
        """Number of query heads sharing one key/value head (GQA group size)."""
        return self.n_heads // self.n_kv_heads

    def validate(self) -> None:
        """Check every field; raise :class:`ConfigError` on the first problem."""
        if self.architecture != ARCHITECTURE:
            raise ConfigError(
                f"architecture must be {ARCHITECTURE!r}, got {self.architecture!r}"
            )
        for key in _REQUIRED_INT_KEYS:
            value = getattr(self, key)
            if not _is_int(value) or value <= 0:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim must be even (rotary), got {self.head_dim}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ConfigError(
                f"top_k must satisfy 1 <= top_k <= n_experts ({self.n_experts}), "
                f"got {self.top_k}"
            )
        for key in ("rope_theta", "norm_eps"):
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(f"{key} must be a positive finite number, got {value!r}")
        if self.norm_type not in NORM_TYPES:
            raise ConfigError(
                f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}"
            )
        if self.expert_type not in EXPERT_TYPES:
            raise ConfigError(
                f"expert_type must be one of {EXPERT_TYPES}, got {self.expert_type!r}"
            )
        if self.eos_token_id is not None:
            if not _is_int(self.eos_token_id) or not 0 <= self.eos_token_id < self.vocab_size:
                raise ConfigError(
                    f"eos_token_id must be null or an integer in [0, vocab_size), "
                    f"got {self.eos_token_id!r}"
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "K3Config":
        """Build a config from a parsed config.json mapping (validates it)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        if "architecture" not in data:
            raise ConfigError("missing required config key 'architecture'")
        missing = [k for k in _REQUIRED_INT_KEYS if k not in data]
        if missing:
            raise ConfigError(f"missing required config key(s): {', '.join(missing)}")
        kwargs: dict[str, Any] = {k: data[k] for k in _REQUIRED_INT_KEYS}
        kwargs["architecture"] = data["architecture"]
        for key in ("rope_theta", "norm_eps", "norm_type", "expert_type", "eos_token_id"):
            if key in data:
                kwargs[key] = data[key]
        if "rope_theta" in kwargs and _is_number(kwargs["rope_theta"]):
            kwargs["rope_theta"] = float(kwargs["rope_theta"])
        if "norm_eps" in kwargs and _is_number(kwargs["norm_eps"]):
            kwargs["norm_eps"] = float(kwargs["norm_eps"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-serialisable dict (the config.json layout)."""
        return asdict(self)


def load_config(path: Union[str, Path]) -> K3Config:
    """Load and validate ``config.json``.

    ``path`` may be the checkpoint directory or the config file itself.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return K3Config.from_dict(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
