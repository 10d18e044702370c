"""``k3 compile MODEL.onnx`` end to end: K3's own ONNX exports (naive and
static style) compiled to ``.k3m`` -- and run straight from the ``.onnx`` --
generate the PyTorch reference's greedy tokens; bad models and flags fail
with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from k3_e2e import K3Runner
from k3ref import export_onnx as ex
from k3ref.generate import greedy_generate
from test_cli_errors import assert_k3_error

PROMPT = [5, 17, 42, 99]
STEPS = 8
CTX = 64


@pytest.fixture(scope="module")
def onnx_models(
    checkpoints: dict[str, Path], ref_model: Callable, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """(preset, style) -> exported .onnx: naive or dynamo (the naive model by
    the dynamo exporter), or the static style's decode graph."""
    work = tmp_path_factory.mktemp("onnx_compile")
    cache: dict[tuple[str, str], Path] = {}

    def get(preset: str, style: str) -> Path:
        if (preset, style) not in cache:
            model = ref_model(checkpoints[preset])
            if style == "naive":
                path = ex.export_naive(model, work / f"{preset}.naive.onnx", model_dir=checkpoints[preset])
            elif style == "dynamo":
                # The naive model through the torch.export-based exporter: other
                # op forms (GatherND lookups, Slice columns, Expand zeros).
                path = ex.export_naive(model, work / f"{preset}.dynamo.onnx", "dynamo", checkpoints[preset])
            else:
                paths = ex.export_static(
                    model, work / f"{preset}.static.onnx", batch=1, seq=1, past=CTX, phase="decode",
                    model_dir=checkpoints[preset],
                )
                path = paths["decode"]
            cache[(preset, style)] = path
        return cache[(preset, style)]

    return get


