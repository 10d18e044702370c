"""Compare two tensor dumps and report where they first diverge.

Usage (from the repository root)::

    PYTHONPATH=python python3 -m k3ref.compare_dumps A B [--atol 1e-4] [--rtol 1e-3]

``A`` and ``B`` are dump directories written by ``k3 generate --dump-tensors``
or ``python3 -m k3ref.dump`` (layout: ``stepN/index.json`` + ``stepN/<name>.npy``;
see docs/debugging.md). Steps are walked in order and, within a step, the
tensors in the order of A's ``index.json`` (the execution order). For every
name present in both, the shapes must agree; then

* max abs diff = max |A - B|,
* max rel diff = max abs diff / max(1, max |B|)  (B is the baseline).

A tensor exceeds the tolerance when max abs diff > atol AND max rel diff >
rtol (``--rtol 0`` makes the check purely absolute, ``--atol 0`` purely
relative); a shape mismatch or a NaN/inf that is not in both at the same place
always exceeds it. The first tensor exceeding it is marked ``<-- first
divergence`` and named on the last line. Tensors missing from one side are
listed but do not fail the comparison.

Exit status: 0 if every compared tensor is within tolerance, 1 otherwise,
2 on a usage error (e.g. a directory without any ``stepN/index.json``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


class DumpError(Exception):
    """A dump directory that cannot be read."""


@dataclass
class Row:
    step: int
    name: str
    op: str
    shape: str
    max_abs: float
    max_rel: float
    exceeds: bool
    note: str = ""


def read_steps(root: Path) -> dict[int, dict]:
    """step number -> parsed index.json of ``root/stepN``."""
    if not root.is_dir():
        raise DumpError(f"{root} is not a directory")
    steps: dict[int, dict] = {}
    for sdir in root.iterdir():
        m = re.fullmatch(r"step(\d+)", sdir.name)
        if not m or not (sdir / "index.json").is_file():
            continue
        try:
            steps[int(m.group(1))] = json.loads((sdir / "index.json").read_text())
        except (OSError, ValueError) as exc:
            raise DumpError(f"cannot read {sdir / 'index.json'}: {exc}") from exc
    if not steps:
        raise DumpError(f"{root} holds no stepN/index.json: not a tensor dump")
    return steps


def _entries(index: dict) -> dict[str, dict]:
    return {e["name"]: e for e in index.get("nodes", []) if "file" in e}


def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(max abs diff, max abs diff / max(1, max|b|)); inf where non-finite values disagree."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if a64.size == 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a64 - b64)
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
    d = np.where(same, 0.0, d)
    d = np.where(np.isnan(d), np.inf, d)
    max_abs = float(d.max())
    finite_b = np.abs(b64[np.isfinite(b64)])
    scale = max(1.0, float(finite_b.max()) if finite_b.size else 1.0)
    return max_abs, max_abs / scale


def compare(a_root: Path, b_root: Path, atol: float, rtol: float) -> tuple[list[Row], list[str], list[str]]:
    """(rows in walk order, missing-tensor lines, warnings)."""
    a_steps, b_steps = read_steps(a_root), read_steps(b_root)
    rows: list[Row] = []
    missing: list[str] = []
    warnings: list[str] = []
    for step in sorted(a_steps):
        a_idx = a_steps[step]
        if step not in b_steps:
            missing.append(f"step {step}: whole step missing from B")
            continue
        b_idx = b_steps[step]
        if a_idx.get("tokens") != b_idx.get("tokens") or a_idx.get("positions") != b_idx.get("positions"):
            warnings.append(
                f"step {step}: the dumps ran different inputs (A tokens {a_idx.get('tokens')}, "
                f"B tokens {b_idx.get('tokens')}); an earlier step chose a different token"
            )
        a_ent, b_ent = _entries(a_idx), _entries(b_idx)
        for name in b_idx.get("skipped", []):
            if name in a_ent:
                missing.append(f"step {step}: {name} (skipped by B)")
        for name, ea in a_ent.items():
            eb = b_ent.get(name)
            if eb is None:
                if name not in b_idx.get("skipped", []):
                    missing.append(f"step {step}: {name} (not in B)")
                continue
            fa, fb = a_root / f"step{step}" / ea["file"], b_root / f"step{step}" / eb["file"]
            if not fa.is_file() or not fb.is_file():
                side = "A" if not fa.is_file() else "B"
                missing.append(f"step {step}: {name} (in {side}'s index, but {side} has no {fa.name if side == 'A' else fb.name})")
                continue
            try:
                xa = np.load(fa)
            except (OSError, ValueError, EOFError) as exc:
                missing.append(f"step {step}: {name} (A's file unreadable: {exc})")
                continue
            try:
                xb = np.load(fb)
            except (OSError, ValueError, EOFError) as exc:
                missing.append(f"step {step}: {name} (B's file unreadable: {exc})")
                continue
            op = str(ea.get("op", ""))
            shape = "x".join(str(d) for d in xa.shape)
            if xa.shape != xb.shape:
                b_shape = "x".join(str(d) for d in xb.shape)
                rows.append(Row(step, name, op, shape, float("nan"), float("nan"), True, f"shape mismatch: B is {b_shape}"))
                continue
            max_abs, max_rel = diff(xa, xb)
            rows.append(Row(step, name, op, shape, max_abs, max_rel, max_abs > atol and max_rel > rtol))
        for name in b_ent:
            if name not in a_ent:
                missing.append(f"step {step}: {name} (not in A)")
    for step in sorted(set(b_steps) - set(a_steps)):
        missing.append(f"step {step}: whole step missing from A")
    return rows, missing, warnings


def _num(x: float) -> str:
    return "-" if x != x else f"{x:.3e}"


def format_report(rows: list[Row], missing: list[str], warnings: list[str], atol: float, rtol: float) -> str:
    first = next((r for r in rows if r.exceeds), None)
    name_w = max([len("name")] + [len(r.name) for r in rows])
    op_w = max([len("op")] + [len(r.op) for r in rows])
    shape_w = max([len("shape")] + [len(r.shape) for r in rows])
    lines = [
        f"{'step':>4}  {'name':<{name_w}}  {'op':<{op_w}}  {'shape':<{shape_w}}  {'max abs':>10}  {'max rel':>10}",
    ]
    for r in rows:
        flag = ""
        if r is first:
            flag = "  <-- first divergence"
        elif r.exceeds:
            flag = "  !"
        if r.note:
            flag += f"  ({r.note})"
        lines.append(
            f"{r.step:>4}  {r.name:<{name_w}}  {r.op:<{op_w}}  {r.shape:<{shape_w}}  "
            f"{_num(r.max_abs):>10}  {_num(r.max_rel):>10}{flag}"
        )
    for w in warnings:
        lines.append(f"warning: {w}")
    if missing:
        lines.append(f"missing ({len(missing)}):")
        lines += [f"  {m}" for m in missing]
    n_bad = sum(r.exceeds for r in rows)
    summary = f"compared {len(rows)} tensors (atol {atol:g}, rtol {rtol:g}): "
    if first is None:
        lines.append(summary + "all within tolerance")
    else:
        detail = first.note or f"max abs {_num(first.max_abs)}, max rel {_num(first.max_rel)}"
        lines.append(summary + f"{n_bad} exceed tolerance")
        lines.append(f"first divergence: step {first.step} {first.name} ({first.op} {first.shape}): {detail}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m k3ref.compare_dumps",
        description="Compare two tensor dumps (k3 generate --dump-tensors / k3ref.dump) "
        "and name the first tensor that diverges.",
    )
    parser.add_argument("a", metavar="A", help="dump directory (its index order is walked)")
    parser.add_argument("b", metavar="B", help="baseline dump directory (relative diffs are to B)")
    parser.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    parser.add_argument("--rtol", type=float, default=1e-3, help="tolerance of max|A-B| / max(1, max|B|) (default 1e-3)")
    args = parser.parse_args(argv)
    if args.atol < 0 or args.rtol < 0:
        parser.error("--atol and --rtol must be >= 0")
    try:
        rows, missing, warnings = compare(Path(args.a), Path(args.b), args.atol, args.rtol)
    except DumpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(rows, missing, warnings, args.atol, args.rtol))
    return 1 if any(r.exceeds for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
