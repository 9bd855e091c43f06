"""Scores that look for the heads a model retrieves with, on synthetic retrieval text: passkeys hidden in calibration
text and asked for at its end. `select_heads` lists them beside its own; lower means "make it local first".

- `gate_scores` (DuoAttention, Xiao et al. 2024, section 3.1): a gate in [0, 1] per unit mixes the unit's full
  attention with its sink + window attention; the model frozen, only the gates train, so that the mixed model's last
  hidden states on the recall tokens match the full model's, under an L1 penalty pulling every gate to 0 (local).
  A unit the answers need keeps its gate up.
- `retrieval_scores` (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality", section 2):
  the attention weight a head's recall queries put on the needle token they are about to copy. One forward pass per
  batch of `batch_size` samples, no training.

Legend: B batch, H query heads, H_kv key/value heads, T queries, S keys (the last T are the queries' own positions), D
head dim, k = `local_window`, s = `sink_tokens`. A local head sees the first s tokens of its sequence, the k tokens
before the query and the query itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from .attention_hf_attn import masked_sdpa
from .hybrid import ATTENTION_MODULES, num_key_value_heads
from .visibility_hf_attn import Visibility, local_visible, visibility_mask

GATED_ATTENTION = "hf_attn_gated"  # its name in transformers' attention and mask interfaces
UNITS = ("kv_group", "head")
# DuoAttention's passkeys are words of the NATO alphabet (duo_attn/data.py); the evaluation's passkeys are numbers, so
# a layout chosen on these is not fitted to the test's format.
PASSKEY_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november oscar papa "
                 "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()  # fmt: skip
ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth".split()
# A needle is prefix, passkey, suffix; its recall the question, then the passkey.
NEEDLE = ("\n\nRemember this sequence of words, it is the {ordinal} passkey:", ".\n\n")
QUESTION = "\nWhat is the {ordinal} passkey? The {ordinal} passkey is:"
# Without a tokenizer a passkey is this many random tokens of the calibration text, recalled by repeating it: the
# repeated-random-tokens probe of induction heads (Olsson et al. 2022, section 3).
KEY_TOKENS = 8
# A passkey takes 40-70 tokens with its question: this many tokens of text per passkey leave most of a block text.
TOKENS_PER_PASSKEY = 256
# Training defaults, chosen on SmolLM2-135M (see docs/hybrid.md): the paper trains 2,000 steps on 1K-32K tokens with
# lr 0.02 and a penalty of 0.05 (duo_attn/train.py). On 512-token blocks, one per step, SmolLM2's 90 gates rank their
# top half the same after 48 steps as after 64 (43 of 45 after 32) at lr 0.05; the loss is relative (`train_gates`),
# so the paper's penalty carries over.
STEPS, LEARNING_RATE, PENALTY = 48, 0.05, 0.05
# The RULER-style calibration tasks' seed: the evaluation's records (`benchmarks.ruler`, seed 42) are drawn apart.
CALIBRATION_SEED = 0
# Ranks gates that end tied (at 0 or 1) by their mean along training: the lower one went down sooner.
TIE_BREAK = 1e-3


# --- synthetic retrieval text ----------------------------------------------------------------------------------


@dataclass
class RetrievalText:
    """Calibration blocks with passkeys hidden in them and recalled at their end, all of one length.

    `ids` (N, T) token ids; `recall` (N, T) bool: the recall suffix, where hidden states are compared; `source` (N, T)
    long: for a query whose next token is a recalled passkey token, the position of that token in the needle, else -1.
    """

    ids: torch.Tensor
    recall: torch.Tensor
    source: torch.Tensor


def retrieval_text(
    calibration_ids: torch.Tensor, tokenizer=None, num_passkeys: int | None = None, seed: int = 0
) -> RetrievalText:
    """Each calibration block (N, T) becomes a sample of T tokens: the block, cut to make room, with `num_passkeys`
    needles (default: one per `TOKENS_PER_PASSKEY` tokens, 1 to 10) at random depths between 10% and 90%
    (DuoAttention's range), then a question and answer for each in turn. With a tokenizer, needle and question are
    sentences and the passkey is 8 NATO words; without, both are bare: the passkey is 8 random tokens of the block,
    recalled by repeating it."""
    if num_passkeys is None:
        num_passkeys = min(max(calibration_ids.shape[1] // TOKENS_PER_PASSKEY, 1), len(ORDINALS))
    if not 1 <= num_passkeys <= len(ORDINALS):
        raise ValueError(f"`num_passkeys` must be in 1..{len(ORDINALS)}, got {num_passkeys}")
    generator = torch.Generator().manual_seed(seed)
    samples = [passkey_sample(block, tokenizer, num_passkeys, generator) for block in calibration_ids]
    return RetrievalText(*(torch.stack(parts) for parts in zip(*samples, strict=True)))


def passkey_sample(block: torch.Tensor, tokenizer, num_passkeys: int, generator: torch.Generator):
    """(ids, recall, source) of one sample, each (T,)."""
    length = len(block)
    pieces = [passkey_pieces(block, tokenizer, ORDINALS[n], generator) for n in range(num_passkeys)]
    overhead = sum(len(prefix) + 2 * len(key) + len(suffix) + len(question) for prefix, key, suffix, question in pieces)
    haystack = length - overhead
    if haystack < length // 2:
        raise ValueError(f"Calibration blocks of {length} tokens leave {haystack} for text around {num_passkeys} "
                         f"passkeys; use longer blocks (`block_size`) or fewer `num_passkeys`.")  # fmt: skip
    depths = (0.1 + 0.8 * torch.rand(num_passkeys, generator=generator)).sort().values
    cuts = [0, *(int(depth * haystack) for depth in depths), haystack]
    ids, key_starts = [], []
    for n, (prefix, key, suffix, _) in enumerate(pieces):
        ids += block[cuts[n] : cuts[n + 1]].tolist() + prefix
        key_starts.append(len(ids))
        ids += key + suffix
    ids += block[cuts[-2] : haystack].tolist()
    recall, source = [False] * len(ids), [-1] * len(ids)
    for (_, key, _, question), start in zip(pieces, key_starts, strict=True):
        ids += question + key
        recall += [True] * (len(question) + len(key))
        source += [-1] * (len(question) + len(key))
        for offset in range(len(key)):  # the query before each recalled key token copies that token of the needle
            source[len(ids) - len(key) + offset - 1] = start + offset
    return torch.tensor(ids), torch.tensor(recall), torch.tensor(source)


def task_text(calibration_ids: torch.Tensor, tokenizer, samples_per_task: int = 2, seed: int = CALIBRATION_SEED,
              tasks: Sequence[str] | None = None) -> RetrievalText:  # fmt: skip
    """`samples_per_task` samples of each of RULER's synthetic `tasks` (default: all, `ruler.TASKS`), each a prompt of
    at most T - the task's `max_new_tokens` tokens and its answer (`", ".join(outputs)`), right-padded to T, the
    width of `calibration_ids` (N, T). The essay tasks' haystack is the calibration text itself, decoded, so neither
    it nor the seed is the evaluation's. `recall` marks the positions whose next token is the answer's."""
    from . import ruler  # RULER's words need `wonderwords` (hf_attn[ruler]); the passkey scores do not

    check_count("samples_per_task", samples_per_task, 1)
    tasks = list(ruler.TASKS) if tasks is None else list(tasks)
    if unknown := [task for task in tasks if task not in ruler.TASKS] or not tasks:
        raise ValueError(f"`tasks` must be some of {list(ruler.TASKS)}, got {unknown or tasks}")
    width = calibration_ids.shape[1]
    essay = tokenizer.decode(calibration_ids.flatten())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    samples = []
    for task in tasks:
        length = width - ruler.TASKS[task].max_new_tokens
        try:
            records = ruler.generate(task, tokenizer, length, samples_per_task, seed, essay_text=essay)
        except ValueError as error:
            raise ValueError(f"Calibration blocks of {width} tokens are too short for {task} ({error}): use longer "
                             "blocks (`block_size`) or other `tasks`") from error  # fmt: skip
        for record in records:
            prompt = tokenizer(record["input"] + record["answer_prefix"]).input_ids
            space = "" if record["answer_prefix"].endswith(" ") else " "
            answer = tokenizer(space + ", ".join(record["outputs"]) + ".", add_special_tokens=False).input_ids
            if len(prompt) + len(answer) > width:
                raise ValueError(f"A {task} sample's answer takes {len(answer)} tokens, more than the room its "
                                 f"{len(prompt)}-token prompt leaves in {width}: use longer blocks")  # fmt: skip
            padding = width - len(prompt) - len(answer)
            recall = [False] * (len(prompt) - 1) + [True] * len(answer) + [False] * (padding + 1)
            samples.append((torch.tensor(prompt + answer + [pad] * padding), torch.tensor(recall),
                            torch.full((width,), -1)))  # fmt: skip
    return RetrievalText(*(torch.stack(parts) for parts in zip(*samples, strict=True)))


def passkey_pieces(block: torch.Tensor, tokenizer, ordinal: str, generator: torch.Generator):
    """Token ids of one passkey's needle prefix, key, needle suffix and question (the key follows the question)."""
    if tokenizer is None:
        key = block[torch.randint(len(block), (KEY_TOKENS,), generator=generator)].tolist()
        return [], key, [], []
    words = " ".join(PASSKEY_WORDS[i] for i in torch.randint(len(PASSKEY_WORDS), (8,), generator=generator))
    texts = NEEDLE[0].format(ordinal=ordinal), " " + words, NEEDLE[1], QUESTION.format(ordinal=ordinal)
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


# --- the gated attention function ------------------------------------------------------------------------------


@dataclass
class Gating:
    """What `gated_attention` reads from each attention module: (layers, units) gates, 1 = full attention, 0 = sink +
    window attention; a unit is a key/value group or a query head."""

    gates: torch.Tensor
    local_window: int
    sink_tokens: int


def gated_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """query (B, H, T, D), key and value (B, H_kv, S, D), the mask transformers built (None when causal order says it
    all, else a boolean (B|1, 1, T, S)). Each head's output is gate * full + (1 - gate) * local attention, where
    local sees the first s keys and the k before the query (DuoAttention, section 3.1: "streaming attention").
    Returns (B, T, H, D) and no weights."""
    gating: Gating = module.hf_attn_state
    heads, num_queries, num_keys = query.shape[1], query.shape[-2], key.shape[-2]
    gate = gating.gates[module.layer_idx]  # (units,)
    gate = gate.repeat_interleave(heads // len(gate)).to(query.dtype).view(1, heads, 1, 1)
    key = key.repeat_interleave(heads // key.shape[1], dim=1)  # (B, H, S, D): each query head's key/value head
    value = value.repeat_interleave(heads // value.shape[1], dim=1)
    visible = visibility_mask(Visibility(True, True), num_queries, None, num_keys, query.device)  # (1, 1, T, S)
    if attention_mask is not None:
        visible = visible & attention_mask.bool()
    out = torch.zeros_like(query)
    # A kind no head uses is skipped, unless the gates train: at gate 1 the local output still gives the gradient.
    if gate.requires_grad or (gate > 0).any():
        out = out + gate * masked_sdpa(query, key, value, visible, scaling, dropout)
    if gate.requires_grad or (gate < 1).any():
        local = local_visible(visible, Visibility(True, True, gating.local_window, gating.sink_tokens))
        out = out + (1 - gate) * masked_sdpa(query, key, value, local, scaling, dropout)
    return out.transpose(1, 2), None


AttentionInterface.register(GATED_ATTENTION, gated_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GATED_ATTENTION, sdpa_mask)  # boolean masks, None where causal order suffices


@contextlib.contextmanager
def attention_as(model, implementation: str, state: object = None) -> Iterator[None]:
    """`model` runs `implementation` inside the block, each attention module holding `state` (`hf_attn_state`) for
    the function to read; as it was after."""
    modules = [module for module in model.modules() if isinstance(module, tuple(ATTENTION_MODULES.values()))]
    previous = model.config._attn_implementation
    for module in modules:
        module.hf_attn_state = state
    model.config._attn_implementation = implementation
    try:
        yield
    finally:
        model.config._attn_implementation = previous
        for module in modules:
            del module.hf_attn_state


@contextlib.contextmanager
def frozen(model) -> Iterator[None]:
    """No gradient for any weight of `model`, in eval mode, inside the block; its flags and mode restored after."""
    flags, training = [p.requires_grad for p in model.parameters()], model.training
    model.eval().requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in zip(model.parameters(), flags, strict=True):
            parameter.requires_grad_(flag)
        model.train(training)


# --- the scores ------------------------------------------------------------------------------------------------


def units_per_layer(config, unit: str) -> int:
    if unit not in UNITS:
        raise ValueError(f"`unit` must be one of {list(UNITS)}, got {unit!r}")
    return num_key_value_heads(config) if unit == "kv_group" else config.num_attention_heads


def check_count(name: str, value: int, minimum: int) -> None:
    """Refuses a count below `minimum`, or one that is no int (a bool or a float is a slip), naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}")


def check_score_arguments(local_window: int, sink_tokens: int, batch_size: int) -> None:
    """The counts every score takes, refused before any pass."""
    check_count("local_window", local_window, 1)
    check_count("sink_tokens", sink_tokens, 0)
    check_count("batch_size", batch_size, 1)


def train_gates(
    model,
    text: RetrievalText,
    *,
    local_window: int,
    sink_tokens: int,
    batch_size: int,
    unit: str,
    steps: int = STEPS,
    learning_rate: float = LEARNING_RATE,
    penalty: float = PENALTY,
) -> torch.Tensor:
    """(layers, units) gates trained on `text` (DuoAttention, section 3.1), the final value plus a tie-break by the
    mean along training. Costs N forward passes without gradient (the full model's hidden states), then `steps`
    forward and backward passes of `batch_size` samples."""
    check_score_arguments(local_window, sink_tokens, batch_size)
    check_count("steps", steps, 1)
    layers, units = model.config.num_hidden_layers, units_per_layer(model.config, unit)
    gates = torch.ones(layers, units, device=model.device, requires_grad=True)
    gating = Gating(gates, local_window, sink_tokens)
    optimizer = torch.optim.Adam([gates], lr=learning_rate)
    mean_gates = torch.zeros(layers, units, device=model.device)
    with frozen(model), attention_as(model, GATED_ATTENTION, gating):
        with torch.no_grad():  # gates at 1: the full model, the target
            targets = [last_hidden(model, text.ids[[i]], text.recall[[i]]).float() for i in range(len(text.ids))]
        scale = torch.cat(targets).pow(2).mean()  # the loss relative to the hidden states' size: one penalty fits all
        for step in range(steps):
            chosen = [(step * batch_size + i) % len(text.ids) for i in range(batch_size)]
            hidden = last_hidden(model, text.ids[chosen], text.recall[chosen]).float()
            distance = F.mse_loss(hidden, torch.cat([targets[i] for i in chosen])) / scale
            loss = distance + penalty * gates.abs().mean()  # L1 on the gates (section 3.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                gates.clamp_(0, 1)
                mean_gates += gates / steps
    return (gates.detach() + TIE_BREAK * mean_gates).cpu()


def last_hidden(model, ids: torch.Tensor, recall: torch.Tensor) -> torch.Tensor:
    """(recall positions, hidden) last hidden states (after the final norm); the LM head is not needed."""
    return model.base_model(ids.to(model.device), use_cache=False).last_hidden_state[recall.to(model.device)]


def gate_scores(model, calibration_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int,
                unit: str, tokenizer=None, steps: int = STEPS,
                num_passkeys: int | None = None) -> torch.Tensor:  # fmt: skip
    """(layers, units) DuoAttention gates, trained on passkeys hidden in `calibration_ids` (N, T). Costs N forward
    passes and `steps` forward and backward passes of `batch_size` blocks."""
    text = retrieval_text(calibration_ids, tokenizer, num_passkeys)
    return train_gates(model, text, local_window=local_window, sink_tokens=sink_tokens, batch_size=batch_size,
                       unit=unit, steps=steps)  # fmt: skip


def task_gate_scores(model, calibration_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int,
                     unit: str, tokenizer=None, steps: int = STEPS,
                     samples_per_task: int = 2) -> torch.Tensor:  # fmt: skip
    """(layers, units) DuoAttention gates trained on RULER's synthetic tasks (`task_text`) instead of passkeys: the
    answers of needles of several kinds and counts, variable chains and word counts. Costs 11 x `samples_per_task`
    forward passes and `steps` forward and backward passes of `batch_size` samples."""
    if tokenizer is None:
        raise ValueError("`tokenizer` is required: the tasks are text (RULER's templates)")
    check_score_arguments(local_window, sink_tokens, batch_size)
    text = task_text(calibration_ids, tokenizer, samples_per_task)
    return train_gates(model, text, local_window=local_window, sink_tokens=sink_tokens, batch_size=batch_size,
                       unit=unit, steps=steps)  # fmt: skip


def needle_attention(
    model, text: RetrievalText, *, local_window: int, sink_tokens: int, batch_size: int, unit: str
) -> torch.Tensor:
    """(layers, units) mean attention weight that the queries before each recalled passkey token put on that token in
    the needle (Wu et al. 2024's retrieval score, its weight rather than an argmax hit); a key/value group scores as
    its most retrieving head. Needle tokens among the sinks or in the window do not count: a local head keeps those.
    One forward pass per `batch_size` samples, with every attention weight (eager attention)."""
    check_score_arguments(local_window, sink_tokens, batch_size)
    layers, units = model.config.num_hidden_layers, units_per_layer(model.config, unit)
    totals, count = torch.zeros(layers, model.config.num_attention_heads), 0
    with frozen(model), attention_as(model, "eager"), torch.no_grad():
        for start in range(0, len(text.ids), batch_size):
            ids, source = text.ids[start : start + batch_size], text.source[start : start + batch_size]
            rows, queries = (source >= 0).nonzero(as_tuple=True)
            sources = source[rows, queries]
            far = ((queries - sources > local_window) & (sources >= sink_tokens)).float()  # (copying queries,)
            attentions = model.base_model(ids.to(model.device), use_cache=False, output_attentions=True).attentions
            for layer, weights in enumerate(attentions):  # (B, H, T, S)
                on_source = weights[rows, :, queries, sources].float().cpu()  # (copying queries, H)
                totals[layer] += (on_source * far[:, None]).sum(0)
            count += len(rows)
    return (totals / max(count, 1)).view(layers, units, -1).amax(-1)


def retrieval_scores(model, calibration_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int,
                     unit: str, tokenizer=None, num_passkeys: int | None = None) -> torch.Tensor:  # fmt: skip
    """(layers, units) attention on the needle (`needle_attention`) of passkeys hidden in `calibration_ids` (N, T).
    Costs N / `batch_size` forward passes."""
    text = retrieval_text(calibration_ids, tokenizer, num_passkeys)
    return needle_attention(model, text, local_window=local_window, sink_tokens=sink_tokens, batch_size=batch_size,
                            unit=unit)  # fmt: skip


__all__ = [
    "gate_scores",
    "task_gate_scores",
    "task_text",
    "retrieval_scores",
    "retrieval_text",
    "train_gates",
    "needle_attention",
    "gated_attention",
    "GATED_ATTENTION",
]
