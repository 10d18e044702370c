"""bench/targets.py's aggregation: each round's fractions are read from the
k3 bench and k3 profile JSON of that round, the median over rounds is judged
against the target's goal, and missing values stay missing instead of
counting as zero."""

from __future__ import annotations

import json

import pytest
from k3_e2e import load_bench_script


def _targets():
    return load_bench_script("targets")


LABELS = {"bf16": "bf16-b4.k3m", "int8": "int8-b4.k3m"}


def _bench(bf16_b1: float, bf16_b4: float, int8_b1: float, int8_b4: float | None) -> dict:
    results = [
        {"label": "bf16-b4.k3m", "batch": 1, "read_bandwidth_fraction": bf16_b1},
        {"label": "bf16-b4.k3m", "batch": 4, "read_bandwidth_fraction": bf16_b4},
        {"label": "int8-b4.k3m", "batch": 1, "read_bandwidth_fraction": int8_b1},
    ]
    if int8_b4 is not None:
        results.append({"label": "int8-b4.k3m", "batch": 4, "read_bandwidth_fraction": int8_b4})
    return {"results": results}


def _profiles(bf16: float, int8: float) -> dict:
    return {"bf16": {"step_peak_fraction": bf16}, "int8": {"step_peak_fraction": int8}}


def test_goals_per_precision_and_batch() -> None:
    t = _targets()
    rows = t.make_targets(["bf16", "int8"], [1, 4])
    goals = {name: row.goal for name, row in rows.items()}
    assert goals["decode b1 bf16: % of read bandwidth"] == 0.85
    assert goals["decode b1 int8: % of read bandwidth"] == 0.80
    assert abs(goals["decode b4 int8: % of read bandwidth"] - 1 / 1.15) < 1e-12
    assert goals["prefill int8: % of int8 peak"] == 0.5
    assert list(rows)[0].startswith("decode b1") and list(rows)[-1].startswith("prefill int8")


def test_medians_over_rounds_decide_and_missing_values_stay_missing() -> None:
    t = _targets()
    rows = t.make_targets(["bf16", "int8"], [1, 4])
    # bf16 batch 1 is above its goal in two of three rounds; int8 batch 4
    # has no result in round 2 (its median is over the two rounds it has).
    t.add_round(rows, _bench(0.90, 0.80, 0.70, 0.90), _profiles(0.45, 0.20), LABELS)
    t.add_round(rows, _bench(0.60, 0.88, 0.75, None), _profiles(0.55, 0.30), LABELS)
    t.add_round(rows, _bench(0.86, 0.85, 0.81, 0.70), {"bf16": {"step_peak_fraction": 0.52}}, LABELS)
    b1 = rows["decode b1 bf16: % of read bandwidth"]
    assert b1.values == [0.90, 0.60, 0.86] and b1.median() == 0.86 and b1.holds()
    b4 = rows["decode b4 int8: % of read bandwidth"]
    assert b4.values == [0.90, None, 0.70] and abs(b4.median() - 0.80) < 1e-12 and b4.holds() is False
    pre = rows["prefill int8: % of int8 peak"]
    assert pre.values == [0.20, 0.30, None] and abs(pre.median() - 0.25) < 1e-12 and not pre.holds()
    assert rows["prefill bf16: % of bf16 peak"].holds()

    table = t.markdown_table(rows, 3)
    lines = table.splitlines()
    assert lines[0] == "| target | round 1 | round 2 | round 3 | median | near (n) | far (n) | goal | holds |"
    # No round trip in these results: no value counts in either placement.
    assert "| decode b4 int8: % of read bandwidth | 90.0 | - | 70.0 | 80.0 | - | - | 87.0 | no |" in lines
    assert "| decode b1 bf16: % of read bandwidth | 90.0 | 60.0 | 86.0 | 86.0 | - | - | 85.0 | yes |" in lines


def _with_round_trips(bench: dict, ns: list[float | None]) -> dict:
    """bench's results, each given the core round trip k3 bench took with it."""
    for r, v in zip(bench["results"], ns):
        r["core_round_trip_ns"] = None if v is None else {"median": v, "min": v, "max": v}
    return bench


