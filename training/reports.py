"""Every committed report and every table of the README and docs regenerated from the committed results, in one
command.

    python -m training.reports

`docs/results/NAME/` holds one CPU experiment's runs as results.json files (no weights: those stay in the run's
`model/` folder under `outputs/`). For each folder this rewrites the family's reports (results.md and the plots),
then every table of README.md and docs/*.md between `<!-- generated: NAME -->` and `<!-- /generated -->` from the
same files. Nothing trains. To publish a new run: copy its OUTPUT_DIR without `model/` and `checkpoint-*` folders
(`--publish OUTPUT_DIR NAME`; the same NAME for several folders merges them, e.g. the two processes of one
experiment).
"""

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

from benchmarks import hybrid_tradeoff, long_context, positional_conversion
from hf_attn.experiments import family_named
from hf_attn.experiments.arguments import experiment_of
from hf_attn.experiments.runs import load_results
from training import (  # noqa: F401  (each script registers its family)
    algorithmic,
    baseline_learning_rate,
    formal_languages,
    induction,
    mixed,
    paper_numbers,
    wikitext,
)

# The tables: Paper A's and Paper B's, docs/hybrid.md's benchmarks, the experiments index and run times; where the
# committed results sit. Each name is importable from here as before (noqa: the ones this module does not use).
from training.benchmark_tables import (
    hybrid_pretraining_text,
    hybrid_tradeoff_runs,
    hybrid_tradeoff_tables,
    long_context_runs,
    long_context_tables,
    positional_conversion_result,
    positional_conversion_text,
)
from training.committed_results import (  # noqa: F401
    DOCS,
    FORMAL_CHECKS,
    FORMAL_PAPER_SIZE,
    FORMAL_POSITIVES,
    HYBRID,
    HYBRID_TRADEOFF,
    IDLE_RUN_TIMES,
    IDLE_TIMED,
    LONG_CONTEXT,
    PAGES,
    PAPER_A,
    PAPER_B,
    PAPER_B_FORMAL,
    POSITIONAL_CONVERSION,
    PUBLISHED,
    ROOT,
    SINUSOIDAL_UNSCALED,
    beside,
    published,
)
from training.paper_a_tables import (  # noqa: F401
    PAPER_A_ALGORITHMIC_NOTE,
    TASK_NAMES,
    algorithmic_by_epoch_table,
    algorithmic_llama_table,
    algorithmic_table,
    baseline_label,
    gpt2_learning_rate_table,
    gpt2_pretraining_text,
    induction_by_step_table,
    induction_table,
    median,
    mixed_table,
    quickstart_table,
)
from training.paper_b_tables import (  # noqa: F401
    formal_languages_beside_paper,
    formal_languages_checks_table,
    formal_languages_positions_table,
    formal_languages_positives_table,
    formal_languages_sinusoidal_scale_table,
    formal_languages_table,
    wikitext_beside_paper,
    wikitext_table,
)
from training.published_tables import (  # noqa: F401
    EXPERIMENTS,
    PublishedTable,
    experiments_index,
    idle_pace_minutes,
    idle_run_times_table,
    output_folder,
    run_times_table,
    training_time,
)


def write_family_reports(folder: Path) -> None:
    """Rewrites the reports of the experiment in `folder` from its runs' results, as its script would."""
    results = load_results(folder)
    family = family_named(results[0]["experiment"])
    family.write_reports(folder, results, experiment_of(family.arguments, results))


