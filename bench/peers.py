"""Peer comparison in one command: K3 vs PyTorch eager vs ONNX Runtime, same weights.

Usage (from the repository root)::

    .venv/bin/python bench/peers.py --model DIR [--prompt-len 128] [--gen-len 128]
        [--threads 2] [--repeat 3] [--warmup 1] [--rounds 1] [--json FILE] [--markdown FILE]

Every engine runs the same checkpoint, batch 1, the same prompt length P,
generation length G and thread count T, one engine after another (never two
at once). Decoding is greedy everywhere (K3 runs ``k3 bench --temp 0``) and
every run generates exactly G tokens (no EOS stop). Per engine, after
``--warmup`` unmeasured runs, each of ``--repeat`` runs measures

* prefill: the forward pass over the P prompt tokens plus choosing the first
  token -- prefill tok/s = P / prefill seconds (K3: P / ttft_ms.median);
* decode: the remaining G-1 steps, one token each through the KV cache --
  decode tok/s = (G-1) / decode seconds (K3: decode_tokens_per_s.median);

and the table reports the medians and each engine's ratio to K3 (> 1: faster
than K3). ``--rounds N`` runs the whole sequence of engines N times in turn
and reports, per engine, the median over rounds, and for every ratio the
median of the N ratios taken within one round: on a host whose bandwidth
drifts by half within minutes, two engines measured minutes apart compare
the host's moods, while a ratio within a round compares the engines. An "other load" column gives the CPU (in cores) that other
processes used while each engine ran: on a shared machine, numbers taken with
other load well above 0 are disturbed (a 2-thread engine on 2 busy cores can
lose an order of magnitude) and should be re-run.

Engines:

* **K3** -- ``build/bin/k3 bench --model DIR --batch 1 --prompt-len P
  --gen-len G --threads T --repeat R --warmup W --temp 0 --no-sysinfo --json``
  (``$K3_BIN`` or ``--k3-bin`` to use another binary).
* **K3 -O0 / -O3 (ONNX)** -- engine ``k3onnx``: the naive ONNX export that
  ONNX Runtime runs, compiled by K3 in memory at O0 (the graph op by op on
  the interpreter, the article's baseline) and at O3 (fused and lowered to
  the planned executor): ``k3 bench --model model.onnx --compare O0,O3``.
* **PyTorch eager** -- the k3ref reference model (``torch.set_num_threads(T)``,
  inference mode, KV cache by concatenation).
* **ONNX Runtime** -- the naive ONNX export of the same checkpoint
  (``k3ref.export_onnx``, exported on the fly into a temp dir before any
  timing), CPU provider, ORT_ENABLE_ALL, ``intra_op_num_threads=T``;
  present -> past fed back each step.
* **llama.cpp** -- the same checkpoint exported to GGUF (``k3ref.export_gguf``,
  ``--gguf-type f32|bf16|q8_0``; rmsnorm + swiglu models such as
  ``moe-swiglu-base``), run through llama-cpp-python built from source with
  native flags (``CMAKE_ARGS=-DGGML_NATIVE=ON pip install --no-binary
  llama-cpp-python llama-cpp-python``), ``n_threads=T``; greedy on its logits.
  Its greedy tokens are compared with PyTorch's (same weights, so they match
  in f32).

``--k3-model`` runs K3 on another file of the same weights (e.g. a bf16
``.k3m`` from ``k3 compile --precision bf16``) to compare like with like.
``--precisions fp32,bf16,int8`` does that for each precision in one run:
K3 on the checkpoint compiled at that precision (``k3 compile --precision``)
and llama.cpp on the matching GGUF (f32, bf16, q8_0), and the table adds the
ratio of K3 to each peer row at the same precision. ``--k3-kv-dtype bf16``
compiles those models with a bf16 KV cache (``k3 compile --kv-dtype``);
llama.cpp keeps its cache in f16 unless told otherwise, so that is the
closer match, while the default f32 cache is K3's exact one.

Peers come from PyPI (onnxruntime, see python/requirements-export.txt);
nothing is vendored. ``--json`` writes settings, machine and raw per-run
times; ``--markdown`` writes the table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from k3ref import K3Config, K3Model, load_config  # noqa: E402

PROMPT_SEED = 1234


@dataclass
class EngineResult:
    """One row of the table; ``None`` throughput means the engine did not run."""

    engine: str
    prefill_tok_s: Optional[float] = None
    decode_tok_s: Optional[float] = None
    note: str = ""
    #: CPU time other processes used while this engine ran, in cores (0 = quiet).
    other_load_cores: Optional[float] = None
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    #: Weight precision of this row (fp32, bf16, int8) when --precisions is used.
    precision: Optional[str] = None
    #: Ratios (medians over rounds of the ratio within each round): this row
    #: over K3 (decode, prefill), and K3 at this row's precision over this row.
    decode_vs_k3: Optional[float] = None
    prefill_vs_k3: Optional[float] = None
    k3_same_decode: Optional[float] = None
    k3_same_prefill: Optional[float] = None


@dataclass
class Settings:
    model: str
    prompt_len: int
    gen_len: int
    threads: int
    repeat: int
    warmup: int
    batch: int = 1
    decoding: str = "greedy"


# --------------------------------------------------------------------------
# Timing harness shared by the Python-driven peers
# --------------------------------------------------------------------------

# A step function: (new token ids [1, T], cache or None) -> (last logits [V], cache).
StepFn = Callable[[np.ndarray, Any], tuple[np.ndarray, Any]]


def time_generation(
    step: StepFn, prompt: np.ndarray, gen_len: int
) -> tuple[float, float, list[int]]:
    """Greedy prefill + (gen_len - 1) decode steps -> (prefill s, decode s, ids)."""
    t0 = time.perf_counter()
    last, cache = step(prompt, None)
    token = int(np.argmax(last))
    t1 = time.perf_counter()
    generated = [token]
    for _ in range(gen_len - 1):
        last, cache = step(np.array([[token]], dtype=np.int64), cache)
        token = int(np.argmax(last))
        generated.append(token)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, generated


def measure(name: str, step: StepFn, settings: Settings, prompt: np.ndarray) -> EngineResult:
    """Warm-up runs, then ``repeat`` timed runs; medians to tok/s."""
    result = EngineResult(name)
    for rep in range(settings.warmup + settings.repeat):
        prefill_s, decode_s, generated = time_generation(step, prompt, settings.gen_len)
        if rep < settings.warmup:
            continue
        result.prefill_s.append(prefill_s)
        result.decode_s.append(decode_s)
        result.generated = generated
    result.prefill_tok_s = settings.prompt_len / statistics.median(result.prefill_s)
    if settings.gen_len > 1:
        result.decode_tok_s = (settings.gen_len - 1) / statistics.median(result.decode_s)
    return result


class OtherLoad:
    """Measures the CPU other processes used during a ``with`` block, in cores.

    Busy jiffies of the whole machine (/proc/stat) minus this process's and
    its waited-for children's CPU time (os.times), over the wall time. On a
    shared machine a value well above 0 means the numbers are disturbed.
    """

    def __enter__(self) -> "OtherLoad":
        self.cores: Optional[float] = None
        self._start = (self._busy_s(), self._own_s(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        busy, own, wall = self._busy_s(), self._own_s(), time.perf_counter()
        if self._start[0] is not None and busy is not None and wall > self._start[2]:
            other = (busy - self._start[0]) - (own - self._start[1])
            self.cores = max(0.0, other / (wall - self._start[2]))

    @staticmethod
    def _busy_s() -> Optional[float]:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except (OSError, IndexError):
            return None
        ticks = [int(x) for x in fields[:8]]
        idle = ticks[3] + ticks[4]  # idle + iowait
        return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------


def k3_binary(explicit: Optional[str]) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("K3_BIN", "").strip()
    return Path(env) if env else REPO / "build" / "bin" / "k3"


def run_k3(
    binary: Path,
    settings: Settings,
    workdir: Path,
    k3_model: Optional[str] = None,
    compare: Optional[str] = None,
) -> list[EngineResult]:
    """``k3 bench`` at batch 1 (with ``compare``: ``--compare O0,O3`` of one
    model); one row per result of its JSON."""
    out = workdir / "k3-bench.json"
    cmd = [
        str(binary),
        "bench",
        "--model",
        k3_model or settings.model,
        *(["--compare", compare] if compare else []),
        "--batch",
        "1",
        "--prompt-len",
        str(settings.prompt_len),
        "--gen-len",
        str(settings.gen_len),
        "--threads",
        str(settings.threads),
        "--repeat",
        str(settings.repeat),
        "--warmup",
        str(settings.warmup),
        "--temp",
        "0",
        "--no-sysinfo",
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    labels = [f"K3 -{c} (ONNX)" for c in compare.split(",")] if compare else ["K3"]
    if proc.returncode != 0:
        note = f"k3 bench failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
        return [EngineResult(label, note=note) for label in labels]
    points = json.loads(out.read_text())["results"]
    return [
        EngineResult(
            label,
            prefill_tok_s=settings.prompt_len / point["ttft_ms"]["median"] * 1000.0,
            decode_tok_s=point["decode_tokens_per_s"]["median"],
            note="k3 bench --temp 0" + (f" --compare {compare} on the naive ONNX export" if compare else ""),
        )
        for label, point in zip(labels, points)
    ]


def run_llama_cpp(gguf_path: Path, gguf_type: str, settings: Settings, prompt: np.ndarray) -> EngineResult:
    """llama.cpp (llama-cpp-python) on the GGUF export of the same weights."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=settings.prompt_len + settings.gen_len,
        n_batch=settings.prompt_len,
        n_threads=settings.threads,
        n_threads_batch=settings.threads,
        verbose=False,
    )
    vocab = llm.n_vocab()

    def step(ids: np.ndarray, cache: Any) -> tuple[np.ndarray, Any]:
        if cache is None:
            llm.reset()
        llm.eval([int(t) for t in ids[0]])
        # Without logits_all, llama-cpp-python keeps no copy: read llama.cpp's
        # logits of the last evaluated token directly.
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).copy(), True

    result = measure("llama.cpp", step, settings, prompt)
    result.note = f"llama-cpp-python {llama_cpp.__version__}, GGUF {gguf_type}"
    return result


