"""Helpers shared by the end-to-end tests of the ``k3`` binary.

:class:`K3Runner` runs the binary (always under a timeout) and runs
``k3 generate --json`` and parses its output; :func:`k3_bin_path` says which
binary (``$K3_BIN``, else ``<repo>/build/bin/k3``). The fixtures built on these
live in ``conftest.py``. (A separate module, not conftest, so test files can
import it by a unique name.)

Importing this module puts ``<repo>/python`` (the k3ref reference package) and
``tests/e2e`` on ``sys.path``.
"""

from __future__ import annotations

import json
import numbers
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
E2E_DIR = Path(__file__).resolve().parent
for _p in (str(PYTHON_DIR), str(E2E_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: Presets the engine tests run on (k3-base is too large for tests).
PRESETS = ("k3-tiny", "k3-small", "moe-swiglu-small")
#: Seed of every checkpoint written by ``k3 init-model`` here.
CHECKPOINT_SEED = 7
#: Default wall-clock limit (seconds) of one k3 invocation.
DEFAULT_TIMEOUT = 60.0

PromptLike = Union[Sequence[int], str]


def load_bench_script(name: str) -> Any:
    """Imports ``bench/<name>.py`` (not a package) as module ``name``, for
    tests of its pure functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def k3_bin_path() -> Path:
    """``$K3_BIN`` if set and non-empty, else ``<repo>/build/bin/k3``."""
    env = os.environ.get("K3_BIN", "").strip()
    return Path(env) if env else REPO / "build" / "bin" / "k3"


def ids_arg(prompt: PromptLike) -> str:
    """A prompt as the comma-separated text ``--prompt-ids`` takes."""
    if isinstance(prompt, str):
        return prompt
    return ",".join(str(int(t)) for t in prompt)


class K3Timeout(AssertionError):
    """A k3 invocation ran past its timeout (it has been killed)."""


class K3Runner:
    """Runs the k3 binary with a timeout and parses ``generate --json`` output."""

    def __init__(self, binary: Path) -> None:
        self.binary = Path(binary)

    def run(
        self, *args: Union[str, os.PathLike, int, float], timeout: float = DEFAULT_TIMEOUT
    ) -> subprocess.CompletedProcess:
        """Run ``k3 ARGS...``; never raises on a non-zero exit.

        Raises :class:`K3Timeout` (an AssertionError, so the test fails with
        the command line) if the process does not finish within ``timeout``.
        """
        cmd = [str(self.binary), *(str(a) for a in args)]
        try:
            return subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise K3Timeout(
                f"k3 did not finish within {timeout:g}s: {shlex.join(cmd)}"
            ) from exc

    @staticmethod
    def generate_args(
        model: Union[str, os.PathLike],
        prompts: Union[PromptLike, Iterable[PromptLike]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        seed: Optional[int] = None,
        threads: Optional[int] = None,
        isa: Optional[str] = None,
        ctx_size: Optional[int] = None,
        prefill_chunk: Optional[int] = None,
        reference: bool = False,
        dump_logits: Optional[Union[str, os.PathLike]] = None,
        extra: Sequence[str] = (),
    ) -> list[str]:
        """Argument list of ``k3 generate ... --json``.

        ``prompts`` is one prompt (a list of ints or an id string) or a list of
        prompts; each becomes one ``--prompt-ids`` flag.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], numbers.Integral)
        ):
            prompts = [prompts]  # a single prompt
        args: list[str] = ["generate", "--model", str(model)]
        for p in prompts:
            args += ["--prompt-ids", ids_arg(p)]
        args += ["--max-new-tokens", str(max_new_tokens), "--temperature", repr(float(temperature))]
        if top_k is not None:
            args += ["--top-k", str(top_k)]
        if top_p is not None:
            args += ["--top-p", repr(float(top_p))]
        if seed is not None:
            args += ["--seed", str(seed)]
        if threads is not None:
            args += ["--threads", str(threads)]
        if isa is not None:
            args += ["--isa", isa]
        if ctx_size is not None:
            args += ["--ctx-size", str(ctx_size)]
        if prefill_chunk is not None:
            args += ["--prefill-chunk", str(prefill_chunk)]
        if reference:
            args.append("--reference")
        if dump_logits is not None:
            args += ["--dump-logits", str(dump_logits)]
        args += list(extra)
        args.append("--json")
        return args

    def generate(
        self,
        model: Union[str, os.PathLike],
        prompts: Union[PromptLike, Iterable[PromptLike]],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        **options: Any,
    ) -> dict[str, Any]:
        """Run ``k3 generate ... --json``, assert success, return the parsed JSON.

        Keyword options are those of :meth:`generate_args`.
        """
        args = self.generate_args(model, prompts, **options)
        res = self.run(*args, timeout=timeout)
        cmd = shlex.join([str(self.binary), *args])
        assert res.returncode == 0, (
            f"k3 failed (exit {res.returncode}): {cmd}\nstderr:\n{res.stderr}"
        )
        try:
            out = json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"k3 --json printed invalid JSON ({exc}): {cmd}\n{res.stdout!r}")
        assert isinstance(out, dict) and "generated_ids" in out, f"{cmd}: {out!r}"
        return out

    def generate_ids(self, model, prompts, **options: Any) -> list[list[int]]:
        """``generated_ids`` of :meth:`generate` (one list per prompt)."""
        return self.generate(model, prompts, **options)["generated_ids"]


#: (case label, max abs logit error, max relative error) recorded by the
#: engine-vs-reference tests; printed in the terminal summary by conftest.
OBSERVED_LOGIT_ERRORS: list[tuple[str, float, float]] = []
