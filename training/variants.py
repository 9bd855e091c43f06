"""Paper B's variant names, shared by its two experiment families: `global`, `local-K` and `hybrid-K`."""

import re

VARIANT_PATTERN = re.compile(r"^(global|local-(\d+)|hybrid-(\d+))$")


def parse_variant(variant: str) -> dict:
    """`global` / `local-K` / `hybrid-K` as config fields."""
    match = VARIANT_PATTERN.match(variant)
    if match is None:
        raise ValueError(f"variant {variant!r} must be `global`, `local-K` or `hybrid-K` with K >= 1")
    if variant == "global":
        return dict(model_type="hybrid_gpt2", num_local_heads=0)
    window = int(match.group(2) or match.group(3))
    if window < 1:
        raise ValueError(f"variant {variant!r}: the window K must be >= 1")
    return dict(model_type="local_gpt2" if match.group(2) else "hybrid_gpt2", local_window=window)


def variant_problems(variants: list[str]) -> list[str]:
    """Why each invalid name in `variants` is invalid, for a script's list of every configuration problem."""
    problems = []
    for variant in variants:
        try:
            parse_variant(variant)
        except ValueError as error:
            problems.append(str(error))
    return problems
