"""Batched decoding, sampling, end-of-sequence and context limit of ``k3 generate``.

(a) Batched == unbatched: three prompts of different lengths given together
    (repeated ``--prompt-ids``, and also via ``--prompt-ids-file``) produce
    exactly the ids each prompt produces alone -- greedy, and sampling with
    temperature 0.8, top-k 40, top-p 0.95, seed 123 (every sequence has its
    own RNG seeded by ``--seed``, so its draws do not depend on its batch);
    also a batch decoded with all cores vs each prompt alone on one thread.
(b) Sampling is reproducible: the same seed twice gives the same ids, a
    different seed different ids (32 tokens, k3-small).
(c) Temperature 0 ignores the seed.
(d) ``--top-k 1`` at temperature 1 is greedy.
(e) eos: with config.json's ``eos_token_id`` set to the 3rd greedy token,
    generation stops right after emitting it, with finish_reason "eos".
(f) Context limit: ``--ctx-size 16``, a 10-token prompt, ``--max-new-tokens
    100`` -> prompt + generated == 16, finish_reason "context", and the ids are
    the first 6 ids of an unlimited run.

Also: sampled tokens lie in the top-k / top-p set of the dumped logits and
follow softmax(logits / T) on it (a statistical check with fixed seeds), and
``--seed -1`` reports a seed that reproduces the run.

Most runs use ``--threads 1``: threading is not their subject, and on a busy
machine the multi-threaded decode loop can be many times slower.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from k3_e2e import PRESETS

STEPS = 24
PROMPTS = [
    [5, 17, 42, 99],
    [int(t) for t in np.random.default_rng(11).integers(0, 512, size=11)],
    [int(t) for t in np.random.default_rng(23).integers(0, 512, size=23)],
]
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 123}
#: Tests whose subject is not threading run single-threaded: on a busy machine
#: the multi-threaded decode loop can be many times slower than one thread.
ONE = {"threads": 1}
MODES = [pytest.param({"temperature": 0}, id="greedy"), pytest.param(SAMPLING, id="sampling")]


# --------------------------------------------------------------------------
# (a) batched == unbatched
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", PRESETS)
def test_batched_equals_unbatched(k3, checkpoints, model: str, mode: dict) -> None:
    path = checkpoints[model]
    alone = [k3.generate_ids(path, p, max_new_tokens=STEPS, **mode, **ONE)[0] for p in PROMPTS]
    assert all(len(ids) == STEPS for ids in alone)
    out = k3.generate(path, PROMPTS, max_new_tokens=STEPS, **mode, **ONE)
    assert out["finish_reason"] == ["length"] * len(PROMPTS)
    assert out["generated_ids"] == alone
    # The same batch in another order: each sequence is still independent.
    reordered = k3.generate_ids(path, PROMPTS[::-1], max_new_tokens=STEPS, **mode, **ONE)
    assert reordered == alone[::-1]


@pytest.mark.parametrize("model", ["k3-small", "moe-swiglu-small"])
def test_multithreaded_batch_equals_single_threaded_unbatched(k3, checkpoints, model: str) -> None:
    """The batch decoded with all cores (rows and columns split over threads)
    samples exactly what each prompt samples alone on one thread."""
    path = checkpoints[model]
    alone = [k3.generate_ids(path, p, max_new_tokens=STEPS, **SAMPLING, **ONE)[0] for p in PROMPTS]
    assert k3.generate_ids(path, PROMPTS, max_new_tokens=STEPS, **SAMPLING) == alone


def test_prompt_ids_file_equals_repeated_flags(k3, checkpoints, tmp_path: Path) -> None:
    path = checkpoints["k3-tiny"]
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("".join(",".join(map(str, p)) + "\n" for p in PROMPTS))
    from_flags = k3.generate_ids(path, PROMPTS, max_new_tokens=8, **SAMPLING, **ONE)
    res = k3.run(*k3.generate_args(path, [], max_new_tokens=8, **SAMPLING, **ONE,
                                   extra=["--prompt-ids-file", str(prompt_file)]))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["generated_ids"] == from_flags


# --------------------------------------------------------------------------
# (b)-(d) sampling
# --------------------------------------------------------------------------


def test_sampling_is_reproducible_and_seed_dependent(k3, checkpoints) -> None:
    path = checkpoints["k3-small"]
    opts = dict(SAMPLING, seed=123, **ONE)
    first = k3.generate(path, PROMPTS[0], max_new_tokens=32, **opts)
    again = k3.generate(path, PROMPTS[0], max_new_tokens=32, **opts)
    other = k3.generate(path, PROMPTS[0], max_new_tokens=32, **dict(opts, seed=124))
    assert first["seed"] == 123 and other["seed"] == 124
    assert len(first["generated_ids"][0]) == 32
    assert again["generated_ids"] == first["generated_ids"]
    assert other["generated_ids"] != first["generated_ids"]
    # Sampling at temperature 0.8 is not greedy decoding.
    greedy = k3.generate_ids(path, PROMPTS[0], max_new_tokens=32, temperature=0, **ONE)
    assert first["generated_ids"] != greedy


def test_random_seed_is_reported_and_reusable(k3, checkpoints) -> None:
    """--seed -1 picks a seed and prints it; passing it back reproduces the run."""
    path = checkpoints["k3-tiny"]
    first = k3.generate(path, PROMPTS[0], max_new_tokens=16, temperature=1.0, seed=-1, **ONE)
    seed = first["seed"]
    assert isinstance(seed, int) and seed >= 0
    again = k3.generate(path, PROMPTS[0], max_new_tokens=16, temperature=1.0, seed=seed, **ONE)
    assert again["generated_ids"] == first["generated_ids"]


def test_temperature_zero_ignores_seed(k3, checkpoints) -> None:
    path = checkpoints["k3-small"]
    runs = [
        k3.generate_ids(path, PROMPTS[1], max_new_tokens=STEPS, temperature=0, seed=seed, **ONE)
        for seed in (1, 2, 999)
    ]
    runs.append(k3.generate_ids(path, PROMPTS[1], max_new_tokens=STEPS, temperature=0,
                                top_k=40, top_p=0.95, seed=5, **ONE))  # fmt: skip
    assert all(r == runs[0] for r in runs[1:])


@pytest.mark.parametrize("model", ["k3-tiny", "k3-small"])
def test_top_k_1_is_greedy(k3, checkpoints, model: str) -> None:
    path = checkpoints[model]
    greedy = k3.generate_ids(path, PROMPTS, max_new_tokens=STEPS, temperature=0, **ONE)
    for seed in (3, 77):
        top1 = k3.generate_ids(path, PROMPTS, max_new_tokens=STEPS, temperature=1.0,
                               top_k=1, seed=seed, **ONE)  # fmt: skip
        assert top1 == greedy


def test_identical_prompts_in_a_batch_sample_identically(k3, checkpoints) -> None:
    """Every sequence has its own RNG seeded by --seed."""
    ids = k3.generate_ids(checkpoints["k3-tiny"], [PROMPTS[1]] * 3, max_new_tokens=STEPS,
                          **SAMPLING, **ONE)  # fmt: skip
    assert ids[0] == ids[1] == ids[2]


def _filtered_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """(token order by descending logit, its probabilities after temperature,
    top-k and top-p, renormalised) -- the usual sampler semantics: top-k keeps
    the k largest logits, top-p the smallest prefix whose mass reaches p."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    z = logits.astype(np.float64)[order] / temperature
    if top_k > 0:
        z = z[:top_k]
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        n = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        p = p[:n] / p[:n].sum()
    return order[: len(p)], p


