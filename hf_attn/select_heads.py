"""Choose which heads of a pretrained decoder to make k-local, from calibration text.

    python -m hf_attn.select_heads MODEL --local_fraction 0.5 --local_window 64 [--sink_tokens 4] [--score gate]
        [--data FILE] [--output layout.json]

MODEL is a Hub id, a local folder, a `.gguf` file or a folder holding one (`hf_attn.pretrained`).
    hf_attn.select_heads.apply_layout(model, "layout.json")  # hybridized; its card says how the layout was chosen

Six scores, lower meaning "make it local first"; every one takes the same arguments (`SCORES`). Costs are in
forward passes at the command's defaults (16 calibration blocks of 512 tokens, `--batch_size` 4) for SmolLM2-135M
(30 layers x 3 key/value groups = 90 units); the output file records each run's own (`cost`). docs/hybrid.md's
long-context run on SmolLM2-135M-Instruct compares the layouts they choose and records their times with 4 blocks of
1,024 tokens, one a batch: on an H200 `loss` 18-23 s, `gate` 6-9 s, `mass` and `retrieval` under a second; on a
2-core CPU `gate` 13 minutes (load 3.8).

- `loss` (the default): how much the language-modelling loss on the calibration text rises when that head (or
  key/value group) alone is made local. It measures the model's predictions, but on natural text, where few tokens
  need anything far back, so it keeps fewer of the heads that retrieve than `gate`. One pass over the calibration
  blocks with nothing local, then one per unit: 91 x 16 blocks, 364 forward passes of 4.
- `mass`: the share of its attention weight a head puts beyond the window and the sinks, averaged over the queries
  that have keys that far back: exactly what the local mask removes. One pass over the blocks scores every head (4
  forward passes of 4), but it ranks the diffuse heads of the first layers above the few that retrieve.
- `gate` (DuoAttention, Xiao et al. 2024; `gate_scores.py`): a gate per unit mixing its full attention with its sink +
  window attention, trained with the model frozen so that the mixed model's last hidden states on passkey answers
  match the full model's, under an L1 penalty pulling every gate to local. It aims at what a local head must not
  lose, retrieval, and units train together, so redundancy counts. One forward pass per block for the targets (16),
  then 48 steps of a forward and backward pass of `--batch_size` blocks.
- `gate_tasks`: `gate`'s training on RULER's eleven synthetic tasks (`hf_attn.ruler`: needles of several kinds and
  counts, variable chains, word counts; 2 samples each, the calibration text as their essay haystack, seed 0) instead
  of passkeys, each sample's answer where passkeys have theirs. Passkeys keep the heads that copy one key; RULER asks
  for more. Its samples share RULER's templates with an evaluation on RULER (not its text or its draws): say so
  beside its scores. Blocks must hold a task's template and answer (1,024 tokens with GPT-2's tokenizer).
  22 forward passes for the targets, then 48 steps of a forward and backward pass of `--batch_size` samples.
- `reach` (NVIDIA kvpress's on-the-fly DuoAttention scoring; `reach_scores.py`): how far back a head's mean query
  reaches: its mean query and mean key over the calibration blocks repeated at 500 rotary positions, and the area
  under the last query's cumulated attention over them. What kvpress's DuoAttentionPress ranks heads by when it has no
  trained pattern. One pass per batch (4), no answers read; blocks of at least 500 tokens.
- `retrieval` (Wu et al. 2024; `gate_scores.py`): the attention weight a head's queries put on the needle token they
  are about to copy when they answer a passkey question. One pass per batch with attention weights (4). It finds
  the heads that copy but ranks all the others by near-zero values.

`gate` and `retrieval` hide passkeys in the calibration blocks (one per 256 tokens) and ask for them at the end.
Scoring each unit alone (`loss`, `mass`, `retrieval`) does not see redundancy: two heads that retrieve the same thing
each look dispensable. With grouped-query attention (`--unit kv_group`, the default) whole key/value groups turn local,
since only a group that no global head reads shrinks the cache; `--unit head` picks query heads. `--sink_tokens S`
lets local heads see the first S tokens too (StreamingLLM's attention sinks), as every score then assumes. The
calibration text is WikiText-2's validation split unless `--data` names a text file (never a test split):
../shared/data/wikitext-2-raw/wiki.valid.raw where it exists (beside a clone, as the training configs have it), else
the Hub's.
"""

