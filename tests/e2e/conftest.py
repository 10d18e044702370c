"""Shared fixtures for the end-to-end tests of the ``k3`` binary.

* ``k3_bin``      -- path of the binary: ``$K3_BIN`` if set (CI points it at a
                     sanitizer build), else ``<repo>/build/bin/k3``.
* ``k3``          -- a :class:`k3_e2e.K3Runner`: runs the binary (always with a
                     timeout), and runs ``k3 generate --json`` and parses it.
* ``checkpoints`` -- session-scoped checkpoints written by ``k3 init-model``
                     (seed 7) in a temporary directory: ``k3-tiny``,
                     ``k3-small``, ``moe-swiglu-small`` and ``k3-tiny-bf16``
                     (k3-tiny stored as bf16).
* ``ref_model``   -- a cached loader of the PyTorch reference (``python/k3ref``)
                     for a checkpoint directory.

Helpers (runner, constants) live in ``k3_e2e.py``; importing it puts
``<repo>/python`` on ``sys.path``, so no PYTHONPATH is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Union

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from k3_e2e import (  # noqa: E402
    CHECKPOINT_SEED,
    OBSERVED_LOGIT_ERRORS,
    PRESETS,
    K3Runner,
    k3_bin_path,
)


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def k3_bin() -> Path:
    path = k3_bin_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"k3 binary not found at {path}: build it (ninja -C build k3) or set K3_BIN",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def k3(k3_bin: Path) -> K3Runner:
    return K3Runner(k3_bin)


@pytest.fixture(scope="session")
def checkpoints(k3: K3Runner, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> checkpoint directory, written once per session by ``k3 init-model``."""
    root = tmp_path_factory.mktemp("k3-checkpoints")
    specs = {name: (name, "f32") for name in PRESETS}
    specs["k3-tiny-bf16"] = ("k3-tiny", "bf16")
    dirs: dict[str, Path] = {}
    for name, (preset, dtype) in specs.items():
        out = root / name
        res = k3.run(
            "init-model", "--preset", preset, "--seed", CHECKPOINT_SEED,
            "--out", out, "--dtype", dtype,
        )  # fmt: skip
        assert res.returncode == 0, f"init-model {preset} ({dtype}) failed:\n{res.stderr}"
        assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
        dirs[name] = out
    return dirs


@pytest.fixture(scope="session")
def ref_model() -> Callable[[Union[str, os.PathLike]], Any]:
    """Loader of the PyTorch reference model, cached per checkpoint directory."""
    from k3ref import K3Model

    cache: dict[str, Any] = {}

    def load(directory: Union[str, os.PathLike]) -> Any:
        key = str(Path(directory).resolve())
        if key not in cache:
            cache[key] = K3Model.from_pretrained(key)
        return cache[key]

    return load


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the logit errors observed by test_engine_vs_reference.py."""
    if not OBSERVED_LOGIT_ERRORS:
        return
    terminalreporter.section("k3 engine vs reference: max logit errors")
    for label, abs_err, rel_err in OBSERVED_LOGIT_ERRORS:
        terminalreporter.write_line(f"{label:28s} max abs {abs_err:.3e}   max rel {rel_err:.3e}")