def test_each_value_counts_in_the_placement_it_was_measured_in() -> None:
    t = _targets()
    rows = t.make_targets(["bf16", "int8"], [1, 4])
    # Per round: the fractions and round trips in result order (bf16 b1,
    # bf16 b4, int8 b1, int8 b4), then each prefill profile's fraction and
    # its round trips before and after.
    rounds = [
        ((0.95, 0.90, 0.90, 0.91), [62.0, 58.0, 64.0, 61.0], (0.60, [60.0, 63.0]), (0.52, [61.0, 330.0])),
        ((0.93, 0.70, 0.72, 0.60), [330.0, 345.0, 352.0, None], (0.56, [340.0, 338.0]), (0.40, [333.0, 341.0])),
        ((0.97, 0.74, 0.76, 0.62), [320.0, 310.0, 305.0, 149.0], (0.58, None), (0.44, None)),
    ]
    for fracs, ns, (bf16, bf16_rt), (int8, int8_rt) in rounds:
        profiles = {
            "bf16": {"step_peak_fraction": bf16, "core_round_trip_ns": bf16_rt},
            "int8": {"step_peak_fraction": int8, "core_round_trip_ns": int8_rt},
        }
        t.add_round(rows, _with_round_trips(_bench(*fracs), ns), profiles, LABELS)
    b4 = rows["decode b4 bf16: % of read bandwidth"]
    assert b4.placements == ["near", "far", "far"]
    assert b4.median_in("near") == 0.90 and abs(b4.median_in("far") - 0.72) < 1e-12
    i4 = rows["decode b4 int8: % of read bandwidth"]
    assert i4.placements == ["near", None, "near"]  # 149 ns is near; a result without a round trip is neither
    assert abs(i4.median_in("near") - 0.765) < 1e-12 and i4.median_in("far") is None
    pre = rows["prefill int8: % of int8 peak"]
    assert pre.placements == [None, "far", None]  # moved between before and after; far; not measured
    assert pre.in_placement("far") == [0.40] and pre.in_placement("near") == []
    lines = t.markdown_table(rows, 3).splitlines()
    b4_line = "| decode b4 bf16: % of read bandwidth | 90.0 | 70.0 | 74.0 | 74.0 | 90.0 (1) | 72.0 (2) | 87.0 | no |"
    assert b4_line in lines
    assert "| decode b4 int8: % of read bandwidth | 91.0 | 60.0 | 62.0 | 62.0 | 76.5 (2) | - | 87.0 | no |" in lines
    assert "| prefill int8: % of int8 peak | 52.0 | 40.0 | 44.0 | 44.0 | - | 40.0 (1) | 50.0 | no |" in lines


def test_a_target_with_no_value_is_undecided() -> None:
    t = _targets()
    rows = t.make_targets(["int8"], [1])
    t.add_round(rows, {"results": []}, {}, {"int8": "int8-b1.k3m"})
    row = rows["decode b1 int8: % of read bandwidth"]
    assert row.median() is None and row.holds() is None
    assert "| - | - | 80.0 | - |" in t.markdown_table(rows, 1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--precisions", "fp16"], "unknown precision 'fp16'"),
        (["--batches", "1,x"], "--batches wants integers"),
        (["--rounds", "0"], "must be >= 1"),
        (["--gen-len", "1"], "gen length >= 2"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str) -> None:
    t = _targets()
    with pytest.raises(SystemExit) as e:
        t.main(["--model", "unused"] + argv)
    assert message in str(e.value)


def test_placement_line_reports_each_profile_round_trip() -> None:
    t = _targets()
    rounds = [
        {"bf16": {"core_round_trip_ns": [51.2, 49.8]}, "int8": {"core_round_trip_ns": [330.0, 52.4]}},
        {"bf16": {"core_round_trip_ns": None}, "int8": {}},
    ]
    line = t.placement_line(rounds, ["bf16", "int8"])
    assert line.startswith("core round trip before/after each prefill profile (ns): ")
    assert "round 1: bf16 51/50, int8 330/52" in line
    assert "round 2: bf16 -, int8 -" in line


def test_decode_placement_line_gives_each_round_range() -> None:
    t = _targets()
    benches = [
        {"results": [{"core_round_trip_ns": {"median": 61.4}}, {"core_round_trip_ns": {"median": 338.0}}]},
        {"results": [{"core_round_trip_ns": None}, {}]},
        {},
    ]
    line = t.decode_placement_line(benches)
    assert line.startswith("core round trip after the decode runs (ns): ")
    assert "round 1: 61-338" in line
    assert "round 2: -" in line and "round 3: -" in line


def test_prefill_layout_compiles_a_second_model_for_the_prefill_profiles(k3, checkpoints, tmp_path, capsys) -> None:
    """--prefill-weight-layout panels: decode runs the row-layout model, the
    prefill profile a panel-layout one compiled beside it, and the output
    says which layout each phase ran."""
    t = _targets()
    work = tmp_path / "work"
    out_json = tmp_path / "targets.json"
    rc = t.main([
        "--model", str(checkpoints["k3-tiny"]), "--precisions", "int8", "--batches", "1", "--rounds", "1",
        "--prompt-len", "8", "--gen-len", "2", "--repeat", "1", "--threads", "1",
        "--prefill-weight-layout", "panels", "--workdir", str(work), "--k3-bin", str(k3.binary),
        "--json", str(out_json),
    ])  # fmt: skip
    assert rc == 0
    assert (work / "int8-b1.k3m").is_file() and (work / "int8-panels-b1.k3m").is_file()
    assert "weight layout: decode rows, prefill panels" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["settings"]["prefill_weight_layout"] == "panels"
    prefill = [r for r in data["targets"] if r["name"].startswith("prefill int8")]
    assert len(prefill) == 1 and len(prefill[0]["values"]) == 1