TABLES: dict[str, Callable[[], str]] = {
    "quickstart": quickstart_table,
    "algorithmic": lambda: algorithmic_table("algorithmic_cpu"),
    "algorithmic-long": lambda: algorithmic_table("algorithmic_cpu_long"),
    "algorithmic-long-by-epoch": lambda: algorithmic_by_epoch_table("algorithmic_cpu_long"),
    "algorithmic-llama": algorithmic_llama_table,
    "mixed-min": lambda: mixed_table("min"),
    "mixed-sum": lambda: mixed_table("sum"),
    "mixed-multitask": lambda: mixed_table("multitask"),
    "induction": induction_table,
    "induction-by-step": induction_by_step_table,
    "induction-layernorm": lambda: induction_table("induction_cpu_layernorm"),
    "paper-a-run-times": lambda: run_times_table(PAPER_A),
    "paper-b-run-times": lambda: run_times_table(PAPER_B),
    "paper-b-idle-run-times": lambda: idle_run_times_table(IDLE_TIMED),
    "wikitext": lambda: wikitext_table("wikitext_cpu"),
    "wikitext-sinusoidal-check": lambda: wikitext_table(SINUSOIDAL_UNSCALED["wikitext"]),
    "wikitext-llama": lambda: wikitext_table("wikitext_llama_cpu"),
    "hybrid-pretraining": hybrid_pretraining_text,
    "hybrid-tradeoff": hybrid_tradeoff_tables,
    "hybrid-long-context": long_context_tables,
    "positional-conversion": positional_conversion_text,
    "gpt2-pretraining": gpt2_pretraining_text,
    "gpt2-learning-rate": gpt2_learning_rate_table,
    "experiments-index": experiments_index,
    "formal-languages": lambda: formal_languages_table(FORMAL_PAPER_SIZE),
    "formal-languages-small": lambda: formal_languages_table("formal_languages_table_cpu"),
    "formal-languages-positions": formal_languages_positions_table,
    "formal-languages-checks": formal_languages_checks_table,
    "formal-languages-positives": formal_languages_positives_table,
    "formal-languages-sinusoidal-scale": formal_languages_sinusoidal_scale_table,
}


def splice_tables(text: str) -> str:
    """Every `<!-- generated: NAME -->` ... `<!-- /generated -->` block of `text` refilled by `TABLES[NAME]`."""
    out, rest = [], text
    while (start := rest.find("<!-- generated: ")) >= 0:
        name_end = rest.index(" -->", start)
        name = rest[start + len("<!-- generated: ") : name_end]
        end = rest.index("<!-- /generated -->", name_end)
        out.append(rest[: name_end + len(" -->")] + "\n" + TABLES[name]() + "\n")
        rest = rest[end:]
    return "".join(out) + rest


def publish(output_dirs: list[Path], name: str) -> None:
    """Copies an experiment's results into docs/results/NAME, in place of what was there: no weights, checkpoints or
    locks, and no settings.json (results.json holds the same as `config`). Several output folders (one experiment
    run as several processes, each its own groups of runs) merge into one."""
    target = DOCS / name
    shutil.rmtree(target, ignore_errors=True)
    left_out = shutil.ignore_patterns("model", "checkpoint-*", "runs", "settings.json", "*.lock")
    for output_dir in output_dirs:
        shutil.copytree(output_dir, target, ignore=left_out, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publish", nargs=2, action="append", default=[], metavar=("OUTPUT_DIR", "NAME"),
                        help="first copy OUTPUT_DIR's results into docs/results/NAME (a NAME given for several "
                        "folders gets them all)")  # fmt: skip
    args = parser.parse_args(argv)
    by_name: dict[str, list[Path]] = {}
    for output_dir, name in args.publish:
        by_name.setdefault(name, []).append(Path(output_dir))
    for name, output_dirs in by_name.items():
        publish(output_dirs, name)
    for name in PUBLISHED:
        write_family_reports(DOCS / name)
    for folder, result in hybrid_tradeoff_runs():
        hybrid_tradeoff.write_reports(result, folder)
    for folder, result in long_context_runs():
        long_context.write_reports(result, folder)
    if (result := positional_conversion_result()) is not None:
        (DOCS / POSITIONAL_CONVERSION / "results.md").write_text(positional_conversion.report(result))
    for page in PAGES:
        page.write_text(splice_tables(page.read_text()))
    print(f"rewrote the reports in {DOCS.relative_to(ROOT)} and the generated tables of README.md and docs/")


if __name__ == "__main__":
    main()
