"""Paper B's generated tables (formal languages, WikiText-2) from the committed results, Paper B's own numbers and
predictions beside ours."""

import statistics

from hf_attn.experiments import is_collapsed
from hf_attn.experiments.arguments import experiment_of
from hf_attn.experiments.runs import load_results
from training import formal_languages, paper_numbers, wikitext
from training.committed_results import (
    DOCS,
    FORMAL_CHECKS,
    FORMAL_PAPER_SIZE,
    FORMAL_POSITIVES,
    SINUSOIDAL_UNSCALED,
    published,
)


def formal_languages_table(name: str) -> str:
    """Paper B's main table (no position encoding) from the runs in docs/results/NAME, with its predictions beside,
    then our mean accuracy beside Paper B's measured one."""
    results = load_results(DOCS / name)
    experiment = experiment_of(formal_languages.ExperimentArguments, results)
    summaries = formal_languages.cell_summaries(results)
    tables = formal_languages.encoding_tables(summaries, experiment.variants, experiment.languages, "none")
    beside_paper = formal_languages_beside_paper(summaries, experiment.variants, experiment.languages, results[0])
    return tables + "\n\n" + beside_paper


def formal_languages_beside_paper(summaries: dict, variants: list[str], languages: list[str], run: dict) -> str:
    """Mean accuracy (%) over test lengths 41..500 per cell, ours then Paper B's in parentheses; `run`, any of ours,
    says our model and training."""
    published_accuracy = paper_numbers.FORMAL_LANGUAGES_ACCURACY
    lines = ["| variant | " + " | ".join(languages) + " |", "|---" * (len(languages) + 1) + "|"]
    for variant in variants:
        cells = [f"{100 * summaries[language, 'none', variant]['mean_accuracy']:.1f} "
                 f"({published_accuracy[language][variant]:.1f})" for language in languages]  # fmt: skip
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    model, training = run["config"]["model"], run["config"]["training"]
    note = (
        "Mean accuracy (%) over the test lengths, all runs of a cell; in parentheses Paper B's, over 15 runs of its "
        "5-layer, 64-wide model with 8 heads trained 1,000,000 steps (`training/paper_numbers.py`; taken from notes "
        f"of the paper). Ours: {model['n_layer']} layers, {model['n_embd']} wide, {model['n_head']} heads, trained "
        f"{training['max_steps']:,} steps."
    )
    return "Beside Paper B's measured accuracy:\n\n" + "\n".join(lines) + "\n\n" + note


def formal_languages_positions_table() -> str:
    """Paper B's other encodings (sinusoidal, RoPE) for k = 1, with the predictions beside: a table per encoding."""
    results = load_results(DOCS / "formal_languages_positions_cpu")
    experiment = experiment_of(formal_languages.ExperimentArguments, results)
    summaries = formal_languages.cell_summaries(results)
    return "\n\n".join(
        f"Position encoding `{positions}`:\n\n"
        + formal_languages.encoding_tables(summaries, experiment.variants, experiment.languages, positions)
        for positions in experiment.position_embeddings
    )


def formal_languages_checks_table() -> str:
    """The 2-layer table's disagreements with Paper B, trained longer and at Paper B's model size."""
    by_setting = {setting: load_results(DOCS / name) for setting, name in FORMAL_CHECKS.items()}
    checked = experiment_of(formal_languages.ExperimentArguments, by_setting["4x longer: 2,000 steps"])
    return formal_languages.settings_table(by_setting, checked.languages, checked.variants)


def formal_languages_positives_table() -> str:
    """The main table's cells of the uniform-members check, its members written in and uniform side by side, with
    Paper B's measured accuracy after them."""
    uniform = load_results(DOCS / FORMAL_POSITIVES)
    checked = experiment_of(formal_languages.ExperimentArguments, uniform)
    by_setting = {"members written in (the main table)": load_results(DOCS / FORMAL_PAPER_SIZE),
                  "uniform random members": uniform}  # fmt: skip
    table = formal_languages.settings_table(by_setting, checked.languages, checked.variants)
    published_accuracy = paper_numbers.FORMAL_LANGUAGES_ACCURACY
    measured = [f"{language} / {variant} {published_accuracy[language][variant]:.1f}%"
                for language in checked.languages for variant in checked.variants]  # fmt: skip
    return table + "\n\nPaper B's mean accuracy (`training/paper_numbers.py`): " + ", ".join(measured) + "."


def formal_languages_sinusoidal_scale_table() -> str:
    """The sinusoidal cells with token embeddings scaled by sqrt(n_embd) (the default) and unscaled, side by side."""
    scaled = [r for r in load_results(DOCS / "formal_languages_positions_cpu") if r["positions"] == "sinusoidal"]
    by_setting = {"x sqrt(n_embd) (the table's)": scaled,
                  "unscaled": load_results(DOCS / SINUSOIDAL_UNSCALED["formal"])}  # fmt: skip
    experiment = experiment_of(formal_languages.ExperimentArguments, scaled)
    return formal_languages.settings_table(by_setting, experiment.languages, experiment.variants, "sinusoidal")


def wikitext_table(name: str) -> str:
    """WikiText-2 test perplexity per variant and position encoding, collapsed runs named and left out; for the
    main runs, hybrid-1's change against global beside the only WikiText figure Paper B publishes."""
    results = load_results(DOCS / name)
    experiment = experiment_of(wikitext.ExperimentArguments, results)
    section = wikitext.perplexity_section(results, experiment)
    return section if name != "wikitext_cpu" else section + "\n\n" + wikitext_beside_paper(results)


def wikitext_beside_paper(results: list[dict]) -> str:
    """Hybrid-1's mean perplexity minus global's, per encoding, Paper B's in parentheses."""

    def mean_perplexity(variant: str, positions: str) -> float:
        kept = [r["by_scale"][variant]["perplexity"] for r in results
                if r["model"] == variant and r["positions"] == positions and not is_collapsed(r)]  # fmt: skip
        return statistics.mean(kept)

    changes = [
        f"{positions} {mean_perplexity('hybrid-1', positions) - mean_perplexity('global', positions):+.0f} "
        f"({published(paper_change)})"
        for positions, paper_change in paper_numbers.WIKITEXT_HYBRID_1_PERPLEXITY_CHANGE.items()
    ]
    return (
        "Hybrid-1's mean perplexity minus global's: " + ", ".join(changes) + ". In parentheses Paper B's, the only "
        "WikiText-2 figures it publishes (GPT-2-small shape; its absolute perplexities, tokenizer and schedule are "
        "not given; `training/paper_numbers.py`)."
    )
