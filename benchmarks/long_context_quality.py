"""The quality of one `benchmarks.long_context` configuration: passkey retrieval through the model's own cache, and
WikiText-2 test perplexity over non-overlapping blocks."""

import copy
import itertools
import math
import statistics
import time
from dataclasses import asdict

import torch
from transformers import GenerationConfig

from benchmarks.common import describe_machine
from benchmarks.long_context_configs import Config
from hf_attn.data.passkey import PasskeyPrompt, passkey_found
from hf_attn.hybrid import cache_bytes_per_token, original_cache_bytes_per_token


def passkey_answers(model, tokenizer, prompts: list[PasskeyPrompt], new_tokens: int, batch_size: int = 1) -> list[dict]:
    """Each prompt's greedy continuation (`generate`, the model's default cache) and whether it names the key.

    One prompt at a time (`batch_size` 1), prompts of one length and depth share the filler before their needle: it
    is prefilled once, and each prompt's `generate` continues from a copy of that cache, computing what prefilling the
    whole prompt would (a third less work at the default depths). Otherwise prompts of one length (each exactly that
    many tokens, so no padding) are generated `batch_size` at a time. A prompt's seconds include its share of any
    shared work."""
    generation = GenerationConfig(do_sample=False, max_new_tokens=new_tokens,
                                  eos_token_id=model.generation_config.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)  # fmt: skip

    def answer(prompt: PasskeyPrompt, continuation: torch.Tensor, seconds: float) -> dict:
        text = tokenizer.decode(continuation, skip_special_tokens=True)
        return {"length": prompt.length, "depth": prompt.depth, "key": prompt.key, "answer": text,
                "found": passkey_found(text, prompt.key), "seconds": seconds}  # fmt: skip

    answers = []
    if batch_size > 1:
        for _, group in itertools.groupby(prompts, key=lambda prompt: prompt.length):
            group = list(group)
            for batch in (group[i : i + batch_size] for i in range(0, len(group), batch_size)):
                start = time.perf_counter()
                input_ids = torch.tensor([prompt.input_ids for prompt in batch], device=model.device)
                with torch.no_grad():
                    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                            generation_config=generation)  # fmt: skip
                seconds = (time.perf_counter() - start) / len(batch)
                answers += [
                    answer(prompt, row[prompt.length :], seconds) for prompt, row in zip(batch, output, strict=True)
                ]
        return answers
    for _, group in itertools.groupby(prompts, key=lambda prompt: (prompt.length, prompt.depth)):
        group = list(group)
        start = time.perf_counter()
        shared = min(shared_prefix_length([prompt.input_ids for prompt in group]), group[0].length - 1)
        prefix = None
        if shared:
            with torch.no_grad():
                prefix = model(torch.tensor([group[0].input_ids[:shared]], device=model.device)).cache
        prefill_seconds = (time.perf_counter() - start) / len(group)
        for prompt in group:
            start = time.perf_counter()
            input_ids = torch.tensor([prompt.input_ids], device=model.device)
            with torch.no_grad():
                cache = copy.deepcopy(prefix)
                output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), cache=cache,
                                        generation_config=generation)  # fmt: skip
            answers.append(answer(prompt, output[0, prompt.length :], prefill_seconds + time.perf_counter() - start))
    return answers


def shared_prefix_length(sequences: list[list[int]]) -> int:
    """How many first tokens every sequence has in common."""
    shortest = min(map(len, sequences))
    return next((i for i in range(shortest) if len({tokens[i] for tokens in sequences}) > 1), shortest)


def accuracy(answers: list[dict], field: str) -> dict[str, float]:
    """Share of keys found per value of `field` ("length" or "depth"), keys as strings (JSON's)."""
    groups = itertools.groupby(sorted(answers, key=lambda a: a[field]), key=lambda a: a[field])
    return {f"{value:g}": statistics.fmean(a["found"] for a in group) for value, group in groups}


def block_perplexity(model, blocks: torch.Tensor) -> float:
    """exp(mean token NLL) over non-overlapping blocks (N, T), each read alone from its first token: the protocol
    the issue asks for, where `hf_attn.experiments.perplexity` slides overlapping windows."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for block in blocks:
            ids = block[None].to(model.device)
            total += model(ids, labels=ids).loss.item() * (ids.shape[-1] - 1)
            tokens += ids.shape[-1] - 1
    return math.exp(total / tokens)


def quality(model, tokenizer, prompts: list[PasskeyPrompt], test_blocks: torch.Tensor, config: Config, args) -> dict:
    """The record of `config`, `model` already hybridized to it: passkey accuracy by length and depth, perplexity and
    the KV bytes per token as a ratio to the unmodified model's."""
    answers = passkey_answers(model, tokenizer, prompts, args.new_tokens, args.passkey_batch_size)
    hybrid = config.local_window is not None
    kv_ratio = cache_bytes_per_token(model.config) / original_cache_bytes_per_token(model.config) if hybrid else 1.0
    local_heads = sum(layer.count("local") for layer in model.config.head_layout) if hybrid else 0
    return {
        "config": asdict(config), "local_heads": local_heads, "kv_ratio": kv_ratio,
        "passkey": accuracy(answers, "length"), "passkey_by_depth": accuracy(answers, "depth"),
        "passkey_seconds_per_prompt": {f"{length}": statistics.fmean(a["seconds"] for a in answers
                                                                     if a["length"] == length)
                                       for length in args.passkey_lengths},
        "perplexity": block_perplexity(model, test_blocks), "answers": answers,
        "device": describe_machine(str(model.device)),
    }  # fmt: skip