SAMPLER_SETTINGS = [
    pytest.param(0.8, 40, 0.95, id="T0.8-k40-p0.95"),
    pytest.param(1.0, 0, 0.5, id="T1-p0.5"),
    pytest.param(0.5, 0, 1.0, id="T0.5"),
    pytest.param(2.0, 5, 1.0, id="T2-k5"),
]


@pytest.mark.parametrize("temperature, top_k, top_p", SAMPLER_SETTINGS)
def test_sampled_tokens_follow_the_filtered_distribution(
    k3, checkpoints, tmp_path: Path, temperature: float, top_k: int, top_p: float
) -> None:
    """With --dump-logits (the raw logits of every step), each sampled token
    must lie inside the top-k / top-p set, and over 4 x 200 draws the tokens
    must be distributed as softmax(logits / T) restricted to that set: the
    randomized probability integral transform of the draws is uniform (mean
    0.5 within 5 standard errors) and their total negative log-likelihood is
    within 5 standard deviations of the summed entropies. (Deterministic for
    fixed seeds; a wrong temperature or filter fails by far more.)"""
    path = checkpoints["k3-tiny"]
    prompt = PROMPTS[0]
    rng = np.random.default_rng(0)
    pit: list[float] = []
    nll = entropy = variance = 0.0
    for seed in (1, 2, 3, 4):
        dump = tmp_path / f"s{seed}.npy"
        out = k3.generate(path, prompt, max_new_tokens=200, temperature=temperature, top_k=top_k,
                          top_p=top_p, seed=seed, dump_logits=dump, **ONE)  # fmt: skip
        (ids,) = out["generated_ids"]
        logits = np.load(dump)[0]
        assert logits.shape == (200, 512)
        for step, (row, token) in enumerate(zip(logits, ids)):
            order, p = _filtered_probs(row, temperature, top_k, top_p)
            where = np.nonzero(order == token)[0]
            assert where.size == 1, (
                f"seed {seed} step {step}: token {token} is outside the top-k/top-p set "
                f"({len(order)} tokens)"
            )
            r = int(where[0])
            pit.append(float(p[:r].sum() + p[r] * rng.random()))
            logp = np.log(p)
            nll -= logp[r]
            h = float(-(p * logp).sum())
            entropy += h
            variance += float((p * logp**2).sum() - h * h)
    pit_mean, pit_se = float(np.mean(pit)), 1.0 / np.sqrt(12 * len(pit))
    z_nll = (nll - entropy) / np.sqrt(max(variance, 1e-12))
    print(f"PIT mean {pit_mean:.4f} (se {pit_se:.4f}), NLL z-score {z_nll:.2f}")
    assert abs(pit_mean - 0.5) < 5 * pit_se
    assert abs(z_nll) < 5


