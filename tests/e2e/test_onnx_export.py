"""Tests of the ONNX export of the reference model (python/k3ref/export_onnx.py).

The exported graphs are run with onnxruntime (and, for k3-tiny, with the
``onnx.reference`` evaluator) and their logits and KV caches compared with the
PyTorch reference within 1e-4:

* naive style (dynamic axes, concat KV cache, dispatch by index): prefill +
  greedy decode steps feeding present -> past; random batch / seq / past
  lengths and routings, including a single token (most experts receive no
  token, which a graph with traced-in experts gets wrong); both exporters on
  k3-tiny, TorchScript on k3-small;
* static style (fixed-shape prefill + decode graphs): right-padded prompts of
  different lengths per row, then decode steps with per-row positions;
* metadata, opset, I/O names and the command line.

Checkpoints (k3-tiny and k3-small, seed 7) come from ``k3 init-model``
(``$K3_BIN``, default ``build/bin/k3``) or, when that binary is missing, from
``make_tiny_checkpoint.py`` with the same preset shapes. The module is skipped
if onnx or onnxruntime is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[1]
for _p in (str(_REPO / "python"), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from k3ref import K3Config, K3Model  # noqa: E402
from k3ref import export_onnx as ex  # noqa: E402
from make_tiny_checkpoint import write_random_checkpoint  # noqa: E402

TOL = 1e-4
SEED = 7
#: The two presets these tests cover (docs/model-format.md).
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "k3-tiny": dict(
        vocab_size=512,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        n_experts=4,
        top_k=2,
        d_ff=128,
        max_seq_len=256,
    ),
    "k3-small": dict(
        vocab_size=4096,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        head_dim=64,
        n_experts=8,
        top_k=2,
        d_ff=768,
        max_seq_len=1024,
    ),
}


def _exporters() -> tuple[str, ...]:
    """The exporters testable here: dynamo needs the onnxscript package."""
    try:
        import onnxscript  # noqa: F401
    except ModuleNotFoundError:
        return ("torchscript",)
    return ("torchscript", "dynamo")


def _require(exporter: str) -> None:
    if exporter not in _exporters():
        pytest.skip("--exporter dynamo needs onnxscript (python/requirements-export.txt)")


def _k3_bin() -> Path:
    env = os.environ.get("K3_BIN", "").strip()
    return Path(env) if env else _REPO / "build" / "bin" / "k3"


def _make_checkpoint(preset: str, out: Path) -> Path:
    binary = _k3_bin()
    if binary.is_file() and os.access(binary, os.X_OK):
        res = subprocess.run(
            [str(binary), "init-model", "--preset", preset, "--seed", str(SEED), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, f"k3 init-model {preset} failed:\n{res.stderr}"
    else:
        config = {
            "architecture": "k3",
            "rope_theta": 10000.0,
            "norm_eps": 1e-5,
            "norm_type": "layernorm",
            "expert_type": "gelu",
            **PRESET_CONFIGS[preset],
        }
        write_random_checkpoint(out, config, SEED)
    return out


# --------------------------------------------------------------------------
# Fixtures: checkpoints, reference models and exports, built once per module
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-export")


@pytest.fixture(scope="module")
def checkpoint(workdir: Path) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def get(preset: str) -> Path:
        if preset not in cache:
            cache[preset] = _make_checkpoint(preset, workdir / preset)
        return cache[preset]

    return get


@pytest.fixture(scope="module")
def reference(checkpoint: Callable[[str], Path]) -> Callable[[str], K3Model]:
    cache: dict[str, K3Model] = {}

    def get(preset: str) -> K3Model:
        if preset not in cache:
            cache[preset] = K3Model.from_pretrained(checkpoint(preset))
        return cache[preset]

    return get


@pytest.fixture(scope="module")
def naive_export(
    workdir: Path, checkpoint: Callable[[str], Path], reference: Callable[[str], K3Model]
) -> Callable[[str, str], Path]:
    cache: dict[tuple[str, str], Path] = {}

    def get(preset: str, exporter: str) -> Path:
        _require(exporter)
        key = (preset, exporter)
        if key not in cache:
            out = workdir / f"{preset}.{exporter}.naive.onnx"
            cache[key] = ex.export_naive(reference(preset), out, exporter, checkpoint(preset))
        return cache[key]

    return get


def _session(path: Path, config: K3Config) -> ex.OrtNaiveSession:
    return ex.OrtNaiveSession(path, config, threads=1)


def _max_err(a: np.ndarray, b: torch.Tensor) -> float:
    assert a.shape == tuple(b.shape), (a.shape, tuple(b.shape))
    return float(np.abs(a - b.numpy()).max()) if a.size else 0.0


def _cache_err(
    present: list[np.ndarray], ref_cache: list[tuple[torch.Tensor, torch.Tensor]]
) -> float:
    flat = [t for kv in ref_cache for t in kv]
    assert len(present) == len(flat)
    return max(_max_err(p, r) for p, r in zip(present, flat))


def _routed_experts(
    model: K3Model, token_ids: torch.Tensor, past: Any, start: int
) -> set[tuple[int, int]]:
    """(layer, expert) pairs that receive at least one token in this forward."""
    used: set[tuple[int, int]] = set()
    hooks = []
    for layer_idx, layer in enumerate(model.layers):

        def hook(module: Any, args: tuple[torch.Tensor, ...], layer_idx: int = layer_idx) -> None:
            idx, _ = module.route(args[0].reshape(-1, args[0].shape[-1]))
            used.update((layer_idx, int(e)) for e in idx.flatten())

        hooks.append(layer.moe.register_forward_pre_hook(hook))
    try:
        model(token_ids, past, start)
    finally:
        for h in hooks:
            h.remove()
    return used


# --------------------------------------------------------------------------
# Naive style
# --------------------------------------------------------------------------


NAIVE_CASES = [
    pytest.param("k3-tiny", "torchscript", id="tiny-torchscript"),
    pytest.param("k3-tiny", "dynamo", id="tiny-dynamo"),
    pytest.param("k3-small", "torchscript", id="small-torchscript"),
]


@pytest.mark.parametrize("preset,exporter", NAIVE_CASES)
def test_naive_greedy_prefill_and_decode_match_reference(
    preset: str,
    exporter: str,
    naive_export: Callable[[str, str], Path],
    reference: Callable[[str], K3Model],
) -> None:
    model = reference(preset)
    cfg = model.config
    session = _session(naive_export(preset, exporter), cfg)
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, cfg.vocab_size, (1, 13), generator=gen)

    ref_logits, ref_cache = model(prompt, None, 0)
    logits, past = session.step(prompt.numpy(), ex.empty_past(cfg, 1))
    assert _max_err(logits, ref_logits) <= TOL
    assert _cache_err(past, ref_cache) <= TOL
    pos = prompt.shape[1]
    for _ in range(5):
        token = torch.argmax(ref_logits[:, -1], dim=-1, keepdim=True)
        assert int(np.argmax(logits[0, -1])) == int(token)
        ref_logits, ref_cache = model(token, ref_cache, pos)
        logits, past = session.step(token.numpy(), past)
        pos += 1
        assert past[0].shape[2] == pos
        assert _max_err(logits, ref_logits) <= TOL
        assert _cache_err(past, ref_cache) <= TOL


def test_naive_session_greedy_matches_reference_generate(
    naive_export: Callable[[str, str], Path], reference: Callable[[str], K3Model]
) -> None:
    """OrtNaiveSession.greedy (used by bench/peers.py) == k3ref.generate.greedy_generate."""
    from k3ref.generate import greedy_generate

    model = reference("k3-tiny")
    session = _session(naive_export("k3-tiny", "torchscript"), model.config)
    prompt = [5, 17, 42, 300, 7]
    ref_ids, ref_logits = greedy_generate(model, prompt, 12)
    ids, logits = session.greedy(prompt, 12)
    assert ids == ref_ids
    assert _max_err(logits, ref_logits) <= TOL


@pytest.mark.parametrize("preset,exporter", NAIVE_CASES)
def test_naive_random_shapes_and_routings(
    preset: str,
    exporter: str,
    naive_export: Callable[[str, str], Path],
    reference: Callable[[str], K3Model],
) -> None:
    """Any (batch, seq, past): the exporter must not have baked in the example's."""
    model = reference(preset)
    cfg = model.config
    session = _session(naive_export(preset, exporter), cfg)
    gen = torch.Generator().manual_seed(5)
    routings: list[frozenset[tuple[int, int]]] = []
    # (batch, seq, past): seq 1 and past 0 included; none equals the export example (2, 3, 5).
    for batch, seq, past_len in [
        (1, 1, 0),
        (1, 1, 9),
        (3, 4, 0),
        (1, 17, 6),
        (2, 1, 1),
        (4, 2, 30),
    ]:
        past_ids = torch.randint(0, cfg.vocab_size, (batch, past_len), generator=gen)
        new_ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
        ref_cache = model(past_ids, None, 0)[1] if past_len else None
        past = (
            [t.numpy() for kv in ref_cache for t in kv] if ref_cache else ex.empty_past(cfg, batch)
        )
        ref_logits, ref_present = model(new_ids, ref_cache, past_len)
        logits, present = session.step(new_ids.numpy(), past)
        label = f"batch {batch} seq {seq} past {past_len}"
        assert _max_err(logits, ref_logits) <= TOL, label
        assert _cache_err(present, ref_present) <= TOL, label
        routings.append(frozenset(_routed_experts(model, new_ids, ref_cache, past_len)))
    all_experts = {(layer, e) for layer in range(cfg.n_layers) for e in range(cfg.n_experts)}
    # The single-token cases leave most experts empty; together the cases use them all.
    assert min(len(r) for r in routings) <= cfg.n_layers * cfg.top_k < len(all_experts)
    assert set().union(*routings) == all_experts
    assert len(set(routings)) >= 3