@pytest.mark.parametrize("preset", ["k3-small", "moe-swiglu-small"])
@pytest.mark.parametrize("style", ["naive", "static", "dynamo"])
@pytest.mark.parametrize("opt_level", ["0", "1", "3"])
def test_compiled_onnx_generates_reference_tokens(
    k3: K3Runner, checkpoints, ref_model, onnx_models, tmp_path, preset, style, opt_level
):
    src = onnx_models(preset, style)
    out = tmp_path / f"{preset}-{style}-O{opt_level}.k3m"
    rep = tmp_path / "report.json"
    res = k3.run("compile", src, "--out", out, "--opt-level", opt_level, "--report", rep, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(rep.read_text())
    layers = ref_model(checkpoints[preset]).config.n_layers
    if opt_level == "3":
        # Fully lowered: the planned executor, one attention and one MoE per
        # layer, no onnx op left (no Shape, NonZero or cache Concat).
        assert report["executor"] == "plan"
        for graph in ("decode", "prefill"):
            ops = report["graphs"][graph]["ops"]
            assert ops["CachedAttention"] == layers and ops["Moe"] == layers, ops
            assert not [op for op in ops if op.startswith("onnx.")], ops
            assert report["graphs"][graph]["memory_plan"]["arena_bytes"] > 0
    else:
        assert report["executor"] == "onnx-decoder"
        assert report["graphs"]["decode"]["memory_plan"] is None
    want, _ = greedy_generate(ref_model(checkpoints[preset]), PROMPT, STEPS)
    got = k3.generate_ids(out, [PROMPT], max_new_tokens=STEPS, temperature=0, ctx_size=CTX)
    assert got == [want]


def test_onnx_file_runs_directly_and_batches(k3: K3Runner, checkpoints, ref_model, onnx_models):
    """``k3 generate --model m.onnx`` compiles in memory; two prompts decode
    together, each getting exactly its solo tokens."""
    src = onnx_models("k3-small", "naive")
    ref = ref_model(checkpoints["k3-small"])
    prompts = [PROMPT, [7, 3]]
    want = [greedy_generate(ref, p, STEPS)[0] for p in prompts]
    got = k3.generate_ids(src, prompts, max_new_tokens=STEPS, temperature=0, ctx_size=CTX)
    assert got == want


def test_onnx_input_shape_ctx_sizes_the_cache(k3: K3Runner, onnx_models, tmp_path):
    """ctx= is the KV context for an ONNX model too (it once went unnoticed)."""
    src = onnx_models("k3-small", "naive")
    out, rep = tmp_path / "c.k3m", tmp_path / "r.json"
    res = k3.run("compile", src, "--out", out, "--input-shape", "batch=1,ctx=48", "--report", rep, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ctx=48" in json.loads(rep.read_text())["flags"]
    assert_k3_error(k3.run("generate", "--model", out, "--prompt-ids", "1,2", "-n", "2", "-c", "64"), "48")


def test_onnx_compile_errors(k3: K3Runner, onnx_models, tmp_path):
    src = onnx_models("k3-small", "naive")
    out = tmp_path / "x.k3m"
    assert_k3_error(k3.run("compile", src, "--out", out, "--input-shape", "nosuch=3"), "nosuch")
    # On the interpreter (O0) a concatenating cache cannot have its past dim fixed.
    res = k3.run("compile", src, "--out", out, "-O0", "--input-shape", "past=8")
    if res.returncode == 0:
        assert_k3_error(k3.run("generate", "--model", out, "--prompt-ids", "1,2", "-n", "2"), "past")
    assert_k3_error(k3.run("compile", src, "--out", out, "--moe-dense"), "moe-dense")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert_k3_error(k3.run("compile", bad, "--out", out), "bad.onnx")
    assert_k3_error(k3.run("generate", "--model", bad, "--prompt-ids", "1"), "bad.onnx")


def test_k3_run_on_compiled_onnx(k3: K3Runner, checkpoints, ref_model, onnx_models, tmp_path):
    """``k3 run`` takes a .k3m compiled from ONNX that runs op by op, with the
    same outputs as on the .onnx; a planned .k3m is refused."""
    import numpy as np

    src = onnx_models("k3-small", "naive")
    cfg = ref_model(checkpoints["k3-small"]).config
    feeds = {"input_ids": np.array([[5, 17, 42]], dtype=np.int64),
             "position_ids": np.array([[0, 1, 2]], dtype=np.int64)}
    for i, past in enumerate(ex.empty_past(cfg, 1, 0)):
        feeds[ex.past_names(cfg.n_layers)[i]] = past
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    o0 = tmp_path / "o0.k3m"
    assert k3.run("compile", src, "--out", o0, "-O0").returncode == 0
    for model, out in ((src, "a"), (o0, "b")):
        res = k3.run("run", model, *args, "--output-dir", tmp_path / out, timeout=120)
        assert res.returncode == 0, res.stderr
    assert np.array_equal(np.load(tmp_path / "a" / "logits.npy"), np.load(tmp_path / "b" / "logits.npy"))
    o3 = tmp_path / "o3.k3m"
    assert k3.run("compile", src, "--out", o3, "-O3").returncode == 0
    assert_k3_error(k3.run("run", o3, *args, "--output-dir", tmp_path / "c"), "planned")


@pytest.mark.parametrize("preset", ["k3-small", "moe-swiglu-small"])
def test_static_prefill_dense_moe_runs_only_chosen_experts(k3: K3Runner, checkpoints, ref_model, tmp_path, preset):
    """The static prefill graph mixes every expert's output by a dense [N, E]
    one-hot weight matrix (the article's form). At O3 each layer's mix is one
    k3.Moe that runs only the chosen experts -- no ScatterElements or stacked
    [E, ., .] MatMul left -- and the logits are still the reference model's."""
    import numpy as np
    import torch

    model = ref_model(checkpoints[preset])
    cfg = model.config
    src = ex.export_static(model, tmp_path / "s.onnx", batch=1, seq=8, past=CTX, phase="prefill",
                           model_dir=checkpoints[preset])["prefill"]
    rep = tmp_path / "r.json"
    res = k3.run("compile", src, "--out", tmp_path / "s3.k3m", "-O3", "--report", rep, timeout=300)
    assert res.returncode == 0, res.stderr
    (graph,) = json.loads(rep.read_text())["graphs"].values()
    assert graph["ops"].get("k3.Moe") == cfg.n_layers, graph["ops"]
    assert "onnx.ScatterElements" not in graph["ops"] and "onnx.TopK" not in graph["ops"], graph["ops"]
    ids = np.array([PROMPT + [1, 2, 3, 4]], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    with torch.no_grad():
        want, _ = model(torch.from_numpy(ids))
    for level in ("0", "3"):
        res = k3.run("run", src, "--input", f"input_ids={tmp_path / 'ids.npy'}", "--output-dir",
                     tmp_path / level, "--opt-level", level, timeout=120)
        assert res.returncode == 0, res.stderr
        got = np.load(tmp_path / level / "logits.npy")
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_kv_dtype_needs_the_planned_executor(k3: K3Runner, onnx_models, tmp_path):
    """--kv-dtype bf16 converts the lowered graph's cache (O3); a graph left
    on the ONNX interpreter (O0) keeps its own f32 cache tensors, so asking
    for bf16 there is an error rather than a silent no-op."""
    src = onnx_models("k3-small", "naive")
    rep = tmp_path / "report.json"
    res = k3.run("compile", src, "--out", tmp_path / "o3.k3m", "--kv-dtype", "bf16", "--report", rep, timeout=300)
    assert res.returncode == 0, res.stderr
    for graph in ("decode", "prefill"):
        kv = [p for p in json.loads(rep.read_text())["graphs"][graph]["passes"] if p["pass"] == "kv-cache-precision"]
        assert kv and kv[0]["applied"] == 4  # k3-small's 4 layers
    res = k3.run("compile", src, "--out", tmp_path / "o0.k3m", "-O0", "--kv-dtype", "bf16", timeout=300)
    assert_k3_error(res, "stays on the ONNX interpreter")