import argparse
import contextlib
import inspect
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .data.wikitext import HUB_DATASET, WIKITEXT_FILES, read_text_file
from .experiments.arguments import below_minimums
from .gate_scores import (
    UNITS,
    check_count,
    check_score_arguments,
    gate_scores,
    retrieval_scores,
    task_gate_scores,
    units_per_layer,
)
from .hub import hub_offline
from .hybrid import family_of, hybridize
from .pretrained import load_causal_lm, load_tokenizer, source_argument
from .reach_scores import reach_scores

# WikiText-2's validation text beside a clone, where the training configs find it (relative to the working folder).
LOCAL_CALIBRATION = Path("../shared/data/wikitext-2-raw") / WIKITEXT_FILES["validation"]


def mass_beyond_window(attentions: tuple[torch.Tensor, ...], local_window: int, sink_tokens: int = 0) -> torch.Tensor:
    """(layers, heads) mean share of attention weight on keys more than `local_window` tokens before the query and
    not among the first `sink_tokens`, over the queries that have such keys; `attentions` as transformers returns
    them, (B, H, T, T) per layer."""
    num_tokens = attentions[0].shape[-1]
    positions = torch.arange(num_tokens, device=attentions[0].device)
    beyond = positions[None, :] < positions[:, None] - local_window  # (T, T): key j beyond query i's window
    beyond = beyond & (positions[None, :] >= sink_tokens)  # and not a sink
    has_beyond = beyond.any(-1)  # (T,): queries with keys that far back
    if not has_beyond.any():
        raise ValueError(f"Calibration blocks of {num_tokens} tokens have no key beyond {sink_tokens} sinks and a "
                         f"window of {local_window}.")  # fmt: skip
    scores = []
    for weights in attentions:  # (B, H, T, T)
        mass = (weights.float() * beyond).sum(-1)[..., has_beyond]  # (B, H, queries with keys beyond)
        scores.append(mass.mean((0, 2)))
    return torch.stack(scores).cpu()


def mass_scores(
    model, token_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int, unit: str, tokenizer=None
) -> torch.Tensor:
    """(layers, units) attention mass beyond the window and the sinks, averaged over `token_ids` (N, T); a key/value
    group scores as its most far-looking head. `model` must return attention weights (eager attention)."""
    check_score_arguments(local_window, sink_tokens, batch_size)
    units = units_per_layer(model.config, unit)  # a bad `unit` refused before the passes
    totals = torch.zeros(())
    for ids in batches(token_ids, batch_size, model.device):
        attentions = model(ids, output_attentions=True).attentions
        totals = totals + mass_beyond_window(attentions, local_window, sink_tokens) * len(ids)
    scores = totals / len(token_ids)
    return scores.view(len(scores), units, -1).amax(-1)


def loss_scores(
    model, token_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int, unit: str, tokenizer=None
) -> torch.Tensor:
    """(layers, units) rise of the mean language-modelling loss on `token_ids` when that unit alone is local (the
    model is hybridized in place, and left all global)."""
    check_score_arguments(local_window, sink_tokens, batch_size)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    units = units_per_layer(model.config, unit)
    hybridize(model, local_window=local_window, sink_tokens=sink_tokens)
    baseline = mean_loss(model, token_ids, batch_size)
    scores = torch.zeros(layers, units)
    for layer in range(layers):
        for index in range(units):
            local = torch.zeros(layers, units, dtype=torch.bool)
            local[layer, index] = True
            hybridize(model, head_layout=layout_of(local, heads), local_window=local_window, sink_tokens=sink_tokens)
            scores[layer, index] = mean_loss(model, token_ids, batch_size) - baseline
    hybridize(model, local_window=local_window, sink_tokens=sink_tokens)
    return scores


SCORES = {
    "loss": loss_scores,
    "mass": mass_scores,
    "gate": gate_scores,
    "retrieval": retrieval_scores,
    "gate_tasks": task_gate_scores,
    "reach": reach_scores,
}


def score_named(name: str) -> Callable[..., torch.Tensor]:
    """`SCORES[name]`, or a `ValueError` listing the scores (a `KeyError` would name neither argument nor choices)."""
    if name not in SCORES:
        raise ValueError(f"`score` must be one of {list(SCORES)}, got {name!r}")
    return SCORES[name]


