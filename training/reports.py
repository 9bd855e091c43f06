"""Every committed report and every table of the README and docs regenerated from the committed results, in one
command.

    python -m training.reports

`docs/results/NAME/` holds one CPU experiment's runs as results.json files (no weights: those stay in the run's
`model/` folder under `outputs/`). For each folder this rewrites the family's reports (results.md and the plots),
then every table of README.md and docs/*.md between `<!-- generated: NAME -->` and `<!-- /generated -->` from the
same files. Nothing trains. To publish a new run: copy its OUTPUT_DIR without `model/` and `checkpoint-*` folders
(`--publish OUTPUT_DIR NAME`; the same NAME for several folders merges them, e.g. the two processes of one
experiment).

    python -m training.reports --check

writes nothing: it lists every generated block and every report (results.md and the families' other Markdown
reports) that differs from what the committed results give, and exits with status 1 if there is one. The tests run
it, so a figure edited by hand inside a generated block, or a report left stale, fails them. Plots are not compared.
"""

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import hf_attn.experiments.reports as experiment_reports
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
    ONE_RUN_MODULES,
    hybrid_pretraining_text,
    hybrid_tradeoff_runs,
    hybrid_tradeoff_tables,
    long_context_cpu_check_table,
    long_context_runs,
    long_context_tables,
    one_run_result,
    one_run_text,
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
    ONE_RUN_BENCHMARKS,
    PAGES,
    PAPER_A,
    PAPER_B,
    PAPER_B_FORMAL,
    POSITIONAL_CONVERSION,
    PUBLISHED,
    ROOT,
    SINUSOIDAL_UNSCALED,
    beside,
    pages,
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
    run_times_sentence,
    run_times_table,
    training_time,
)


def write_family_reports(folder: Path, results_folder: Path | None = None) -> None:
    """Rewrites the reports of the experiment in `folder` from its runs' results (those in `results_folder`, by
    default `folder`'s own), as its script would."""
    results = load_results(results_folder or folder)
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
    "long-context-cpu-check": long_context_cpu_check_table,
    "positional-conversion": positional_conversion_text,
    "serving": lambda: one_run_text("serving"),
    "serving-http": lambda: one_run_text("serving-http"),
    "hybrid-speed": lambda: one_run_text("hybrid-speed"),
    "allocators": lambda: one_run_text("allocators"),
    "ruler": lambda: one_run_text("ruler").replace("\n### ", "\n#### ").replace("\n## ", "\n### "),
    "revision-speed": lambda: one_run_text("revision-speed"),
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


OPEN, CLOSE = "<!-- generated: ", "<!-- /generated -->"


def generated_blocks(text: str) -> list[tuple[str, int, int]]:
    """(NAME, start, end) of every `<!-- generated: NAME -->` ... `<!-- /generated -->` block of `text`: `text[start:
    end]` is what lies between the two markers."""
    blocks, position = [], 0
    while (opening := text.find(OPEN, position)) >= 0:
        name_end = text.index(" -->", opening)
        end = text.index(CLOSE, name_end)
        blocks.append((text[opening + len(OPEN) : name_end], name_end + len(" -->"), end))
        position = end
    return blocks


def block_text(name: str) -> str:
    """What the block NAME holds between its markers."""
    return "\n" + TABLES[name]() + "\n"


def splice_tables(text: str) -> str:
    """Every generated block of `text` refilled by `TABLES[NAME]`."""
    out, done = [], 0
    for name, start, end in generated_blocks(text):
        out += [text[done:start], block_text(name)]
        done = end
    return "".join(out) + text[done:]


def publish(output_dirs: list[Path], name: str) -> None:
    """Copies an experiment's results into docs/results/NAME, in place of what was there: no weights, checkpoints or
    locks, and no settings.json (results.json holds the same as `config`). Several output folders (one experiment
    run as several processes, each its own groups of runs) merge into one."""
    target = DOCS / name
    shutil.rmtree(target, ignore_errors=True)
    left_out = shutil.ignore_patterns("model", "checkpoint-*", "runs", "settings.json", "*.lock")
    for output_dir in output_dirs:
        shutil.copytree(output_dir, target, ignore=left_out, dirs_exist_ok=True)


@contextlib.contextmanager
def plots_left_out() -> Iterator[None]:
    """The families' reports without their plots, as when matplotlib is not installed: the check compares text, and
    drawing the plots would take it from seconds to most of a minute on 2 cores."""
    with mock.patch.object(experiment_reports, "pyplot", lambda: None):
        yield


RESULTS_IN_ROOT = DOCS.relative_to(ROOT)  # docs/results, in any copy of the repository


