"""Tensor dumps: ``k3 generate --dump-tensors`` vs ``python -m k3ref.dump``.

Both write, for the prefill step of one prompt (step0) and one greedy decode
step (step1), every intermediate tensor under the engine's node names
(docs/debugging.md); ``python -m k3ref.compare_dumps`` compares them.

* on k3-tiny and moe-swiglu-small (a short and a 40-id prompt), the engine's
  and the reference's dumps hold the same tensors with the same shapes and
  agree within the default tolerance (compare_dumps exits 0);
* a deliberately corrupted engine dump (step0 ``layers.1.attn.wo`` x 1.01) is
  reported as the first divergence (exit 1), even with a later tensor
  corrupted too; a missing tensor is listed but does not fail; a shape
  mismatch fails;
* ``--dump-tensors`` with two prompts, or an unusable directory, is a
  one-line ``k3: error:`` with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from k3_e2e import PYTHON_DIR, K3Runner

SHORT_PROMPT = [5, 17, 42, 99]
LONG_PROMPT = [int(t) for t in np.random.default_rng(2024).integers(0, 512, size=40)]
PROMPTS = {"short": SHORT_PROMPT, "long": LONG_PROMPT}
PRESETS = ("k3-tiny", "moe-swiglu-small")
CASES = [pytest.param(m, p, id=f"{m}-{p}") for m in PRESETS for p in PROMPTS]
#: Rows of the final tensors: the engine computes only the row whose logits are needed.
LAST_ROW_ONLY = {"select_rows", "norm", "logits"}


def ids(prompt: list[int]) -> str:
    return ",".join(str(t) for t in prompt)


def run_python(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYTHON_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def compare(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_python("k3ref.compare_dumps", str(a), str(b), *extra)


def index(root: Path, step: int) -> dict:
    return json.loads((root / f"step{step}" / "index.json").read_text())


@pytest.fixture(scope="module")
def dumps(k3: K3Runner, checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """(preset, prompt name) -> (engine dump dir, reference dump dir), made once."""
    root = tmp_path_factory.mktemp("tensor-dumps")
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(preset: str, prompt_name: str) -> tuple[Path, Path]:
        key = (preset, prompt_name)
        if key not in cache:
            prompt = PROMPTS[prompt_name]
            eng, ref = root / f"{preset}-{prompt_name}-k3", root / f"{preset}-{prompt_name}-ref"
            res = k3.run(
                "generate", "--model", checkpoints[preset], "--prompt-ids", ids(prompt),
                "--max-new-tokens", 0, "--dump-tensors", eng,
            )  # fmt: skip
            assert res.returncode == 0, f"k3 generate --dump-tensors failed:\n{res.stderr}"
            res = run_python("k3ref.dump", "--model", str(checkpoints[preset]), "--prompt-ids", ids(prompt), "--out", str(ref))
            assert res.returncode == 0, f"k3ref.dump failed:\n{res.stderr}"
            cache[key] = (eng, ref)
        return cache[key]

    return get


@pytest.mark.parametrize("preset,prompt_name", CASES)
def test_engine_dump_matches_reference(dumps, preset: str, prompt_name: str) -> None:
    eng, ref = dumps(preset, prompt_name)
    prompt = PROMPTS[prompt_name]
    for step in (0, 1):
        ei, ri = index(eng, step), index(ref, step)
        names = [n["name"] for n in ei["nodes"]]
        # Same tensors, same execution order, nothing skipped by the reference.
        assert names == [n["name"] for n in ri["nodes"]], f"step {step}: node lists differ"
        assert ri["skipped"] == [] and ei["skipped"] == []
        assert names[0] == "embed" and names[-3:] == ["select_rows", "norm", "logits"]
        assert "layers.1.attn.rope_q" in names and "layers.1.moe.residual" in names
        assert [n["op"] for n in ei["nodes"]] == [n["op"] for n in ri["nodes"]]
        # Same inputs: the prompt, then the same greedy token.
        assert ei["tokens"] == ri["tokens"] and ei["positions"] == ri["positions"]
        assert ei["tokens"] == (prompt if step == 0 else [index(eng, 0)["greedy_next_token"]])
        for node in ei["nodes"]:
            array = np.load(eng / f"step{step}" / node["file"])
            assert array.dtype == np.float32 and list(array.shape) == node["shape"]
            rows = 1 if step == 1 or node["name"] in LAST_ROW_ONLY else len(prompt)
            assert array.shape[0] == rows, f"step {step} {node['name']}: {array.shape}"
            assert np.isfinite(array).all(), f"step {step} {node['name']}: non-finite values"
    res = compare(eng, ref)
    print(res.stdout)
    assert res.returncode == 0, f"engine and reference dumps diverge:\n{res.stdout}\n{res.stderr}"
    n_nodes = len(index(eng, 0)["nodes"]) + len(index(eng, 1)["nodes"])
    assert f"compared {n_nodes} tensors" in res.stdout and "all within tolerance" in res.stdout
    assert "missing" not in res.stdout and "first divergence" not in res.stdout


def _scale(path: Path, factor: float) -> None:
    array = np.load(path)
    np.save(path, (array * np.float32(factor)).astype(np.float32))


def test_corrupted_dump_is_first_divergence(dumps, tmp_path: Path) -> None:
    eng, ref = dumps("k3-tiny", "short")
    bad = tmp_path / "bad"
    shutil.copytree(eng, bad)
    _scale(bad / "step0" / "layers.1.attn.wo.npy", 1.01)
    _scale(bad / "step1" / "logits.npy", 1.05)  # a later divergence too
    res = compare(bad, ref)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("first divergence: step 0 layers.1.attn.wo (Linear 4x64)"), res.stdout
    marked = [line for line in lines if "<-- first divergence" in line]
    assert len(marked) == 1 and "layers.1.attn.wo" in marked[0], res.stdout
    assert "2 exceed tolerance" in res.stdout
    # Loosening the tolerance past the 5% logits change accepts it.
    assert compare(bad, ref, "--rtol", "0.1", "--atol", "0.5").returncode == 0


def test_missing_tensor_is_listed_not_fatal(dumps, tmp_path: Path) -> None:
    eng, ref = dumps("k3-tiny", "short")
    partial = tmp_path / "partial"
    shutil.copytree(eng, partial)
    (partial / "step1" / "layers.0.moe.npy").unlink()
    res = compare(partial, ref)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "missing (1):" in res.stdout and "step 1: layers.0.moe" in res.stdout


def test_shape_mismatch_fails(dumps, tmp_path: Path) -> None:
    eng, ref = dumps("k3-tiny", "short")
    bad = tmp_path / "bad-shape"
    shutil.copytree(eng, bad)
    path = bad / "step0" / "layers.0.attn.wq.npy"
    np.save(path, np.load(path)[:2])
    res = compare(bad, ref)
    assert res.returncode == 1
    assert "first divergence: step 0 layers.0.attn.wq" in res.stdout and "shape mismatch" in res.stdout


def test_compare_rejects_non_dump(tmp_path: Path) -> None:
    res = compare(tmp_path, tmp_path)
    assert res.returncode == 2 and "not a tensor dump" in res.stderr


def test_dump_tensors_errors(k3: K3Runner, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model = checkpoints["k3-tiny"]
    out = tmp_path / "two"
    res = k3.run("generate", "--model", model, "--prompt-ids", "1,2", "--prompt-ids", "3", "--dump-tensors", out)
    assert res.returncode != 0
    assert res.stderr.startswith("k3: error:") and "exactly one prompt" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = k3.run("generate", "--model", model, "--prompt-ids", "1,2", "--dump-tensors", blocker / "dump")
    assert res.returncode != 0
    assert res.stderr.startswith("k3: error:") and len(res.stderr.strip().splitlines()) == 1
