"""Seeded, vectorised generators of Paper A's tasks: algorithmic regression, k-hop induction, mixed text+numbers."""

from .algorithmic import ALGORITHMIC_TASKS, algorithmic_dataset, algorithmic_targets, sample_subranges, sample_values
from .induction import InductionVocab, khop_dataset, khop_targets
from .mixed import (
    MIXED_TASKS,
    CharVocab,
    MixedSample,
    mixed_dataset,
    parse_answer,
    render_for_positional,
    render_text,
    render_text_with_answer,
    sample_mixed,
)

__all__ = [
    "ALGORITHMIC_TASKS",
    "algorithmic_dataset",
    "algorithmic_targets",
    "sample_subranges",
    "sample_values",
    "InductionVocab",
    "khop_dataset",
    "khop_targets",
    "MIXED_TASKS",
    "CharVocab",
    "MixedSample",
    "mixed_dataset",
    "parse_answer",
    "render_for_positional",
    "render_text",
    "render_text_with_answer",
    "sample_mixed",
]