def mean_loss(model, token_ids: torch.Tensor, batch_size: int) -> float:
    total = sum(model(ids, labels=ids).loss.item() * len(ids) for ids in batches(token_ids, batch_size, model.device))
    return total / len(token_ids)


def batches(token_ids: torch.Tensor, batch_size: int, device) -> Iterator[torch.Tensor]:
    with torch.no_grad():
        for start in range(0, len(token_ids), batch_size):
            yield token_ids[start : start + batch_size].to(device)


def layout_of(local: torch.Tensor, heads: int) -> list[list[str]]:
    """A head layout from (layers, units) local flags, a unit being a key/value group or a single head."""
    layers, units = local.shape
    per_head = local.view(layers, units, 1).expand(layers, units, heads // units).reshape(layers, heads)
    return [["local" if is_local else "global" for is_local in layer] for layer in per_head.tolist()]


def choose_layout(scores: torch.Tensor, local_fraction: float, heads: int) -> list[list[str]]:
    """The head layout making local the `local_fraction` of units, (layers, units) `scores`, lowest first."""
    if not 0 <= local_fraction <= 1:
        raise ValueError(f"`local_fraction` must be in [0, 1], got {local_fraction}")
    if scores.dim() != 2 or heads % scores.shape[1]:
        raise ValueError(f"`scores` must be (layers, units) with `heads` ({heads}) a multiple of units, got "
                         f"{tuple(scores.shape)}")  # fmt: skip
    local = torch.zeros(scores.numel(), dtype=torch.bool)
    local[scores.flatten().argsort(stable=True)[: round(local_fraction * scores.numel())]] = True
    return layout_of(local.view(scores.shape), heads)


def settings_of(score) -> dict:
    """A score's own keyword arguments beyond the shared ones, at their defaults (as `main` runs it)."""
    return {name: parameter.default for name, parameter in inspect.signature(score).parameters.items()
            if parameter.default is not inspect.Parameter.empty and name != "tokenizer"}  # fmt: skip


@contextlib.contextmanager
def measured_cost(model) -> Iterator[dict]:
    """Fills the yielded dict with the block's seconds and the model's passes: forward ones (each over a batch),
    those of them that were followed by a backward pass (their output needed a gradient), and their tokens."""
    cost = {"seconds": 0.0, "forward_passes": 0, "backward_passes": 0, "forward_tokens": 0}

    def count(module, args, kwargs, output) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cost["forward_passes"] += 1
        cost["forward_tokens"] += ids.numel() if ids is not None else 0
        cost["backward_passes"] += int(output[0].requires_grad)

    hook = model.base_model.register_forward_hook(count, with_kwargs=True)
    start = time.perf_counter()
    try:
        yield cost
    finally:
        cost["seconds"] = round(time.perf_counter() - start, 1)
        hook.remove()


def calibration_ids(tokenizer, data: str | None, block_size: int, num_blocks: int) -> torch.Tensor:
    """`num_blocks` consecutive blocks of `block_size` tokens from the start of the calibration text."""
    check_count("block_size", block_size, 1)
    check_count("num_blocks", num_blocks, 1)
    if data is not None:
        text = read_text_file(Path(data))
    else:
        import datasets

        text = "".join(datasets.load_dataset(*HUB_DATASET, split="validation")["text"])
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    available = len(ids) // block_size
    if available == 0:
        raise ValueError(f"The calibration text has {len(ids)} tokens, fewer than one block of {block_size}.")
    return ids[: min(available, num_blocks) * block_size].view(-1, block_size)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=source_argument, help="Hub id, local folder, .gguf file or hf_attn.pretrained "
                        "short name of a Llama, Qwen2, Qwen3, Mistral, Gemma 3 or GPT-2 model")  # fmt: skip
    parser.add_argument("--local_fraction", type=float, required=True, help="share of heads (or groups) made local")
    parser.add_argument("--local_window", type=int, required=True, help="k: previous tokens a local head sees")
    parser.add_argument("--data", help=f"calibration text file (default: {LOCAL_CALIBRATION} where it exists, else "
                        "WikiText-2 validation from the Hub)")  # fmt: skip
    parser.add_argument("--tokenizer", type=source_argument, help="tokenizer id, folder or .gguf file (default: the "
                        "model's)")  # fmt: skip
    parser.add_argument("--unit", choices=UNITS, default="kv_group", help="what turns local together")
    parser.add_argument("--score", choices=list(SCORES), default="loss", help="what ranks the units (see above)")
    parser.add_argument("--sink_tokens", type=int, default=0, help="first tokens a local head sees besides its window")
    parser.add_argument("--block_size", type=int, default=512, help="tokens per calibration block")
    parser.add_argument("--num_blocks", type=int, default=16, help="calibration blocks")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--output", default="layout.json", help="where to write the layout and the scores")
    args = parser.parse_args(argv)
    if args.data is None and LOCAL_CALIBRATION.is_file():
        args.data = str(LOCAL_CALIBRATION)
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    return args


