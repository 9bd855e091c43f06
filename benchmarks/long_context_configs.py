"""What `benchmarks.long_context` measures: a configuration (the unmodified model, or a window, a sink count, a share
of key/value groups made local and the score that chose them) and the head layout it gets."""

import time
from dataclasses import dataclass

import torch

from benchmarks.hybrid_tradeoff import random_layout
from hf_attn import hybridize
from hf_attn.select_heads import SCORES, choose_layout, score_named, units_per_layer

SCORE_NAMES = ("random", *SCORES)  # `random` needs no score
UNIT = "kv_group"  # only a group no global head reads shrinks the cache


@dataclass(frozen=True)
class Config:
    """One measured model: the unmodified one (`local_window` None), or a hybridized one."""

    local_window: int | None = None
    sink_tokens: int = 0
    fraction: float = 0.0
    score: str = "unmodified"
    seed: int | None = None  # random layouts only

    @property
    def shape(self) -> str:
        """What speed and memory depend on: window, sinks and share."""
        return f"k{self.local_window}-s{self.sink_tokens}-f{self.fraction:g}"

    @property
    def name(self) -> str:
        if self.local_window is None:
            return "unmodified"
        return f"{self.shape}-{self.score}" + ("" if self.seed is None else f"-seed{self.seed}")


UNMODIFIED = Config()


def score_groups(name: str, model, calibration: torch.Tensor, window: int, sinks: int, args, tokenizer) -> dict:
    """`select_heads.SCORES[name]` for (k, S), and how long it took."""
    score = score_named(name)
    hybridize(model, local_window=window, sink_tokens=sinks)  # every head global; returns attention weights (`mass`)
    start = time.perf_counter()
    scores = score(model, calibration, local_window=window, sink_tokens=sinks, batch_size=args.score_batch_size,
                   unit=UNIT, tokenizer=tokenizer)  # fmt: skip
    return {"scores": scores.tolist(), "score_seconds": time.perf_counter() - start}


def layout_for(config: Config, scores: list | None, model_config) -> list[list[str]]:
    """The head layout making `config.fraction` of the key/value groups local, by the score's order or at random."""
    heads = model_config.num_attention_heads
    if scores is not None:
        return choose_layout(torch.tensor(scores), config.fraction, heads)
    shape = (model_config.num_hidden_layers, units_per_layer(model_config, UNIT))
    return random_layout(torch.zeros(shape), config.fraction, heads, config.seed)