def test_naive_graph_dispatches_every_expert(
    naive_export: Callable[[str, str], Path], reference: Callable[[str], K3Model]
) -> None:
    for preset in PRESET_CONFIGS:
        cfg = reference(preset).config
        for exporter in _exporters() if preset == "k3-tiny" else ("torchscript",):
            hist = ex.op_type_histogram(naive_export(preset, exporter))
            assert hist.get("NonZero") == cfg.n_layers * cfg.n_experts, (preset, exporter, hist)
            assert hist.get("TopK") == cfg.n_layers
            assert hist.get("Erf") == cfg.n_layers * cfg.n_experts  # one GeLU per expert
            # one matmul per projection: q k v o + gate + 2 per expert, + output
            assert hist.get("MatMul", 0) >= cfg.n_layers * (5 + 2 * cfg.n_experts) + 1


def test_naive_metadata_and_signature(
    naive_export: Callable[[str, str], Path], checkpoint: Callable[[str], Path]
) -> None:
    for exporter in _exporters():
        path = naive_export("k3-tiny", exporter)
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        assert opsets["ai.onnx"] == ex.OPSET
        meta = ex.metadata(path)
        assert meta["k3.exporter"] == exporter
        assert meta["k3.style"] == "naive"
        assert meta["k3.torch_version"] == torch.__version__
        assert meta["k3.opset"] == "17"
        source = (checkpoint("k3-tiny") / "config.json").read_text()
        assert meta["k3.source_config"] == source
        assert json.loads(meta["k3.source_config"])["architecture"] == "k3"

        inputs = {i.name: i for i in model.graph.input}
        outputs = [o.name for o in model.graph.output]
        n_layers = PRESET_CONFIGS["k3-tiny"]["n_layers"]
        assert list(inputs)[:2] == ["input_ids", "position_ids"]
        assert set(inputs) == {"input_ids", "position_ids", *ex.past_names(n_layers)}
        assert outputs == ["logits", *ex.past_names(n_layers, "present")]
        dims = inputs["past_key_0"].type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[2].dim_param and not dims[1].dim_param
        assert inputs["input_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_naive_onnx_reference_evaluator(
    naive_export: Callable[[str, str], Path], reference: Callable[[str], K3Model]
) -> None:
    """The graph itself (not onnxruntime's rewrite of it) computes the model."""
    from onnx.reference import ReferenceEvaluator

    model = reference("k3-tiny")
    cfg = model.config
    evaluator = ReferenceEvaluator(str(naive_export("k3-tiny", "torchscript")))
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=gen)
    ref_logits, ref_cache = model(prompt, None, 0)
    feed: dict[str, np.ndarray] = {
        "input_ids": prompt.numpy(),
        "position_ids": np.arange(6, dtype=np.int64)[None, :],
        **dict(zip(ex.past_names(cfg.n_layers), ex.empty_past(cfg, 1))),
    }
    out = evaluator.run(None, feed)
    assert _max_err(out[0], ref_logits) <= TOL
    token = torch.argmax(ref_logits[:, -1], dim=-1, keepdim=True)
    ref_logits, _ = model(token, ref_cache, 6)
    feed = {
        "input_ids": token.numpy(),
        "position_ids": np.array([[6]], dtype=np.int64),
        **dict(zip(ex.past_names(cfg.n_layers), out[1:])),
    }
    assert _max_err(evaluator.run(None, feed)[0], ref_logits) <= TOL


