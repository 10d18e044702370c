"""``k3 compile`` end to end: a checkpoint compiled to ``.k3m`` generates the
PyTorch reference's greedy tokens at every opt level; the report and
``--list-passes`` say what ran; damaged files and bad flags fail cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3_e2e import K3Runner
from k3ref.generate import greedy_generate
from test_cli_errors import assert_k3_error

PROMPT = [5, 17, 42, 99]
STEPS = 16


def compile_model(k3: K3Runner, src: Path, out: Path, *flags: str) -> None:
    res = k3.run("compile", src, "--out", out, *flags, timeout=120)
    assert res.returncode == 0, res.stderr
    assert out.is_file()


@pytest.mark.parametrize("model", ["k3-small", "moe-swiglu-small"])
@pytest.mark.parametrize("opt_level", ["0", "3"])
def test_k3m_generates_reference_tokens(k3, checkpoints, ref_model, tmp_path, model, opt_level):
    out = tmp_path / f"{model}-O{opt_level}.k3m"
    compile_model(k3, checkpoints[model], out, "--opt-level", opt_level, "--input-shape", "batch=1,seq=32,ctx=256")
    want, _ = greedy_generate(ref_model(checkpoints[model]), PROMPT, STEPS)
    got = k3.generate_ids(out, [PROMPT], max_new_tokens=STEPS, temperature=0)
    assert got == [want]


def test_report_and_list_passes(k3, checkpoints, tmp_path):
    res = k3.run("compile", "--list-passes")
    assert res.returncode == 0 and "dead-code" in res.stdout and "memory-plan" in res.stdout
    out, rep = tmp_path / "m.k3m", tmp_path / "report.json"
    compile_model(k3, checkpoints["k3-tiny"], out, "--report", rep, "--dump-ir", tmp_path / "ir.txt")
    report = json.loads(rep.read_text())
    for graph in ("decode", "prefill"):
        g = report["graphs"][graph]
        ran = [p["pass"] for p in g["passes"] if p["ran"]]
        assert "dead-code" in ran and ran[-3:] == ["weight-precision", "pack-weights", "kv-cache-precision"]
        plan = g["memory_plan"]
        assert 0 < plan["arena_bytes"] < plan["no_reuse_bytes"]
        assert plan["saved_bytes"] == plan["no_reuse_bytes"] - plan["arena_bytes"]
        assert g["ops"]["Moe"] == 2 and g["ops"]["CachedAttention"] == 2  # k3-tiny: 2 layers
    assert report["file_bytes"] == out.stat().st_size
    ir = (tmp_path / "ir.txt").read_text()
    assert "# decode" in ir and "CachedAttention" in ir


def test_disabled_pass_is_reported_not_run(k3, checkpoints, tmp_path):
    rep = tmp_path / "report.json"
    compile_model(k3, checkpoints["k3-tiny"], tmp_path / "m.k3m", "--disable-pass", "dead-code", "--report", rep)
    passes = json.loads(rep.read_text())["graphs"]["decode"]["passes"]
    # dead-code runs twice in the pipeline (before the fusions and after fuse-rope): both skipped.
    dead = [p for p in passes if p["pass"] == "dead-code"]
    assert dead and all(p["ran"] is False for p in dead)


def test_batch_beyond_compiled_shape_is_an_error(k3, checkpoints, tmp_path):
    out = tmp_path / "b1.k3m"
    compile_model(k3, checkpoints["k3-tiny"], out, "--input-shape", "batch=1")
    res = k3.run("generate", "--model", out, "--prompt-ids", "1,2", "--prompt-ids", "3,4", "-n", "2")
    assert_k3_error(res, "compiled for 1")


@pytest.mark.parametrize(
    "cut,needle", [(0, "truncated"), (100, "truncated"), (-1, "truncated")],
)
def test_truncated_k3m_is_an_error(k3, checkpoints, tmp_path, cut, needle):
    out = tmp_path / "m.k3m"
    compile_model(k3, checkpoints["k3-tiny"], out)
    data = out.read_bytes()
    bad = tmp_path / "bad.k3m"
    bad.write_bytes(data[: cut if cut >= 0 else len(data) + cut])
    res = k3.run("generate", "--model", bad, "--prompt-ids", "1,2", "-n", "2")
    assert res.returncode > 0 and res.returncode < 128
    assert res.stderr.startswith("k3: error:") and res.stderr.count("\n") == 1


def test_corrupt_weight_byte_is_an_error(k3, checkpoints, tmp_path):
    out = tmp_path / "m.k3m"
    compile_model(k3, checkpoints["k3-tiny"], out)
    data = bytearray(out.read_bytes())
    data[-100] ^= 0x01
    bad = tmp_path / "bad.k3m"
    bad.write_bytes(bytes(data))
    assert_k3_error(k3.run("generate", "--model", bad, "--prompt-ids", "1,2", "-n", "2"), "checksum")


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--input-shape", "bogus=3"], "unknown dimension 'bogus'"),
        (["--input-shape", "batch=0"], "not a positive integer"),
        (["--disable-pass", "no-such-pass"], "unknown pass 'no-such-pass'"),
        (["--precision", "int3"], "precision 'int3'"),
        (["--weight-layout", "squares"], "--weight-layout must be rows, panels or tiles"),
        (["--precision", "bf16-f32", "--weight-layout", "tiles"], "needs --precision bf16"),
        (["--precision", "bf16-mixed", "--weight-layout", "tiles"], "needs --precision bf16"),
        (["--input-shape", "ctx=999999"], "max_seq_len"),
    ],
)
def test_bad_compile_flags(k3, checkpoints, tmp_path, flags, needle):
    res = k3.run("compile", checkpoints["k3-tiny"], "--out", tmp_path / "x.k3m", *flags)
    assert_k3_error(res, needle)
    assert not (tmp_path / "x.k3m").exists()


@pytest.mark.parametrize(
    "precision,file_ratio,read_ratio",
    [
        # bf16: 2 bytes per matrix weight instead of 4; bf16-f32 stores the
        # same bytes (only the activations' precision differs).
        ("bf16", (0.45, 0.62), (0.45, 0.6)),
        ("bf16-f32", (0.45, 0.62), (0.45, 0.6)),
        ("bf16-mixed", (0.45, 0.62), (0.45, 0.6)),
        # int8: blocks of 32 int8 + an f16 scale, 1.0625 bytes per weight
        # (0.266 of f32); the f32 embedding rows, gates and norms stay.
        ("int8", (0.25, 0.45), (0.26, 0.34)),
        # int8-channel: the same row format, its one scale in every block slot.
        ("int8-channel", (0.25, 0.45), (0.26, 0.34)),
    ],
)
def test_precision_shrinks_the_weights_read(k3, checkpoints, tmp_path, precision, file_ratio, read_ratio):
    """--precision stores Linear and expert matrices in fewer bytes: the file
    and the bytes a decode step reads shrink accordingly and generation still
    runs (its quality against fp32 is measured below and in C++)."""
    f32, low = tmp_path / "f32.k3m", tmp_path / f"{precision}.k3m"
    compile_model(k3, checkpoints["k3-small"], f32)
    compile_model(k3, checkpoints["k3-small"], low, "--precision", precision)
    ratio = low.stat().st_size / f32.stat().st_size
    assert file_ratio[0] < ratio < file_ratio[1], ratio
    a = k3.generate(f32, [PROMPT], max_new_tokens=4, temperature=0)
    b = k3.generate(low, [PROMPT], max_new_tokens=4, temperature=0)
    wb = b["weight_bytes_per_token"] / a["weight_bytes_per_token"]
    assert read_ratio[0] < wb < read_ratio[1], wb
    assert len(b["generated_ids"][0]) == 4


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-f32", "bf16-mixed", "int8"])
def test_panel_layout_keeps_greedy_tokens(k3, checkpoints, tmp_path, precision):
    """--weight-layout panels stores the matrices as k-major panels of 16 rows
    (the pack-weights pass): the file grows only by the padding of the last
    panels, the compile report says the pass applied, and greedy decoding
    gives the same tokens as the row layout (the sums differ in order only).
    With --precision bf16 the matrices are bf16dot (bf16-rounded activations)
    and become bf16dot panels, whose kernel rounds the activations too; with
    --precision bf16-f32 they are widened bf16, which the panels take, and
    with bf16-mixed the Linears are (its experts stay bf16dot rows). int8
    matrices become int8 panels (the same values and scales)."""
    rows, panels, rep = tmp_path / "rows.k3m", tmp_path / "panels.k3m", tmp_path / "report.json"
    compile_model(k3, checkpoints["k3-small"], rows, "--precision", precision)
    compile_model(k3, checkpoints["k3-small"], panels, "--precision", precision, "--weight-layout", "panels",
                  "--report", rep)
    assert 1.0 <= panels.stat().st_size / rows.stat().st_size < 1.01
    packed = [p for p in json.loads(rep.read_text())["graphs"]["decode"]["passes"] if p["pass"] == "pack-weights"]
    assert packed
    assert packed[0]["applied"] > 0
    a = k3.generate_ids(rows, [PROMPT], max_new_tokens=STEPS, temperature=0)
    b = k3.generate_ids(panels, [PROMPT], max_new_tokens=STEPS, temperature=0)
    assert a == b


def test_int8_panels_run_on_every_table_without_a_note(k3, checkpoints, tmp_path):
    """int8 panels (block or channel scales) have a SIMD kernel in every x86
    table (vpdpbusd with AVX-512 VNNI, vpmaddubsw on AVX2; the kernel tests
    hold each to the scalar table's bits), so k3 prints no note about the
    layout, and a greedy run gives the scalar table's tokens on the AVX2
    table and on the default one (the best this CPU has)."""
    for precision in ("int8", "int8-channel"):
        model = tmp_path / f"{precision}.k3m"
        compile_model(k3, checkpoints["k3-small"], model, "--precision", precision, "--weight-layout", "panels")
        ids = []
        for isa in ("scalar", "avx2", None):
            run = k3.run(*k3.generate_args(model, [PROMPT], max_new_tokens=STEPS, isa=isa))
            assert run.returncode == 0 and "k3: note" not in run.stderr, (precision, isa, run.stderr)
            ids.append(json.loads(run.stdout)["generated_ids"])
        assert ids[0] == ids[1] == ids[2], (precision, ids)


def test_weight_layout_tiles_is_the_rows_bit_for_bit(k3, checkpoints, tmp_path):
    """--weight-layout tiles stores the bf16dot matrices as contiguous AMX
    tiles (16 rows x 32 columns each, padded): the file grows by the padding
    only, and every kernel table computes the same bits as on the rows, so
    the logits of a greedy run are identical. It lays out bf16 dot-product
    weights only: without --precision bf16 it is a one-line error."""
    rows, tiles = tmp_path / "rows.k3m", tmp_path / "tiles.k3m"
    compile_model(k3, checkpoints["k3-small"], rows, "--precision", "bf16")
    compile_model(k3, checkpoints["k3-small"], tiles, "--precision", "bf16", "--weight-layout", "tiles")
    assert 1.0 <= tiles.stat().st_size / rows.stat().st_size < 1.05
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    ids_a = k3.generate_ids(rows, [PROMPT], max_new_tokens=STEPS, temperature=0, dump_logits=a)
    ids_b = k3.generate_ids(tiles, [PROMPT], max_new_tokens=STEPS, temperature=0, dump_logits=b)
    assert ids_a == ids_b
    assert a.read_bytes() == b.read_bytes()
    # Off the amx table the tiles are unpacked (slower than rows): k3 says so, once.
    noted = k3.run(*k3.generate_args(tiles, [PROMPT], max_new_tokens=1, isa="scalar"))
    assert noted.returncode == 0 and noted.stderr.count("k3: note: the matrices are in the tile layout") == 1
    plain = k3.run(*k3.generate_args(rows, [PROMPT], max_new_tokens=1, isa="scalar"))
    assert plain.returncode == 0 and "tile layout" not in plain.stderr
    bad = k3.run("compile", checkpoints["k3-small"], "--weight-layout", "tiles", "--out", tmp_path / "f.k3m")
    assert_k3_error(bad, "--weight-layout tiles", "--precision bf16")


def _quality(k3, ref, model, positions):
    res = k3.run("quality", "--ref", ref, "--model", model, "--positions", positions, "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_quality_of_bf16_against_fp32(k3, checkpoints, tmp_path):
    """k3 quality: a model against itself agrees everywhere with KL 0; bf16
    weights cost a little (KL > 0) but keep the top-1 choice almost always.
    The bounds are loose on purpose: k3-small (seed 7) measures 0.984 / 7e-4."""
    same = _quality(k3, checkpoints["k3-small"], checkpoints["k3-small"], 32)
    assert same["top1_agreement"] == 1.0 and same["mean_kl"] == 0.0
    bf16 = tmp_path / "bf16.k3m"
    compile_model(k3, checkpoints["k3-small"], bf16, "--precision", "bf16")
    q = _quality(k3, checkpoints["k3-small"], bf16, 128)
    assert q["positions"] == 128
    assert q["top1_agreement"] >= 0.9
    assert 0.0 < q["mean_kl"] < 0.01


def test_bf16_on_the_amx_table_keeps_its_quality(k3, checkpoints, tmp_path, monkeypatch):
    """The opt-in amx kernel table (K3_ISA=amx, --isa amx) runs the bf16 dot
    products on the AMX tiles, which sum in their own order: its bf16 model
    must stay within the same quality bounds as the default table's, and
    generate must say which table ran. Skipped where the CPU (or its OS)
    gives no AMX: there --isa amx is a one-line error."""
    bf16 = tmp_path / "bf16.k3m"
    compile_model(k3, checkpoints["k3-small"], bf16, "--precision", "bf16")
    probe = k3.run(*k3.generate_args(bf16, [PROMPT], max_new_tokens=1, isa="amx"))
    if probe.returncode != 0:
        assert_k3_error(probe, "--isa amx is not supported by this CPU")
        pytest.skip("no AMX on this CPU")
    out = k3.generate(bf16, [PROMPT], max_new_tokens=STEPS, temperature=0, isa="amx")
    assert out["isa"] == "amx" and len(out["generated_ids"][0]) == STEPS
    monkeypatch.setenv("K3_ISA", "amx")
    q = _quality(k3, checkpoints["k3-small"], bf16, 128)
    assert q["positions"] == 128
    assert q["top1_agreement"] >= 0.9
    assert 0.0 < q["mean_kl"] < 0.01


@pytest.mark.parametrize("precision", ["int8", "int8-channel"])
def test_quality_of_int8_against_fp32(k3, checkpoints, tmp_path, precision):
    """int8 weights cost more than bf16 but keep the top-1 choice almost
    always; the documented bounds (docs/precision.md) are asserted here on
    k3-small, 256 teacher-forced positions, for scales per block and per
    output channel."""
    q8 = tmp_path / "q8.k3m"
    compile_model(k3, checkpoints["k3-small"], q8, "--precision", precision)
    q = _quality(k3, checkpoints["k3-small"], q8, 256)
    assert q["positions"] == 256
    assert q["top1_agreement"] >= 0.9
    assert 0.0 < q["mean_kl"] < 0.02


def test_int8_channel_panels_store_each_scale_once(k3, checkpoints, tmp_path):
    """--precision int8-channel quantizes each matrix row with one scale.
    Rows keep the int8 row format (the scale in every block slot, the same
    bytes as int8); --weight-layout panels stores it once per row (q8cp16),
    so the file shrinks by about a sixteenth of the matrix bytes, and greedy
    decoding gives the rows' tokens (the sums differ in order and rounding
    only)."""
    int8, rows, panels = tmp_path / "int8.k3m", tmp_path / "rows.k3m", tmp_path / "panels.k3m"
    compile_model(k3, checkpoints["k3-small"], int8, "--precision", "int8")
    compile_model(k3, checkpoints["k3-small"], rows, "--precision", "int8-channel")
    compile_model(k3, checkpoints["k3-small"], panels, "--precision", "int8-channel", "--weight-layout", "panels")
    assert rows.stat().st_size == int8.stat().st_size
    assert 0.93 < panels.stat().st_size / rows.stat().st_size < 0.99
    a = k3.generate_ids(rows, [PROMPT], max_new_tokens=STEPS, temperature=0)
    b = k3.generate_ids(panels, [PROMPT], max_new_tokens=STEPS, temperature=0)
    assert a == b


def test_bf16_kv_cache_costs_less_than_bf16_weights(k3, checkpoints, tmp_path):
    """--kv-dtype bf16 rounds each cached K/V row to bf16 as it is written;
    scores and sums stay f32. On k3-small (seed 7) it measures top-1 0.992 and
    KL 8e-5 over 256 positions (docs/precision.md), an order of magnitude
    below bf16 weights; the bounds here leave room."""
    kv = tmp_path / "kv.k3m"
    res = k3.run("compile", checkpoints["k3-small"], "--out", kv, "--kv-dtype", "bf16", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "kv-cache-precision matched 4, applied 4" in res.stdout + res.stderr  # k3-small's 4 layers
    q = _quality(k3, checkpoints["k3-small"], kv, 256)
    assert q["top1_agreement"] >= 0.95
    assert 0.0 < q["mean_kl"] < 0.002
    res = k3.run("compile", checkpoints["k3-tiny"], "--out", tmp_path / "x.k3m", "--kv-dtype", "fp16")
    assert_k3_error(res, "--kv-dtype must be f32 or bf16")


def test_quality_rejects_positions_beyond_context(k3, checkpoints):
    res = k3.run("quality", "--ref", checkpoints["k3-tiny"], "--model", checkpoints["k3-tiny"], "--positions", "300")
    assert_k3_error(res, "exceed the models' context")