# --------------------------------------------------------------------------
# (e) eos and (f) context limit
# --------------------------------------------------------------------------


def _copy_with_config(src: Path, dst: Path, **overrides) -> Path:
    dst.mkdir()
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.update(overrides)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def test_eos_stops_generation(k3, checkpoints, tmp_path: Path) -> None:
    src = checkpoints["k3-tiny"]
    prompt = PROMPTS[0]
    plain = k3.generate(src, prompt, max_new_tokens=STEPS, temperature=0, **ONE)
    assert plain["finish_reason"] == ["length"]
    ids = plain["generated_ids"][0]
    eos = ids[2]
    assert eos not in ids[:2], "precondition: the 3rd token first occurs 3rd"
    eos_dir = _copy_with_config(src, tmp_path / "eos", eos_token_id=eos)

    dump = tmp_path / "eos.npy"
    out = k3.generate(eos_dir, prompt, max_new_tokens=STEPS, temperature=0, dump_logits=dump, **ONE)
    assert out["generated_ids"] == [ids[:3]]
    assert out["finish_reason"] == ["eos"]
    assert np.load(dump).shape == (1, 3, 512)

    # In a batch, only the sequence that emitted eos stops.
    other = k3.generate_ids(src, PROMPTS[2], max_new_tokens=STEPS, temperature=0, **ONE)[0]
    expected_other = other[: other.index(eos) + 1] if eos in other else other
    batch = k3.generate(eos_dir, [prompt, PROMPTS[2]], max_new_tokens=STEPS, temperature=0, **ONE)
    assert batch["generated_ids"] == [ids[:3], expected_other]
    assert batch["finish_reason"] == ["eos", "eos" if eos in other else "length"]


def test_context_limit(k3, checkpoints) -> None:
    path = checkpoints["k3-tiny"]
    prompt = list(range(100, 110))
    unlimited = k3.generate_ids(path, prompt, max_new_tokens=100, temperature=0, **ONE)[0]
    assert len(unlimited) == 100
    out = k3.generate(path, prompt, max_new_tokens=100, temperature=0, ctx_size=16, **ONE)
    (ids,) = out["generated_ids"]
    assert len(prompt) + len(ids) == 16
    assert out["finish_reason"] == ["context"]
    assert ids == unlimited[:6]


