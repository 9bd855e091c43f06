"""The models each paper compares, shared by its families: Paper A's positional and standard models (algorithmic,
mixed, induction), Paper B's global, k-local and hybrid variants (formal languages, WikiText-2)."""

import re
from dataclasses import dataclass, field

from transformers import AutoConfig

from hf_attn import experiments
from hf_attn.configuration_hf_attn import BLOCK_STYLES

PAPER_A_MODELS = ("positional", "standard")
PAPER_A_HEADS = {
    # weights from P only; no position in the residual stream
    "positional": dict(model_type="positional_gpt2", position_embedding_type="none"),
    # content attention; positions added to the input (for numbers, Paper A's code feeds [value, one-hot position]
    # to one linear map: the same function as value * w + b plus a learned position row)
    "standard": dict(model_type="hybrid_gpt2", num_local_heads=0, position_embedding_type="learned"),
}
VARIANT_PATTERN = re.compile(r"^(global|local-(\d+)|hybrid-(\d+))$")
PAPER_B_VARIANTS = ("global", "local-1", "local-2", "local-4", "hybrid-1", "hybrid-2", "hybrid-4")
VARIANTS_HELP = "`global`, `local-K` (every head K-local) or `hybrid-K` (half global, half K-local)."


def paper_a_config(kind: str, standard_qk_dim: int | None = None, **fields):
    """Paper A's `positional` or `standard` model: the same trunk, differing in head kind and where positions enter;
    a token sees itself, no dropout (Paper A's code), no BOS/EOS. `standard_qk_dim`: the standard heads' query/key
    width (Paper A's code: as wide as the model on its numeric tasks; default GPT-2's n_embd / n_head)."""
    heads = PAPER_A_HEADS[kind]
    if kind == "standard" and standard_qk_dim is not None:
        heads = {**heads, "content_qk_dim": standard_qk_dim}
    return AutoConfig.for_model(**heads, attend_to_self=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                bos_token_id=None, eos_token_id=None, **fields)  # fmt: skip


@dataclass
class PaperBModelArguments(experiments.ModelArguments):
    """The model fields both of Paper B's families have: its block, masks and embedding scale."""

    block_style: str = field(default="post_ln", metadata={"help": "Block (Paper B: post_ln).", "choices": BLOCK_STYLES})
    attend_to_self: bool = field(default=False, metadata={"help": "Inclusive masks; Paper B's are strict."})
    scale_embedding: bool | None = field(
        default=None,
        metadata={"help": "Token embeddings x sqrt(n_embd). Default: as the encoding's source, Vaswani et al.'s "
                  "scale under sinusoidal positions (Paper B's SiPE), none under the others (GPT-2)."},
    )  # fmt: skip


def parse_variant(variant: str) -> dict:
    """Paper B's `global` / `local-K` / `hybrid-K` (half global, half K-local heads) as config fields."""
    match = VARIANT_PATTERN.match(variant)
    if match is None:
        raise ValueError(f"variant {variant!r} must be `global`, `local-K` or `hybrid-K` with K >= 1")
    if variant == "global":
        return dict(model_type="hybrid_gpt2", num_local_heads=0)
    window = int(match.group(2) or match.group(3))
    if window < 1:
        raise ValueError(f"variant {variant!r}: the window K must be >= 1")
    return dict(model_type="local_gpt2" if match.group(2) else "hybrid_gpt2", local_window=window)
