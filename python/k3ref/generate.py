"""Greedy decoding with the K3 reference model, and its command line.

Usage (from the repository root)::

    PYTHONPATH=python python3 -m k3ref.generate --model DIR \
        --prompt-ids 5,17,42 [--prompt-ids 1,2 ...] --max-new-tokens N \
        [--dump-logits FILE.npy] [--json]

Each prompt is decoded independently: the whole prompt is prefilled in one
forward pass, then one token is fed per step using the KV cache. Decoding is
greedy (temperature 0; ties go to the lowest token id). A prompt stops when

* ``max_new_tokens`` tokens have been generated, or
* the generated token equals ``eos_token_id`` (that token IS included), or
* one more token would make prompt + generated exceed ``max_seq_len``.

Output: without ``--json``, one line per prompt with the generated ids,
comma-separated (an empty line if none). With ``--json``, a single JSON object
``{"generated_ids": [[...], ...]}`` on stdout.

``--dump-logits FILE.npy`` requires exactly one ``--prompt-ids``; it writes a
float32 array of shape [1, steps, vocab_size] holding the logits used to
choose each generated token: step 0 is the logits at the last prompt
position, step i the logits after feeding generated token i-1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import numpy as np
import torch

from .checkpoint import CheckpointError
from .config import ConfigError
from .model import K3Model


def greedy_generate(
    model: K3Model, prompt_ids: Sequence[int], max_new_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """Greedily decode one prompt.

    Returns (generated token ids, logits [steps, vocab_size] float32), where
    row i holds the logits the i-th generated token was chosen from.
    """
    cfg = model.config
    if len(prompt_ids) == 0:
        raise ValueError("prompt must contain at least one token")
    if len(prompt_ids) > cfg.max_seq_len:
        raise ValueError(
            f"prompt length {len(prompt_ids)} exceeds max_seq_len {cfg.max_seq_len}"
        )
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    # prompt + generated may not exceed max_seq_len.
    limit = min(max_new_tokens, cfg.max_seq_len - len(prompt_ids))
    generated: list[int] = []
    step_logits: list[torch.Tensor] = []
    if limit == 0:
        return generated, torch.empty(0, cfg.vocab_size, dtype=torch.float32)

    tokens = torch.tensor([list(prompt_ids)], dtype=torch.long)
    logits, cache = model(tokens, None, 0)  # prefill the whole prompt
    last = logits[0, -1]
    pos = len(prompt_ids)
    while True:
        # torch.argmax returns the first (lowest) index among equal maxima.
        token = int(torch.argmax(last).item())
        generated.append(token)
        step_logits.append(last.clone())
        if token == cfg.eos_token_id or len(generated) >= limit:
            break
        logits, cache = model(torch.tensor([[token]], dtype=torch.long), cache, pos)
        last = logits[0, -1]
        pos += 1
    return generated, torch.stack(step_logits)


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip() != ""]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad token id list {text!r}: {exc}") from exc
    if not ids:
        raise argparse.ArgumentTypeError("empty token id list")
    return ids


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m k3ref.generate",
        description="Greedy decoding with the K3 PyTorch reference model.",
    )
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument(
        "--prompt-ids",
        action="append",
        type=_parse_ids,
        required=True,
        metavar="ID,ID,...",
        help="comma-separated prompt token ids; repeat for several prompts",
    )
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument(
        "--dump-logits",
        metavar="FILE.npy",
        help="write float32 logits [1, steps, vocab] (needs exactly one prompt)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")
    if args.dump_logits is not None and len(args.prompt_ids) != 1:
        parser.error("--dump-logits requires exactly one --prompt-ids")

    try:
        model = K3Model.from_pretrained(args.model)
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    results: list[list[int]] = []
    all_logits: list[torch.Tensor] = []
    for prompt in args.prompt_ids:
        try:
            generated, logits = greedy_generate(model, prompt, args.max_new_tokens)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        results.append(generated)
        all_logits.append(logits)

    if args.dump_logits is not None:
        array = all_logits[0].unsqueeze(0).numpy().astype(np.float32)
        with open(args.dump_logits, "wb") as handle:  # keep the name exactly as given
            np.save(handle, array)

    if args.json:
        print(json.dumps({"generated_ids": results}))
    else:
        for generated in results:
            print(",".join(str(t) for t in generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