# K3 weight precision -> the GGUF type llama.cpp runs for it.
GGUF_TYPE_OF = {"fp32": "f32", "bf16": "bf16", "int8": "q8_0"}


def run_llama_at(
    model_dir: str, gguf_type: str, settings: Settings, prompt: np.ndarray, workdir: Path
) -> EngineResult:
    """Export the checkpoint to GGUF of ``gguf_type`` and run llama.cpp on it."""
    try:
        import llama_cpp  # noqa: F401

        from k3ref.export_gguf import export_gguf
    except ImportError as exc:
        return EngineResult("llama.cpp", note=f"not run: {exc} (see the docstring to build it)")
    gguf_path = workdir / f"model.{gguf_type}.gguf"
    print(f"exporting GGUF ({gguf_type}) ...", file=sys.stderr)
    try:
        export_gguf(model_dir, gguf_path, gguf_type)
    except ValueError as exc:
        return EngineResult("llama.cpp", note=f"not run: {exc}")
    print(f"llama.cpp {gguf_type} ...", file=sys.stderr)
    # In a child process: a crash inside llama.cpp (its AMX int8 path
    # segfaults on some hosts, ggml-org/llama.cpp#20824) becomes a row that
    # says so instead of ending the whole comparison.
    try:
        with OtherLoad() as load, ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            result = pool.submit(run_llama_cpp, gguf_path, gguf_type, settings, prompt).result()
        result.other_load_cores = load.cores
    except BrokenProcessPool:
        result = EngineResult("llama.cpp", note=f"not run: llama.cpp died on GGUF {gguf_type} (see stderr)")
    finally:
        gguf_path.unlink(missing_ok=True)  # several GB at f32; one at a time
    return result


