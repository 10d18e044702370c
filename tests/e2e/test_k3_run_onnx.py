"""End-to-end tests of ``k3 run`` (ONNX import + the O0 interpreter).

The reference model's ONNX exports (python/k3ref/export_onnx.py) are run by
``k3 run`` on a prompt's inputs and every output (logits and KV caches) is
compared with ONNX Runtime on the same .onnx file within 1e-4 relative
(max |k3 - ort| / max |ort| per output):

* k3-small, naive style (TorchScript exporter: dynamic axes, NonZero-based
  expert dispatch, concat KV cache): a prefill with an empty cache, then a
  decode step that feeds the presents back as past (batch 2);
* k3-small, static style, prefill graph (fixed shapes, dense MoE), inputs
  given as .npy;
* moe-swiglu-small, naive style;
* bad input: missing input, wrong dtype, wrong rank, unreadable file,
  unsupported model extension -> one-line ``k3: error:`` and non-zero exit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402

from k3ref import K3Model  # noqa: E402
from k3ref import export_onnx as ex  # noqa: E402

TOL = 1e-4


def _write_inputs(d: Path, feeds: dict[str, np.ndarray], fmt: str = "pb") -> list[str]:
    d.mkdir(parents=True, exist_ok=True)
    args: list[str] = []
    for name, value in feeds.items():
        path = d / f"{name}.{fmt}"
        if fmt == "npy":
            np.save(path, value)
        else:
            path.write_bytes(numpy_helper.from_array(value, name).SerializeToString())
        args += ["--input", f"{name}={path}"]
    return args


def _run_and_compare(
    k3, model: Path, feeds: dict[str, np.ndarray], work: Path, fmt: str = "pb", opt_level: int = 0
) -> dict[str, np.ndarray]:
    args = _write_inputs(work / "in", feeds, fmt)
    out_dir = work / "out"
    res = k3.run("run", model, *args, "--output-dir", out_dir, "--opt-level", opt_level, timeout=300)
    assert res.returncode == 0, res.stderr
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    refs = sess.run(None, feeds)
    got_all: dict[str, np.ndarray] = {}
    for meta, ref in zip(sess.get_outputs(), refs):
        got = numpy_helper.to_array(onnx.load_tensor(str(out_dir / f"{meta.name}.pb")))
        npy = np.load(out_dir / f"{meta.name}.npy")
        assert np.array_equal(got, npy), meta.name
        assert got.shape == ref.shape, (meta.name, got.shape, ref.shape)
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        err = float(np.abs(got - ref).max()) / max(scale, 1e-12) if ref.size else 0.0
        assert err <= TOL, f"{meta.name}: max relative error {err:.3e} > {TOL}"
        got_all[meta.name] = got
    return got_all


def _naive_feeds(cfg, ids: np.ndarray, past: list[np.ndarray], start: int) -> dict[str, np.ndarray]:
    batch, seq = ids.shape
    feeds = {
        "input_ids": ids.astype(np.int64),
        "position_ids": (np.arange(seq, dtype=np.int64) + start)[None].repeat(batch, 0),
    }
    for name, value in zip(ex.past_names(cfg.n_layers), past):
        feeds[name] = value
    return feeds


@pytest.fixture(scope="module")
def exports(checkpoints, tmp_path_factory) -> Callable[[str, str], Path]:
    root = tmp_path_factory.mktemp("k3-run-onnx")
    cache: dict[tuple[str, str], Path] = {}

    def get(preset: str, style: str) -> Path:
        key = (preset, style)
        if key not in cache:
            model = K3Model.from_pretrained(str(checkpoints[preset]))
            out = root / f"{preset}.{style}.onnx"
            if style == "naive":
                cache[key] = ex.export_naive(model, out, model_dir=checkpoints[preset])
            else:
                cache[key] = ex.export_static(
                    model, out, batch=1, seq=8, past=16, phase="prefill", model_dir=checkpoints[preset]
                )["prefill"]
        return cache[key]

    return get


@pytest.mark.parametrize("preset", ["k3-small", "moe-swiglu-small"])
@pytest.mark.parametrize("opt_level", [0, 3])
def test_naive_prefill_then_decode(k3, exports, checkpoints, tmp_path, preset, opt_level):
    """At O3 the graph holds k3.Rope/k3.Attention/k3.Moe (run by their
    reference kernels): outputs still match ONNX Runtime on the export."""
    model = exports(preset, "naive")
    cfg = K3Model.from_pretrained(str(checkpoints[preset])).config
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 6))
    empty = ex.empty_past(cfg, 2, 0)
    outs = _run_and_compare(k3, model, _naive_feeds(cfg, ids, empty, 0), tmp_path / "prefill", opt_level=opt_level)
    # One decode step on the presents (past length 6).
    presents = [outs[n] for n in ex.past_names(cfg.n_layers, "present")]
    nxt = np.argmax(outs["logits"][:, -1, :], axis=-1)[:, None]
    _run_and_compare(k3, model, _naive_feeds(cfg, nxt, presents, 6), tmp_path / "decode", opt_level=opt_level)


def test_static_prefill(k3, exports, checkpoints, tmp_path):
    model = exports("k3-small", "static")
    cfg = K3Model.from_pretrained(str(checkpoints["k3-small"])).config
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(1, 8)).astype(np.int64)
    _run_and_compare(k3, model, {"input_ids": ids}, tmp_path, fmt="npy")  # .npy inputs too


def test_bad_inputs(k3, exports, checkpoints, tmp_path):
    model = exports("k3-small", "static")
    good = np.zeros((1, 8), dtype=np.int64)
    args = _write_inputs(tmp_path / "good", {"input_ids": good})
    bad_dtype = _write_inputs(tmp_path / "f32", {"input_ids": good.astype(np.float32)})
    bad_rank = _write_inputs(tmp_path / "rank", {"input_ids": good[0]})
    trunc = tmp_path / "trunc.pb"
    trunc.write_bytes((tmp_path / "good" / "input_ids.pb").read_bytes()[:-7])
    cases = {
        "missing input": [],
        "wrong dtype": bad_dtype,
        "wrong rank": bad_rank,
        "unreadable file": ["--input", f"input_ids={tmp_path / 'nope.pb'}"],
        "truncated file": ["--input", f"input_ids={trunc}"],
        "unknown input": args + ["--input", f"bogus={tmp_path / 'good' / 'input_ids.pb'}"],
    }
    for label, extra in cases.items():
        res = k3.run("run", model, *extra, "--output-dir", tmp_path / "o")
        assert res.returncode != 0, label
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("k3: error:"), (label, res.stderr)
    for other in ("m.k3m", "m.bin"):
        res = k3.run("run", tmp_path / other, *args, "--output-dir", tmp_path / "o")
        assert res.returncode != 0 and res.stderr.startswith("k3: error:"), res.stderr
    res = k3.run("run", model, *args, "--output-dir", tmp_path / "o", "--opt-level", 7)
    assert res.returncode != 0 and "opt-level" in res.stderr


def test_external_data(k3, exports, checkpoints, tmp_path):
    """Weights in a side file (how models over 2 GiB ship, k3-base's naive
    export among them) give the same outputs; a location that escapes the
    model's directory, a short data file and a length that does not match
    the dims are one-line errors."""
    src = exports("k3-small", "static")
    proto = onnx.load(str(src))
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    ext = ext_dir / "m.onnx"
    onnx.save_model(proto, str(ext), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.weights", size_threshold=0)
    assert (ext_dir / "m.weights").stat().st_size > 1000
    ids = np.random.default_rng(3).integers(0, 100, size=(1, 8)).astype(np.int64)
    _run_and_compare(k3, ext, {"input_ids": ids}, tmp_path / "ok")

    args = _write_inputs(tmp_path / "in", {"input_ids": ids})

    def damaged(label: str, edit) -> None:
        m = onnx.load(str(ext), load_external_data=False)
        big = max((t for t in m.graph.initializer if t.external_data), key=lambda t: np.prod(t.dims))
        edit(big)
        path = ext_dir / f"{label}.onnx"
        onnx.save_model(m, str(path))
        res = k3.run("run", path, *args, "--output-dir", tmp_path / label)
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and len(lines) == 1 and lines[0].startswith("k3: error:"), (label, res.stderr)
        return lines[0]

    def set_kv(key: str, value: str):
        def edit(t):
            for kv in t.external_data:
                if kv.key == key:
                    kv.value = value
                    return
            t.external_data.add(key=key, value=value)
        return edit

    assert "relative path" in damaged("escape", set_kv("location", "../ext/m.weights"))
    assert "relative path" in damaged("absolute", set_kv("location", str(ext_dir / "m.weights")))
    assert "past the end" in damaged("offset", set_kv("offset", str((ext_dir / "m.weights").stat().st_size)))
    assert "does not match" in damaged("length", set_kv("length", "4"))
    assert "m.nope" in damaged("missing", set_kv("location", "m.nope"))