def argument_problems(args: argparse.Namespace) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows, before any model loads."""
    problems = []
    if not 0 <= args.local_fraction <= 1:
        problems.append(f"--local_fraction must be in [0, 1], got {args.local_fraction}")
    minimums = {"local_window": 1, "sink_tokens": 0, "num_blocks": 1, "batch_size": 1}
    problems += below_minimums(args, minimums, prefix="--")
    if args.block_size <= args.sink_tokens + args.local_window + 1:
        problems.append(f"--block_size must exceed --sink_tokens + --local_window + 1 "
                        f"({args.sink_tokens + args.local_window + 1}), got {args.block_size}")  # fmt: skip
    if args.data is not None and not Path(args.data).is_file():
        problems.append(f"--data must be a calibration text file, got {args.data} (no such file)")
    elif args.data is None and hub_offline():
        problems.append(f"no --data given, no {LOCAL_CALIBRATION} here, and the Hub is offline (HF_HUB_OFFLINE): "
                        "pass --data FILE, a calibration text file")  # fmt: skip
    return problems


def main(argv: list[str] | None = None) -> dict:
    args = parse_arguments(argv)
    attention = "eager" if args.score == "mass" else None  # the mass needs attention weights
    model = load_causal_lm(args.model, attn_implementation=attention).eval()
    family_of(model.config)  # refuses what hybridize cannot take, before any scoring
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    token_ids = calibration_ids(tokenizer, args.data, args.block_size, args.num_blocks)
    score = SCORES[args.score]
    with measured_cost(model) as cost:
        scores = score(model, token_ids, local_window=args.local_window, sink_tokens=args.sink_tokens,
                       batch_size=args.batch_size, unit=args.unit, tokenizer=tokenizer)  # fmt: skip
    layout = choose_layout(scores, args.local_fraction, model.config.num_attention_heads)
    record = {
        "model": args.model, "head_layout": layout, "local_window": args.local_window,
        "local_fraction": args.local_fraction, "unit": args.unit, "score": args.score,
        "sink_tokens": args.sink_tokens, "score_settings": settings_of(score), "cost": cost,
        "scores": [[round(value, 6) for value in layer] for layer in scores.tolist()],
        "calibration": {"data": args.data or "wikitext-2-raw-v1 validation (Hub)", "blocks": len(token_ids),
                        "block_size": args.block_size},
    }  # fmt: skip
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    made_local = sum(layer.count("local") for layer in layout)
    print(f"{made_local} of {sum(map(len, layout))} heads local (k = {args.local_window}, by {args.score}, "
          f"unit {args.unit}); layout and scores: {args.output}")  # fmt: skip
    return record


# What `apply_layout` keeps of a `main` record in the config (`head_selection`): all but the scores themselves.
SELECTION_FIELDS = ("model", "score", "unit", "local_fraction", "local_window", "sink_tokens", "head_layout",
                    "score_settings", "cost", "calibration")  # fmt: skip


def apply_layout(model, record: dict | str | Path):
    """`hybridize`s `model` to the layout a `select_heads` run chose (its record, or the JSON file `main` wrote) and
    keeps in its config how the layout was chosen and what the scoring cost (`head_selection`), which its model card
    reports while the layout stays that one. Returns `model`."""
    if not isinstance(record, dict):
        record = json.loads(Path(record).read_text())
    if missing := [field for field in SELECTION_FIELDS if field not in record]:
        raise ValueError(f"`record` must be what `python -m hf_attn.select_heads` wrote; it lacks {missing}")
    hybridize(model, head_layout=record["head_layout"], local_window=record["local_window"],
              sink_tokens=record["sink_tokens"])  # fmt: skip
    model.config.head_selection = {field: record[field] for field in SELECTION_FIELDS}
    return model


if __name__ == "__main__":
    main()