# --------------------------------------------------------------------------
# Static style
# --------------------------------------------------------------------------


STATIC_CASES = [
    pytest.param("k3-tiny", "torchscript", id="tiny-torchscript"),
    pytest.param("k3-tiny", "dynamo", id="tiny-dynamo"),
    pytest.param("k3-small", "torchscript", id="small-torchscript"),
]


@pytest.mark.parametrize("preset,exporter", STATIC_CASES)
def test_static_prefill_and_decode_match_reference(
    preset: str,
    exporter: str,
    workdir: Path,
    checkpoint: Callable[[str], Path],
    reference: Callable[[str], K3Model],
) -> None:
    """Batch 2, N = 8, P = 16; rows with prompts of 5 and 8 tokens (right-padded)."""
    _require(exporter)
    model = reference(preset)
    cfg = model.config
    batch, seq, slots = 2, 8, 16
    paths = ex.export_static(
        model,
        workdir / f"{preset}.{exporter}.static.onnx",
        batch,
        seq,
        slots,
        "both",
        exporter,
        checkpoint(preset),
    )
    assert paths["prefill"].name.endswith(".static.prefill.onnx")
    assert paths["decode"].name.endswith(".static.decode.onnx")
    for phase, path in paths.items():
        meta = ex.metadata(path)
        assert (meta["k3.style"], meta["k3.phase"], meta["k3.exporter"]) == (
            "static",
            phase,
            exporter,
        )
        assert (meta["k3.batch"], meta["k3.past"]) == (str(batch), str(slots))
        graph = onnx.load(str(path), load_external_data=False).graph
        for value in list(graph.input) + list(graph.output):  # every shape fixed
            assert all(
                d.HasField("dim_value") for d in value.type.tensor_type.shape.dim
            ), value.name
        assert "NonZero" not in ex.op_type_histogram(path)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    prefill = ort.InferenceSession(
        str(paths["prefill"]), options, providers=["CPUExecutionProvider"]
    )
    decode = ort.InferenceSession(str(paths["decode"]), options, providers=["CPUExecutionProvider"])

    gen = torch.Generator().manual_seed(21)
    lengths = [5, 8]
    prompts = [torch.randint(0, cfg.vocab_size, (1, n), generator=gen) for n in lengths]
    padded = np.full((batch, seq), 1, dtype=np.int64)
    for row, p in enumerate(prompts):
        padded[row, : p.shape[1]] = p.numpy()[0]
    out = prefill.run(None, {"input_ids": padded})
    logits, cache = out[0], out[1:]
    assert logits.shape == (batch, seq, cfg.vocab_size)
    assert cache[0].shape == (batch, cfg.n_kv_heads, slots, cfg.head_dim)

    ref = [model(p, None, 0) for p in prompts]
    for row, (ref_logits, ref_cache) in enumerate(ref):
        n = lengths[row]
        assert _max_err(logits[row : row + 1, :n], ref_logits) <= TOL
        assert _cache_err([c[row : row + 1, :, :n] for c in cache], ref_cache) <= TOL

    names = ex.past_names(cfg.n_layers)
    last = [ref_logits[:, -1] for ref_logits, _ in ref]
    caches = [ref_cache for _, ref_cache in ref]
    positions = list(lengths)
    # Row 0 decodes from position 5 to 12, row 1 from 8 to 15 = P - 1 (the last slot).
    for _ in range(slots - max(lengths)):
        tokens = [torch.argmax(t, dim=-1, keepdim=True) for t in last]
        feed = {
            "input_ids": np.concatenate([t.numpy() for t in tokens]),
            "position_ids": np.array(positions, dtype=np.int64)[:, None],
            **dict(zip(names, cache)),
        }
        out = decode.run(None, feed)
        logits, cache = out[0], out[1:]
        for row in range(batch):
            ref_logits, caches[row] = model(tokens[row], caches[row], positions[row])
            assert _max_err(logits[row : row + 1], ref_logits) <= TOL, (row, positions[row])
            n = positions[row] + 1
            assert _cache_err([c[row : row + 1, :, :n] for c in cache], caches[row]) <= TOL
            last[row] = ref_logits[:, -1]
            positions[row] += 1


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(_REPO / "python"))
    return subprocess.run(
        [sys.executable, "-m", "k3ref.export_onnx", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=_REPO,
    )


def test_cli_naive_verify_and_static_files(
    workdir: Path, checkpoint: Callable[[str], Path]
) -> None:
    model_dir = str(checkpoint("k3-tiny"))
    out = workdir / "cli" / "tiny.onnx"
    res = _run_cli("--model", model_dir, "--out", str(out), "--style", "naive", "--verify")
    assert res.returncode == 0, res.stderr
    assert out.is_file()
    assert "NonZero 8" in res.stdout and "verify: max |logit error|" in res.stdout

    res = _run_cli(
        "--model",
        model_dir,
        "--out",
        str(out),
        "--style",
        "static",
        "--seq",
        "4",
        "--past",
        "8",
        "--batch",
        "1",
        "--phase",
        "decode",
    )
    assert res.returncode == 0, res.stderr
    assert (workdir / "cli" / "tiny.decode.onnx").is_file()
    assert not (workdir / "cli" / "tiny.prefill.onnx").exists()
    assert ex.metadata(workdir / "cli" / "tiny.decode.onnx")["k3.past"] == "8"

    res = _run_cli("--model", model_dir, "--out", str(out), "--style", "bogus")
    assert res.returncode == 2 and "invalid choice" in res.stderr
    res = _run_cli("--model", str(workdir / "missing"), "--out", str(out), "--style", "naive")
    assert res.returncode == 1 and "error:" in res.stderr