def test_context_limit_in_a_batch(k3, checkpoints) -> None:
    """One sequence reaching the context limit does not stop the others."""
    path = checkpoints["k3-tiny"]
    long_prompt, short_prompt = list(range(100, 110)), PROMPTS[0]
    alone = k3.generate_ids(path, short_prompt, max_new_tokens=12, temperature=0, **ONE)[0]
    unlimited = k3.generate_ids(path, long_prompt, max_new_tokens=12, temperature=0, **ONE)[0]
    out = k3.generate(path, [long_prompt, short_prompt], max_new_tokens=12, temperature=0,
                      ctx_size=16, **ONE)  # fmt: skip
    assert out["generated_ids"] == [unlimited[:6], alone]
    assert out["finish_reason"] == ["context", "length"]


def test_max_seq_len_limits_generation(k3, checkpoints) -> None:
    """Without --ctx-size the context is max_seq_len (256 for k3-tiny)."""
    path = checkpoints["k3-tiny"]
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 512, size=250)]
    out = k3.generate(path, prompt, max_new_tokens=100, temperature=0, **ONE)
    (ids,) = out["generated_ids"]
    assert len(prompt) + len(ids) == 256
    assert out["finish_reason"] == ["context"]


def test_zero_new_tokens(k3, checkpoints, tmp_path: Path) -> None:
    dump = tmp_path / "zero.npy"
    out = k3.generate(checkpoints["k3-tiny"], PROMPTS[0], max_new_tokens=0, temperature=0,
                      dump_logits=dump, **ONE)  # fmt: skip
    assert out["generated_ids"] == [[]]
    assert np.load(dump).shape == (1, 0, 512)


# --------------------------------------------------------------------------
# Output formats
# --------------------------------------------------------------------------


def test_json_fields(k3, checkpoints) -> None:
    out = k3.generate(checkpoints["k3-tiny"], PROMPTS, max_new_tokens=5, **SAMPLING)
    for key in ("generated_ids", "finish_reason", "ttft_ms", "decode_ms_per_token",
                "tokens_per_s", "seed", "threads", "isa"):  # fmt: skip
        assert key in out, key
    assert [len(ids) for ids in out["generated_ids"]] == [5, 5, 5]
    assert all(isinstance(t, int) and 0 <= t < 512 for ids in out["generated_ids"] for t in ids)
    assert out["finish_reason"] == ["length"] * 3
    for key in ("ttft_ms", "decode_ms_per_token", "tokens_per_s"):
        assert isinstance(out[key], (int, float)) and out[key] >= 0, key
    assert out["seed"] == SAMPLING["seed"]
    assert isinstance(out["threads"], int) and out["threads"] >= 1
    assert out["isa"] in ("scalar", "avx2", "avx512", "amx")
    # Only the avx512 and amx tables come with both prefetch levels.
    assert out["prefetch"] in (("l1", "l2") if out["isa"] in ("avx512", "amx") else (None,))


def test_prefetch_level_changes_speed_not_tokens(k3, checkpoints) -> None:
    """--prefetch l1 and l2 run differently instantiated tiles; the tokens
    must be the same, greedy and sampled."""
    path = checkpoints["k3-tiny"]
    probe = k3.generate(path, PROMPTS, max_new_tokens=1, temperature=0, **ONE)
    if probe["isa"] not in ("avx512", "amx"):
        pytest.skip(f"the {probe['isa']} table has one prefetch level")
    runs = {}
    for level in ("l1", "l2"):
        args = k3.generate_args(path, PROMPTS, max_new_tokens=8, **SAMPLING, **ONE) + ["--prefetch", level]
        res = k3.run(*args)
        assert res.returncode == 0, res.stderr
        runs[level] = json.loads(res.stdout)
        assert runs[level]["prefetch"] == level
    assert runs["l1"]["generated_ids"] == runs["l2"]["generated_ids"]


def test_plain_output_is_one_line_per_prompt(k3, checkpoints) -> None:
    path = checkpoints["k3-tiny"]
    expected = k3.generate_ids(path, PROMPTS, max_new_tokens=6, temperature=0, **ONE)
    args = k3.generate_args(path, PROMPTS, max_new_tokens=6, temperature=0, **ONE)
    args.remove("--json")
    res = k3.run(*args)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip("\n").split("\n")
    assert [[int(t) for t in line.split(",")] for line in lines] == expected
