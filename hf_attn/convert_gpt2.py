"""Turn a pretrained GPT-2 into a `hybrid_gpt2` or `local_gpt2` model with the same weights and a new head layout.

hf_attn keeps GPT-2's parameter names and shapes, and a layout of global and local heads keeps GPT-2's `c_attn`
layout ([queries | keys | values], heads in index order), so head h of the new layout runs on GPT-2's head h.
A global-only layout with inclusive masks is GPT-2 itself (same logits); local heads and strict masks change the
attention pattern, so such a conversion is a starting point for fine-tuning.

    python -m hf_attn.convert_gpt2 gpt2 out/gpt2-hybrid --model_type hybrid_gpt2 --num_local_heads 6 --local_window 1
"""

import argparse
import copy
import dataclasses
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel, PreTrainedTokenizerBase

from .configuration_hf_attn import HfAttnConfig, HybridGPT2Config, LocalGPT2Config
from .head_kinds_hf_attn import GLOBAL, HEAD_KINDS, kinds_in
from .hub import head_counts, hub_offline, kind_settings, layer_runs, write_model_type_card
from .modeling_hf_attn import HfAttnLMHeadModel

CONVERTIBLE = {"hybrid_gpt2": HybridGPT2Config, "local_gpt2": LocalGPT2Config}
# Content heads take queries and keys from `c_attn`, as GPT-2's heads do; the other kinds have no GPT-2 counterpart.
CONVERTIBLE_KINDS = [name for name, kind in HEAD_KINDS.items() if kind.content]
# Fields that fix the shapes of GPT-2's weights: they come from the checkpoint.
SHAPE_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner")
# Our fields whose other values add, drop or reshape weights that GPT-2 has.
GPT2_ARCHITECTURE = {"position_embedding_type": "learned", "block_style": "gpt2", "numeric_inputs": False}
# Bookkeeping of the source config, rewritten for the new model type.
NOT_CARRIED = ("model_type", "architectures", "transformers_version", "_name_or_path", "auto_map", "dtype")


def load_gpt2(model_or_path: str | Path | GPT2LMHeadModel) -> GPT2LMHeadModel:
    """The source as a GPT2LMHeadModel, refusing anything else before its weights are loaded."""
    if isinstance(model_or_path, GPT2LMHeadModel):
        return model_or_path
    if not isinstance(model_or_path, (str, Path)):
        raise ValueError(
            f"`model_or_path` must be a GPT2LMHeadModel, a Hub id or a folder, got {type(model_or_path).__name__}."
        )
    try:
        source_config = AutoConfig.from_pretrained(model_or_path)
    except OSError as error:
        offline = " (HF_HUB_OFFLINE is set: only local folders and cached Hub ids load)" if hub_offline() else ""
        raise ValueError(
            f"`model_or_path`={str(model_or_path)!r} is neither a checkpoint folder nor a loadable Hub id{offline}: "
            "pass a folder saved with save_pretrained, a Hub id such as 'gpt2', or a GPT2LMHeadModel."
        ) from error
    if source_config.model_type != "gpt2":
        raise ValueError(
            f"`model_or_path`={str(model_or_path)!r} has `model_type`={source_config.model_type!r}; "
            "only GPT-2 checkpoints (model_type 'gpt2') can be converted."
        )
    return GPT2LMHeadModel.from_pretrained(model_or_path)


def check_request(model_type: str, overrides: dict) -> None:
    """Refuses, before any checkpoint is loaded, a target that could not hold GPT-2's weights."""
    if model_type == "positional_gpt2":
        raise ValueError(
            "`model_type`='positional_gpt2' cannot be converted from GPT-2: positional heads take their queries and "
            f"keys from P, which GPT-2 has no weights for. Use one of {list(CONVERTIBLE)}."
        )
    if model_type not in CONVERTIBLE:
        raise ValueError(f"`model_type` must be one of {list(CONVERTIBLE)}, got {model_type!r}.")
    config_class = CONVERTIBLE[model_type]
    known = {field.name for field in dataclasses.fields(config_class)}
    for field, value in overrides.items():
        if field not in known:
            raise ValueError(f"`{field}` is not a field of {config_class.__name__} (model_type {model_type!r}).")
        if field in SHAPE_FIELDS:
            raise ValueError(f"`{field}` comes from the GPT-2 checkpoint and cannot be overridden, got {value!r}.")
        if field in GPT2_ARCHITECTURE and value != GPT2_ARCHITECTURE[field]:
            raise ValueError(f"`{field}` must be {GPT2_ARCHITECTURE[field]!r} to keep GPT-2's weights, got {value!r}.")