def run_torch(model: K3Model, settings: Settings, prompt: np.ndarray) -> EngineResult:
    """The k3ref reference model in eager PyTorch."""
    torch.set_num_threads(settings.threads)

    def step(ids: np.ndarray, cache: Any) -> tuple[np.ndarray, Any]:
        start = 0 if cache is None else cache[0][0].shape[2]
        with torch.inference_mode():
            logits, cache = model(torch.from_numpy(ids), cache, start)
        return logits[0, -1].numpy(), cache

    result = measure("PyTorch eager", step, settings, prompt)
    result.note = f"torch {torch.__version__}, k3ref reference"
    return result


def run_onnxruntime(
    onnx_path: Path, config: K3Config, settings: Settings, prompt: np.ndarray, exporter: str
) -> EngineResult:
    """ONNX Runtime CPU on the naive export."""
    import onnxruntime as ort

    from k3ref.export_onnx import OrtNaiveSession, empty_past

    session = OrtNaiveSession(
        onnx_path,
        config,
        threads=settings.threads,
        graph_optimization=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    )

    def step(ids: np.ndarray, cache: Any) -> tuple[np.ndarray, Any]:
        past = empty_past(config, 1) if cache is None else cache
        logits, present = session.step(ids, past)
        return logits[0, -1], present

    result = measure("ONNX Runtime", step, settings, prompt)
    result.note = f"onnxruntime {ort.__version__}, naive export ({exporter}), ORT_ENABLE_ALL"
    return result


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b <= 0 else a / b


