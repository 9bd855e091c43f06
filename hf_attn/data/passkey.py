"""Passkey retrieval: a random 5-digit key hidden in repeated filler text, asked for at the end.

The task of Mohtashami & Jaggi 2023 ("Landmark Attention", section 4.2), as StreamingLLM and DuoAttention report it:
a short instruction, the five filler sentences repeated, the needle "The pass key is 71432. Remember it. 71432 is the
pass key." at a chosen depth, then "What is the pass key? The pass key is". Only a head that reaches back to the
needle can answer, so a model whose every head is k-local fails once the needle is more than k tokens back.

Prompts are built from token ids, each piece tokenized alone, so that a prompt is exactly `length` tokens for any
tokenizer: the filler takes what the instruction, needle and question leave, cut at its start (the text just after
the instruction begins mid-sentence, as a window cut from a longer text would), and the needle goes in at the
sentence boundary nearest `depth`, the share of the filler before it.

`prompt_format="plain"` (the default) is the text alone, as the papers prompt base models. `"chat"` wraps the
instruction, filler and question in the tokenizer's chat template as one user turn and starts the assistant's answer
with "The pass key is". Plain is the default because it is the published protocol and SmolLM2-135M-Instruct answers
it better: 6 of 6 prompts at 1K and 2K tokens (depths 0.1, 0.5, 0.9), against 4 of 6 in its chat template, where at
depth 0.1 it talks about "the pass key" instead of naming it.
"""

import random
import re
from dataclasses import dataclass

INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there."
)
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_START = "The pass key is"
PROMPT_FORMATS = ("plain", "chat")
KEY_DIGITS = 5
_USER_TURN = "\x00passkey prompt\x00"  # stands for the user turn's text while the chat template is split around it


@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt: its token ids (exactly `length`), the key it hides, the requested depth and where the needle's
    first token landed."""

    input_ids: list[int]
    key: str
    length: int
    depth: float  # requested: the share of the filler tokens before the needle
    needle_start: int  # index of the needle's first token in `input_ids`


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def frame(tokenizer, prompt_format: str) -> tuple[list[int], list[int]]:
    """The token ids before the filler (special tokens, chat turn, instruction) and after it (question, answer
    start)."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"`prompt_format` must be one of {list(PROMPT_FORMATS)}, got {prompt_format!r}")
    if prompt_format == "plain":  # the tokenizer's own start tokens (a BOS), if it adds any
        return tokenizer(INSTRUCTION).input_ids, encode(tokenizer, f" {QUESTION} {ANSWER_START}")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _USER_TURN}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    before, after = rendered.split(_USER_TURN)
    return encode(tokenizer, before + INSTRUCTION), encode(tokenizer, f" {QUESTION}" + after + ANSWER_START)


def passkey_prompt(tokenizer, length: int, depth: float, key: str, prompt_format: str = "plain") -> PasskeyPrompt:
    """A prompt of exactly `length` tokens hiding `key` after the share `depth` of its filler (0: right after the
    instruction, 1: right before the question), at the nearest sentence boundary."""
    if not 0 <= depth <= 1:
        raise ValueError(f"`depth` must be in [0, 1] (the share of the filler before the needle), got {depth}")
    head, tail = frame(tokenizer, prompt_format)
    needle = encode(tokenizer, " " + NEEDLE.format(key=key))
    sentences = [encode(tokenizer, " " + sentence) for sentence in FILLER]
    budget = length - len(head) - len(needle) - len(tail)  # filler tokens
    if budget < (longest := max(map(len, sentences))):
        raise ValueError(f"`length` must leave room for a filler sentence: at least {length - budget + longest} "
                         f"tokens for this tokenizer, got {length}")  # fmt: skip
    filler, starts, index = [], [], 0
    while len(filler) < budget:
        starts.append(len(filler))
        filler += sentences[index % len(sentences)]
        index += 1
    cut = len(filler) - budget  # the first sentence loses its first `cut` tokens
    filler = filler[cut:]
    boundaries = [0] + [start - cut for start in starts if start > cut] + [budget]
    split = min(boundaries, key=lambda boundary: abs(boundary - depth * budget))
    input_ids = head + filler[:split] + needle + filler[split:] + tail
    return PasskeyPrompt(input_ids, key, length, depth, len(head) + split)


def passkey_keys(count: int, seed: int) -> list[str]:
    """`count` distinct 5-digit keys, the same for the same seed."""
    return [str(key) for key in random.Random(seed).sample(range(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS), count)]


def passkey_prompts(
    tokenizer, lengths: list[int], depths: list[float], keys_per_depth: int, seed: int = 0, prompt_format: str = "plain"
) -> list[PasskeyPrompt]:
    """`keys_per_depth` prompts per length and depth, every key distinct, by length, then depth."""
    if keys_per_depth < 1:
        raise ValueError(f"`keys_per_depth` must be >= 1, got {keys_per_depth}")
    keys = iter(passkey_keys(len(lengths) * len(depths) * keys_per_depth, seed))
    return [passkey_prompt(tokenizer, length, depth, next(keys), prompt_format)
            for length in lengths for depth in depths for _ in range(keys_per_depth)]  # fmt: skip


def passkey_found(continuation: str, key: str) -> bool:
    """Whether the model's continuation names the key: as a whole number, not inside a longer one."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", continuation) is not None


__all__ = [
    "PROMPT_FORMATS",
    "PasskeyPrompt",
    "passkey_prompt",
    "passkey_prompts",
    "passkey_keys",
    "passkey_found",
]
