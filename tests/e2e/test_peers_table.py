"""bench/peers.py's aggregation: with --rounds, throughputs are medians over
rounds and every ratio is the median of the ratios taken within a round (so
host drift between rounds cancels), and the table says so."""

from __future__ import annotations

from k3_e2e import load_bench_script


def _peers():
    return load_bench_script("peers")


def _round(peers, k3_decode: float, llama_decode: float, load: float):
    k3 = peers.EngineResult("K3 int8", prefill_tok_s=800.0, decode_tok_s=k3_decode, precision="int8")
    llama = peers.EngineResult(
        "llama.cpp q8_0", prefill_tok_s=300.0, decode_tok_s=llama_decode, precision="int8", other_load_cores=load
    )
    return [k3, llama]


def test_ratios_are_medians_of_within_round_ratios() -> None:
    peers = _peers()
    # The host is fast in round 1 and slow in rounds 2-3 for both engines;
    # K3 is 1.5x llama.cpp within every round.
    rounds = [_round(peers, 150.0, 100.0, 0.1), _round(peers, 90.0, 60.0, 0.5), _round(peers, 120.0, 80.0, 0.0)]
    k3, llama = peers.combine_rounds(rounds)
    assert k3.decode_tok_s == 120.0 and llama.decode_tok_s == 80.0  # medians over rounds
    assert abs(llama.k3_same_decode - 1.5) < 1e-12
    assert abs(llama.k3_same_prefill - 800.0 / 300.0) < 1e-12
    assert k3.k3_same_decode is None  # K3 is not compared with itself
    assert llama.other_load_cores == 0.5  # the most disturbed round is what the table shows

    # A ratio of medians differs from the median of ratios when rounds disagree.
    skew = [_round(peers, 150.0, 50.0, 0.0), _round(peers, 100.0, 100.0, 0.0), _round(peers, 60.0, 40.0, 0.0)]
    _, llama = peers.combine_rounds(skew)
    assert abs(llama.k3_same_decode - 1.5) < 1e-12  # ratios 3.0, 1.0, 1.5
    assert abs(llama.decode_tok_s - 50.0) < 1e-12 and abs(100.0 / 50.0 - 1.5) > 0.4


def test_table_names_the_rounds_and_formats_missing_ratios() -> None:
    peers = _peers()
    settings = peers.Settings("m", 128, 128, 2, 3, 1)
    machine = {"cpu": "test cpu", "logical_cpus": 2, "platform": "linux"}
    rows = peers.combine_rounds([_round(peers, 150.0, 100.0, 0.0), _round(peers, 90.0, 60.0, 0.0)])
    table = peers.markdown_table(rows, settings, machine, rounds=2)
    assert "2 rounds of all engines in turn" in table
    assert "| llama.cpp q8_0 | 300.0 | 80.0 | — | — | 1.50x / 2.67x |" in table
    one = peers.markdown_table(peers.combine_rounds([_round(peers, 150.0, 100.0, 0.0)]), settings, machine)
    assert "one round" in one