def set_ratios(rows: Sequence[EngineResult]) -> None:
    """Fill each row's ratio fields from this one round's throughputs."""
    k3 = next((r for r in rows if r.engine in ("K3", "K3 fp32")), None)
    # With --precisions: K3 at a row's precision against that row.
    k3_at = {r.precision: r for r in rows if r.precision and r.engine.startswith("K3")}
    for r in rows:
        r.decode_vs_k3 = _div(r.decode_tok_s, k3.decode_tok_s) if k3 else None
        r.prefill_vs_k3 = _div(r.prefill_tok_s, k3.prefill_tok_s) if k3 else None
        same = k3_at.get(r.precision) if r.precision and not r.engine.startswith("K3") else None
        r.k3_same_decode = _div(same.decode_tok_s, r.decode_tok_s) if same else None
        r.k3_same_prefill = _div(same.prefill_tok_s, r.prefill_tok_s) if same else None


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def combine_rounds(rounds: Sequence[Sequence[EngineResult]]) -> list[EngineResult]:
    """One row per engine: medians over rounds of throughputs and of ratios."""
    for rows in rounds:
        set_ratios(rows)
    combined = []
    for i, first in enumerate(rounds[0]):
        same = [rows[i] for rows in rounds]
        assert all(r.engine == first.engine for r in same), "engines ran in a different order"
        row = EngineResult(first.engine, note=first.note, precision=first.precision)
        row.generated = same[-1].generated
        for name in ("prefill_tok_s", "decode_tok_s", "decode_vs_k3", "prefill_vs_k3", "k3_same_decode",
                     "k3_same_prefill"):
            setattr(row, name, _median([getattr(r, name) for r in same]))
        loads = [r.other_load_cores for r in same if r.other_load_cores is not None]
        row.other_load_cores = max(loads) if loads else None
        for r in same:
            row.prefill_s += r.prefill_s
            row.decode_s += r.decode_s
        combined.append(row)
    return combined


def _fmt_ratio(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f}x"