def convert_gpt2(
    model_or_path: str | Path | GPT2LMHeadModel, model_type: str = "hybrid_gpt2", **config_overrides
) -> HfAttnLMHeadModel:
    """A `hybrid_gpt2` or `local_gpt2` model holding a GPT-2 checkpoint's weights, in eval mode and its dtype.

    `config_overrides` set the new layout (`head_layout`, `num_local_heads`, `local_window`, `attend_to_self`, ...)
    on top of every GPT2Config field of the source. Masks follow the model type's preset (strict) unless
    `attend_to_self=True`; `num_local_heads=0, attend_to_self=True` gives GPT-2's logits exactly.

    Example:

    ```python
    >>> model = convert_gpt2("gpt2", "hybrid_gpt2", num_local_heads=6, local_window=1, attend_to_self=True)
    ```"""
    check_request(model_type, config_overrides)
    source = load_gpt2(model_or_path)
    fields = {key: value for key, value in source.config.to_dict().items() if key not in NOT_CARRIED}
    config = AutoConfig.for_model(model_type, **{**fields, **config_overrides})
    other_kinds = [kind.name for kind in kinds_in(*config.head_layout) if not kind.content]
    if other_kinds:
        raise ValueError(
            f"`head_layout` may only hold {CONVERTIBLE_KINDS} heads when converting GPT-2: {other_kinds} heads "
            "have no GPT-2 counterpart for their queries and keys."
        )
    model = AutoModelForCausalLM.from_config(config, dtype=source.dtype)
    # Same names and shapes (transformers 5's GPT-2 keeps no mask buffers, and old checkpoints' `attn.bias` is
    # dropped by its from_pretrained), so every weight must match.
    model.load_state_dict(source.state_dict(), strict=True)
    if source.generation_config is not None:
        model.generation_config = copy.deepcopy(source.generation_config)
    return model.eval()


def layout_summary(config: HfAttnConfig) -> list[str]:
    """One line per run of layers with the same heads, then the window and masks."""
    lines = []
    for (layers, counts), (_, layer) in zip(head_counts(config), layer_runs(config.head_layout), strict=True):
        held = " + ".join(f"{count} {kind}" for kind, count in counts.items() if count)
        order = f" ({', '.join(layer)})" if len(set(layer)) > 1 else ""
        lines.append(f"{'layers' if '-' in layers else 'layer'} {layers}: {held}{order}")
    settings = [f"{field}={value!r}" for kind in kinds_in(*config.head_layout)
                for field, value in kind_settings(kind, config).items()]  # fmt: skip
    masks = "inclusive" if config.attend_to_self else "strict"
    lines.append(", ".join([*settings, f"{masks} masks (attend_to_self={config.attend_to_self})"]))
    return lines


def conversion_note(base_model: str | None, config: HfAttnConfig) -> str:
    """The model card's paragraph on where the weights come from (`base_model`: a Hub id, None for a local folder)
    and what the new layout changes about GPT-2."""
    origin = f"the GPT-2 checkpoint `{base_model}`" if base_model else "a GPT-2 checkpoint"
    changes = [f"{kind.name} heads" for kind in kinds_in(*config.head_layout) if kind is not GLOBAL]
    changes += [] if config.attend_to_self else ["strict masks"]
    effect = (
        f"Its {' and '.join(changes)} change what GPT-2's heads see, so it is a starting point for fine-tuning."
        if changes
        else "With global heads and inclusive masks only, it computes what GPT-2 does."
    )
    return (
        f"Its weights come from {origin}, converted by `hf_attn.convert_gpt2` (head h of every layer runs on GPT-2's "
        f"head h). {effect}"
    )


def load_tokenizer(name: str) -> PreTrainedTokenizerBase | None:
    """The tokenizer at `name`, or None; transformers builds an empty one from a folder without tokenizer files."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):
        return None
    return tokenizer if tokenizer.vocab_size else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hf_attn.convert_gpt2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="GPT-2 checkpoint: a folder saved with save_pretrained or a Hub id")
    parser.add_argument("output_dir", help="folder to save the converted model (and tokenizer) into")
    parser.add_argument("--model_type", default="hybrid_gpt2", help=f"one of {list(CONVERTIBLE)}")
    parser.add_argument("--num_local_heads", type=int, help="hybrid_gpt2 only; default half of n_head")
    parser.add_argument("--local_window", type=int, help="k, the previous positions a local head sees; default 1")
    parser.add_argument(
        "--attend_to_self",
        action=argparse.BooleanOptionalAction,
        help="inclusive masks as GPT-2's (default: the model type's strict masks)",
    )
    parser.add_argument("--tokenizer", help="tokenizer folder or Hub id to save with the model; default SOURCE's")
    args = parser.parse_args(argv)
    overrides = {
        field: getattr(args, field)
        for field in ("num_local_heads", "local_window", "attend_to_self")
        if getattr(args, field) is not None
    }
    try:
        model = convert_gpt2(args.source, args.model_type, **overrides)
        tokenizer = load_tokenizer(args.tokenizer or args.source)
        if args.tokenizer and tokenizer is None:
            raise ValueError(f"`--tokenizer`={args.tokenizer!r} holds no tokenizer.")
        if tokenizer is not None and len(tokenizer) > model.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the model embeds only "
                f"`vocab_size`={model.config.vocab_size}; pass the GPT-2 checkpoint's own tokenizer."
            )
    except ValueError as error:
        parser.error(str(error))

    model.save_pretrained(args.output_dir)
    config = model.config
    base_model = None if Path(args.source).exists() else args.source  # a Hub id
    write_model_type_card(model, args.output_dir, base_model=base_model, conversion=conversion_note(base_model, config))
    print(
        f"converted {args.source} to {config.model_type}: {config.n_layer} layers x {config.n_head} heads, "
        f"{model.num_parameters():,} parameters ({model.dtype})"
    )
    print("\n".join("  " + line for line in layout_summary(config)))
    print(f"saved the model to {args.output_dir}")
    if tokenizer is not None:
        tokenizer.save_pretrained(args.output_dir)
        print(f"saved the tokenizer of {args.tokenizer or args.source} to {args.output_dir}")
    else:
        print(f"no tokenizer at {args.source}: saved the model only (pass --tokenizer to add one)")


if __name__ == "__main__":
    main()
