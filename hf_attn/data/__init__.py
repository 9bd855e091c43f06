"""Seeded data for the experiments: Paper A's tasks, Paper B's formal languages and WikiText-2.

Their public names are declared here, once (`__all__`); `passkey`, the long-context benchmark's, is imported by path.
"""

from .algorithmic import ALGORITHMIC_TASKS, algorithmic_dataset, algorithmic_targets, sample_subranges, sample_values
from .formal_languages import (
    ALPHABETS,
    LANGUAGES,
    FormalLanguageVocab,
    formal_language_dataset,
    recognizer,
    sample_strings,
)
from .induction import InductionVocab, khop_dataset, khop_targets
from .labels import IGNORE_INDEX
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
from .wikitext import WIKITEXT_FILES, WikiTextSplits, language_modelling_blocks, load_wikitext, tokenize_text

__all__ = [
    "IGNORE_INDEX",
    "WIKITEXT_FILES",
    "WikiTextSplits",
    "language_modelling_blocks",
    "load_wikitext",
    "tokenize_text",
    "ALGORITHMIC_TASKS",
    "algorithmic_dataset",
    "algorithmic_targets",
    "sample_subranges",
    "sample_values",
    "ALPHABETS",
    "LANGUAGES",
    "FormalLanguageVocab",
    "formal_language_dataset",
    "recognizer",
    "sample_strings",
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