def markdown_table(
    rows: Sequence[EngineResult], settings: Settings, machine: dict[str, Any], rounds: int = 1
) -> str:
    per = (
        f"{rounds} rounds of all engines in turn (medians over rounds; each ratio is the median "
        "of the ratios within a round)"
        if rounds > 1
        else "one round"
    )
    lines = [
        f"Model `{settings.model}`; batch 1, prompt {settings.prompt_len}, "
        f"gen {settings.gen_len} ({settings.decoding}), threads {settings.threads}, "
        f"repeat {settings.repeat} (medians), warmup {settings.warmup}, {per}.",
        f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, "
        f"{machine['platform']}.",
        "",
        "(other load: CPU cores other processes used during that engine's runs"
        f"{', the most of any round' if rounds > 1 else ''}; well above 0 = disturbed numbers.)",
        "",
        "| engine | prefill tok/s | decode tok/s | decode ratio vs K3 "
        "| prefill ratio vs K3 | K3 same precision vs it (decode / prefill) | other load | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        vs = (
            f"{_fmt_ratio(r.k3_same_decode)} / {_fmt_ratio(r.k3_same_prefill)}"
            if r.k3_same_decode is not None or r.k3_same_prefill is not None
            else ""
        )
        lines.append(
            f"| {r.engine} | {_fmt(r.prefill_tok_s)} | {_fmt(r.decode_tok_s)} | "
            f"{_fmt_ratio(r.decode_vs_k3)} | {_fmt_ratio(r.prefill_vs_k3)} | {vs} | "
            f"{_fmt(r.other_load_cores, 2)} | {r.note} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/peers.py",
        description="Decode/prefill tok/s of K3 and its peers on the same K3 weights.",
    )
    parser.add_argument("--model", required=True, help="K3 checkpoint directory")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs per engine first")
    parser.add_argument(
        "--rounds", type=int, default=1, help="run all engines in turn this many times (ratios within rounds)"
    )
    parser.add_argument(
        "--engines",
        default="k3,k3onnx,torch,ort",
        help="comma-separated subset of k3,k3onnx,torch,ort,llama (default k3,k3onnx,torch,ort)",
    )
    parser.add_argument(
        "--k3-model", default=None, help="model file K3 runs (default --model; e.g. a bf16 .k3m)"
    )
    parser.add_argument(
        "--gguf-type", choices=("f32", "bf16", "q8_0"), default="f32", help="weights llama.cpp runs"
    )
    parser.add_argument(
        "--precisions",
        default=None,
        help="comma-separated fp32,bf16,int8: K3 compiled at each and llama.cpp on the matching "
        "GGUF (f32, bf16, q8_0), one run (replaces --k3-model and --gguf-type)",
    )
    parser.add_argument(
        "--k3-kv-dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="with --precisions: K3's KV cache (k3 compile --kv-dtype); llama.cpp's is f16 by default",
    )
    parser.add_argument(
        "--k3-bin", default=None, help="k3 binary (default $K3_BIN or build/bin/k3)"
    )
    parser.add_argument(
        "--exporter",
        choices=("torchscript", "dynamo"),
        default="torchscript",
        help="ONNX exporter for the ONNX Runtime peer",
    )
    parser.add_argument("--json", metavar="FILE", help="write settings, machine and results")
    parser.add_argument("--markdown", metavar="FILE", help="write the Markdown table")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    engines = {e.strip() for e in args.engines.split(",") if e.strip()}
    if not engines <= {"k3", "k3onnx", "torch", "ort", "llama"}:
        parser.error(f"unknown engine(s) in --engines {args.engines!r}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()] if args.precisions else []
    if not set(precisions) <= set(GGUF_TYPE_OF):
        parser.error(f"unknown precision(s) in --precisions {args.precisions!r} (fp32, bf16, int8)")
    if min(args.prompt_len, args.gen_len, args.threads, args.repeat, args.rounds) < 1 or args.warmup < 0:
        parser.error("--prompt-len, --gen-len, --threads, --repeat and --rounds must be >= 1; --warmup >= 0")
    config = load_config(args.model)
    if args.prompt_len + args.gen_len > config.max_seq_len:
        parser.error(
            f"prompt + gen ({args.prompt_len + args.gen_len}) exceeds max_seq_len "
            f"{config.max_seq_len}"
        )
    settings = Settings(
        str(Path(args.model).resolve()),
        args.prompt_len,
        args.gen_len,
        args.threads,
        args.repeat,
        args.warmup,
    )
    machine = machine_info()
    rng = np.random.default_rng(PROMPT_SEED)
    prompt = rng.integers(0, config.vocab_size, size=(1, args.prompt_len), dtype=np.int64)

    rows: list[EngineResult] = []
    with tempfile.TemporaryDirectory(prefix="k3-peers-") as tmp:
        workdir = Path(tmp)
        model: Optional[K3Model] = None
        onnx_path: Optional[Path] = None
        ort_note = ""
        if engines & {"torch", "ort", "k3onnx"}:
            model = K3Model.from_pretrained(args.model)
        if engines & {"ort", "k3onnx"}:
            assert model is not None
            try:
                import onnxruntime  # noqa: F401

                from k3ref.export_onnx import export_naive

                print(f"exporting the naive ONNX graph ({args.exporter}) ...", file=sys.stderr)
                t0 = time.perf_counter()
                onnx_path = export_naive(model, workdir / "model.onnx", args.exporter, args.model)
                print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            except ImportError as exc:
                ort_note = f"not run: {exc} (pip install -r python/requirements-export.txt)"

        # One engine after another; nothing else of ours runs meanwhile. With
        # --rounds, the whole sequence again, so every ratio can be taken
        # within one round.
        all_rounds: list[list[EngineResult]] = []
        for rnd in range(args.rounds):
            if args.rounds > 1:
                print(f"round {rnd + 1} of {args.rounds}", file=sys.stderr)
            rows = []
            if "k3" in engines and precisions:
                binary = k3_binary(args.k3_bin)
                for prec in precisions:
                    k3m = workdir / f"model.{prec}.kv-{args.k3_kv_dtype}.k3m"
                    compiled = k3m.is_file()  # by an earlier round
                    step = f"bench on {k3m.name}" if compiled else f"compiling {k3m.name}, then bench"
                    print(f"K3 {prec}: {step} ...", file=sys.stderr)
                    built = subprocess.CompletedProcess([], 0) if compiled else subprocess.run(
                        [str(binary), "compile", args.model, "--out", str(k3m), "--precision", prec,
                         "--kv-dtype", args.k3_kv_dtype,
                         "--input-shape", f"batch=1,ctx={args.prompt_len + args.gen_len}"],
                        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                    )
                    if built.returncode != 0:
                        rows.append(EngineResult(f"K3 {prec}", note=f"not run: {built.stderr.strip()[-300:]}",
                                                 precision=prec))
                        continue
                    with OtherLoad() as load:
                        row = run_k3(binary, settings, workdir, str(k3m))[-1]
                    row.engine, row.precision, row.other_load_cores = f"K3 {prec}", prec, load.cores
                    row.note += f" on k3 compile --precision {prec}" + (
                        f" --kv-dtype {args.k3_kv_dtype}" if args.k3_kv_dtype != "f32" else ""
                    )
                    rows.append(row)
            elif "k3" in engines:
                binary = k3_binary(args.k3_bin)
                print(f"K3: {binary} bench ...", file=sys.stderr)
                if binary.is_file():
                    with OtherLoad() as load:
                        rows.extend(run_k3(binary, settings, workdir, args.k3_model))
                    if args.k3_model:
                        rows[-1].note += f" on {Path(args.k3_model).name}"
                    rows[-1].other_load_cores = load.cores
                else:
                    rows.append(EngineResult("K3", note=f"not run: {binary} not found"))
            if "k3onnx" in engines:
                binary = k3_binary(args.k3_bin)
                if onnx_path is not None and binary.is_file():
                    print(f"K3 on the ONNX export, O0 and O3: {binary} bench --compare O0,O3 ...", file=sys.stderr)
                    with OtherLoad() as load:
                        pair = run_k3(binary, settings, workdir, str(onnx_path), compare="O0,O3")
                    for r in pair:
                        r.other_load_cores = load.cores
                    rows.extend(pair)
                else:
                    why = ort_note or f"{binary} not found"
                    rows.append(EngineResult("K3 -O0/-O3 (ONNX)", note=f"not run: {why}"))
            if "torch" in engines:
                assert model is not None
                print("PyTorch eager ...", file=sys.stderr)
                with OtherLoad() as load:
                    rows.append(run_torch(model, settings, prompt))
                rows[-1].other_load_cores = load.cores
            if "ort" in engines:
                if onnx_path is not None:
                    print("ONNX Runtime ...", file=sys.stderr)
                    with OtherLoad() as load:
                        rows.append(
                            run_onnxruntime(onnx_path, model.config, settings, prompt, args.exporter)
                        )
                    rows[-1].other_load_cores = load.cores
                else:
                    rows.append(EngineResult("ONNX Runtime", note=ort_note))
            if "llama" in engines and precisions:
                for prec in precisions:
                    rows.append(run_llama_at(args.model, GGUF_TYPE_OF[prec], settings, prompt, workdir))
                    rows[-1].engine, rows[-1].precision = f"llama.cpp {GGUF_TYPE_OF[prec]}", prec
            elif "llama" in engines:
                rows.append(run_llama_at(args.model, args.gguf_type, settings, prompt, workdir))
            all_rounds.append(rows)
        rows = combine_rounds(all_rounds)

    torch_row = next((r for r in rows if r.engine == "PyTorch eager" and r.generated), None)
    for r in rows:
        if torch_row and r.generated and r.engine.startswith(("ONNX Runtime", "llama.cpp")):
            same = torch_row.generated == r.generated
            r.note += "; same greedy tokens as PyTorch" if same else "; greedy tokens differ from PyTorch"

    table = markdown_table(rows, settings, machine, args.rounds)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        payload = {
            "settings": asdict(settings),
            "machine": machine,
            "results": [asdict(r) for r in rows],
            "rounds": [[asdict(r) for r in rnd] for rnd in all_rounds],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