def expected_reports() -> dict[Path, str]:
    """Every committed Markdown report as the committed results give it, by its path under the repository root: the
    families' (written into a scratch folder, plots left out) and the benchmarks' results.md."""
    expected = {}
    with tempfile.TemporaryDirectory() as scratch, plots_left_out():
        for name in PUBLISHED:
            folder = Path(scratch) / name
            for committed in (DOCS / name, *(path for path in (DOCS / name).rglob("*") if path.is_dir())):
                (folder / committed.relative_to(DOCS / name)).mkdir(parents=True, exist_ok=True)
            write_family_reports(folder, DOCS / name)
            for path in sorted(folder.rglob("*.md")):
                expected[RESULTS_IN_ROOT / name / path.relative_to(folder)] = path.read_text()
    benchmark_runs = [(folder, hybrid_tradeoff.report(result)) for folder, result in hybrid_tradeoff_runs()]
    benchmark_runs += [(folder, long_context.report(result)) for folder, result in long_context_runs()]
    if (result := positional_conversion_result()) is not None:
        benchmark_runs.append((DOCS / POSITIONAL_CONVERSION, positional_conversion.report(result)))
    for name, module in ONE_RUN_MODULES.items():
        if (result := one_run_result(name)) is not None:
            benchmark_runs.append((DOCS / ONE_RUN_BENCHMARKS[name], module.report(result)))
    for folder, text in benchmark_runs:
        expected[RESULTS_IN_ROOT / folder.relative_to(DOCS) / "results.md"] = text
    return expected


def first_difference(committed: str, expected: str) -> str:
    """Where two texts part: the first line that differs, as committed and as the results give it."""
    committed_lines, expected_lines = committed.splitlines(), expected.splitlines()
    for number, (old, new) in enumerate(zip(committed_lines, expected_lines, strict=False), start=1):
        if old != new:
            return f"line {number}: {old[:120]!r}, the results give {new[:120]!r}"
    number = min(len(committed_lines), len(expected_lines)) + 1
    return f"line {number}: the committed text has {len(committed_lines)} lines, the results give {len(expected_lines)}"


def stale(root: Path = ROOT) -> list[str]:
    """Every generated block of README.md and docs/*.md under `root`, and every report under its docs/results, that
    differs from what this checkout's committed results give, one line each; also blocks with no table, tables
    shown in no block or twice, and reports committed that the results no longer make. Writes nothing. `root` is the
    repository root, or a copy of its pages and reports (the tests tamper with one)."""
    problems, shown = [], []
    for page in pages(root):
        text = page.read_text()
        where = page.relative_to(root)
        for name, start, end in generated_blocks(text):
            shown.append(name)
            if name not in TABLES:
                problems.append(f"{where}: block `{name}` names no table of training/reports.py's TABLES")
            elif text[start:end] != (expected := block_text(name)):
                problems.append(f"{where}: block `{name}` differs, {first_difference(text[start:end], expected)}")
    problems += [f"table `{name}` is in no page" for name in TABLES if name not in shown]
    problems += [f"table `{name}` is shown {shown.count(name)} times" for name in TABLES if shown.count(name) > 1]
    expected = expected_reports()
    for relative, text in expected.items():
        if not (root / relative).is_file():
            problems.append(f"{relative}: missing")
        elif (committed := (root / relative).read_text()) != text:
            problems.append(f"{relative}: differs, {first_difference(committed, text)}")
    for name in PUBLISHED:
        for path in sorted((root / RESULTS_IN_ROOT / name).rglob("*.md")):
            if path.relative_to(root) not in expected:
                problems.append(f"{path.relative_to(root)}: no report of the results; remove it or make it")
    return problems


def check(root: Path = ROOT) -> int:
    """`--check`: prints what `stale` finds; the exit status, 1 if anything."""
    problems = stale(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} generated block(s) or report(s) differ from the committed results: run "
              "`python -m training.reports` and commit what it writes", file=sys.stderr)  # fmt: skip
        return 1
    print("every generated block and report is what the committed results give")
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publish", nargs=2, action="append", default=[], metavar=("OUTPUT_DIR", "NAME"),
                        help="first copy OUTPUT_DIR's results into docs/results/NAME (a NAME given for several "
                        "folders gets them all)")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="write nothing: list every generated block and report "
                        "that differs from what the committed results give; exit status 1 if any does")  # fmt: skip
    args = parser.parse_args(argv)
    if args.check:
        if args.publish:
            parser.error("--check writes nothing: give it without --publish")
        sys.exit(check(ROOT))
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
    for name, module in ONE_RUN_MODULES.items():
        if (result := one_run_result(name)) is not None:
            (DOCS / ONE_RUN_BENCHMARKS[name] / "results.md").write_text(module.report(result))
    for page in PAGES:
        page.write_text(splice_tables(page.read_text()))
    print(f"rewrote the reports in {DOCS.relative_to(ROOT)} and the generated tables of README.md and docs/")


if __name__ == "__main__":
    main()
