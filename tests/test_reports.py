"""training/reports.py: the committed reports and the tables of README.md and docs/ are what the committed results
give."""

import json
import shutil
from pathlib import Path

import pytest
from test_long_context import synthetic_result

import training.benchmark_tables as benchmark_tables
import training.paper_a_tables as paper_a_tables
import training.reports as reports


def test_splice_replaces_only_the_marked_blocks(monkeypatch):
    monkeypatch.setitem(reports.TABLES, "demo", lambda: "| a |\n|---|\n| 1 |")
    text = "intro\n<!-- generated: demo -->\nstale\n<!-- /generated -->\nmiddle\n"
    text += "<!-- generated: demo -->\n<!-- /generated -->\nend"
    expected = "intro\n<!-- generated: demo -->\n| a |\n|---|\n| 1 |\n<!-- /generated -->\nmiddle\n"
    expected += "<!-- generated: demo -->\n| a |\n|---|\n| 1 |\n<!-- /generated -->\nend"
    assert reports.splice_tables(text) == expected
    assert reports.splice_tables(expected) == expected


def test_publish_copies_results_without_weights_or_checkpoints(tmp_path, monkeypatch):
    run = tmp_path / "out" / "min" / "positional" / "seed-0"
    (run / "model").mkdir(parents=True)
    (run / "checkpoint-4").mkdir()
    (run / "model" / "model.safetensors").write_bytes(b"weights")
    (run / "results.json").write_text(json.dumps({"model": "positional"}))
    (tmp_path / "out" / "min" / "results.md").write_text("# report")
    other = tmp_path / "other" / "sum" / "standard" / "seed-0"  # the same experiment's second process
    other.mkdir(parents=True)
    (other / "results.json").write_text(json.dumps({"model": "standard"}))
    monkeypatch.setattr(reports, "DOCS", tmp_path / "docs")
    (tmp_path / "docs" / "demo" / "stale").mkdir(parents=True)
    reports.publish([tmp_path / "out", tmp_path / "other"], "demo")
    copied = tmp_path / "docs" / "demo" / "min"
    assert (copied / "results.md").read_text() == "# report"
    assert (copied / "positional" / "seed-0" / "results.json").exists()
    assert not (copied / "positional" / "seed-0" / "model").exists()
    assert not (copied / "positional" / "seed-0" / "checkpoint-4").exists()
    assert (tmp_path / "docs" / "demo" / "sum" / "standard" / "seed-0" / "results.json").exists()
    assert not (tmp_path / "docs" / "demo" / "stale").exists()  # what was published before is replaced


def committed_copy(tmp_path: Path) -> Path:
    """README.md, docs/*.md and every Markdown report of docs/results as committed, under `tmp_path` as in the
    repository: what `stale` reads."""
    for path in (*reports.PAGES, *reports.DOCS.rglob("*.md")):
        copy = tmp_path / path.relative_to(reports.ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
    return tmp_path


def test_the_committed_pages_and_reports_are_what_the_results_give():
    """`python -m training.reports --check` on this checkout: every generated block of README.md and docs/, and every
    report in docs/results, is what the committed results give; every table is shown once."""
    assert reports.stale() == [], "run `python -m training.reports` and commit what it writes"


def test_the_check_names_every_stale_block_and_report_and_writes_nothing(tmp_path, monkeypatch, capsys):
    root = committed_copy(tmp_path)
    hybrid = root / "docs" / "hybrid.md"
    text = hybrid.read_text()
    tampered = text.replace("| 19.24 | 1.000x |", "| 19.25 | 1.000x |", 1)  # a figure edited inside a block
    tampered = tampered.replace("# Hybrid heads for any decoder", "# Hybrid heads for every decoder")  # prose: free
    assert tampered.count("19.25 | 1.000x") == 1 and tampered != text
    hybrid.write_text(tampered)
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\n<!-- generated: no-such-table -->\n<!-- /generated -->\n")
    report = root / "docs" / "results" / "quickstart" / "cumulative_min" / "results.md"
    report.write_text(report.read_text().replace("|", "!", 1))
    missing = root / "docs" / "results" / reports.POSITIONAL_CONVERSION / "results.md"
    missing.unlink()
    (root / "docs" / "results" / "quickstart" / "notes.md").write_text("no report makes this\n")

    problems = reports.stale(root)
    assert [problem.split(",")[0] for problem in problems] == [  # pages first, then reports
        "README.md: block `no-such-table` names no table of training/reports.py's TABLES",
        "docs/hybrid.md: block `hybrid-long-context` differs",
        "docs/results/quickstart/cumulative_min/results.md: differs",
        "docs/results/positional_conversion/results.md: missing",
        "docs/results/quickstart/notes.md: no report of the results; remove it or make it",
    ]
    assert "60% | 19.25 | 1.000x" in problems[1] and "60% | 19.24 | 1.000x" in problems[1]  # the line that differs

    monkeypatch.setattr(reports, "ROOT", root)
    with pytest.raises(SystemExit) as exit_status:
        reports.main(["--check"])
    assert exit_status.value.code == 1
    assert capsys.readouterr().out.splitlines() == problems
    assert hybrid.read_text() == tampered and not missing.exists()  # nothing rewritten


def test_the_check_refuses_to_publish():
    with pytest.raises(SystemExit) as exit_status:
        reports.main(["--check", "--publish", "outputs/demo", "demo"])
    assert exit_status.value.code == 2  # argparse's usage error


def test_experiments_index_names_real_configs_and_results():
    """Each published table's command names a shipped config, and its results folder is committed."""
    for row in reports.EXPERIMENTS:
        for config in row.configs:
            assert (reports.ROOT / "configs" / config.split()[0]).is_file(), config
        assert (reports.DOCS / row.results).is_dir(), row.results
        assert (reports.ROOT / "training" / f"{row.script}.py").is_file(), row.script
    published = {row.results for row in reports.EXPERIMENTS}
    assert set(reports.PUBLISHED) <= published, "a published experiment is missing from the index"


def test_runs_of_several_commands_report_as_one_experiment():
    """Two commands, each on a subset of the languages (run in parallel), make one experiment in canonical order."""

    def result(languages, variants):
        experiment = {"languages": languages, "variants": variants, "seeds": [0], "test_max_length": 500}
        return {"experiment": "formal_languages", "config": {"experiment": experiment}}

    results = [result(["dyck2_bounded", "ab_star"], ["hybrid-1", "global"]), result(["ends_with_a"], ["global"])]
    experiment = reports.experiment_of(reports.formal_languages.ExperimentArguments, results)
    assert experiment.languages == ["ends_with_a", "ab_star", "dyck2_bounded"]
    assert experiment.variants == ["global", "hybrid-1"] and experiment.test_max_length == 500


def test_long_context_block_shows_each_published_run(tmp_path, monkeypatch):
    """Each run's notes, a table per window and its plot, from its results.json alone."""
    monkeypatch.setattr(benchmark_tables, "ROOT", tmp_path)
    monkeypatch.setattr(benchmark_tables, "DOCS", tmp_path / "docs" / "results")
    assert reports.long_context_tables().startswith("No run published yet.")
    folder = tmp_path / "docs" / "results" / reports.LONG_CONTEXT / "demo"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(synthetic_result()))
    block = reports.long_context_tables()
    assert block.startswith("**demo** ([results.json](results/long_context/demo/results.json)): llama, 1,000")
    assert "#### k = 64\n\n| local share |" in block and block.endswith(
        "![demo](results/long_context/demo/long_context.png)\n"
    )


def test_the_gap_by_epoch_table_is_the_medians_over_seeds(tmp_path, monkeypatch):
    """Each cell the median over seeds of the run's MSE at c = 10 after that epoch, a collapsed run left out; the
    ratio of the models' medians; Paper A's own medians in the last column."""
    monkeypatch.setattr(paper_a_tables, "DOCS", tmp_path)
    mse = {"positional": [[8.0, 2.0], [6.0, 1.0], [7.0, 4.0]], "standard": [[30.0, 40.0], [20.0, 50.0], [1.0, 1.0]]}
    for task in reports.TASK_NAMES:
        for model, by_seed in mse.items():
            for seed, (first, last) in enumerate(by_seed):
                run = tmp_path / "demo" / task / model / f"seed-{seed}"
                run.mkdir(parents=True)
                collapsed = model == "standard" and seed == 2
                by_epoch = {"5": {"10": first, "1": 0.0}, "20": {"10": last}}
                result = {"task": task, "model": model, "seed": seed, "collapse": {"collapsed": collapsed},
                          "by_epoch": by_epoch}  # fmt: skip
                (run / "results.json").write_text(json.dumps(result))
    table = reports.algorithmic_by_epoch_table("demo")
    paper = {m: reports.paper_numbers.ALGORITHMIC_MSE["sort", m, "median"][-1] for m in mse}
    assert "| sort, positional | 7.000 | 2.000 | " + f"{paper['positional']:g} |" in table
    assert "| sort, standard | 25.000 | 45.000 | " + f"{paper['standard']:g} |" in table  # seed 2 collapsed
    assert f"| sort, standard / positional | 3.6x | 22.5x | {paper['standard'] / paper['positional']:,.0f}x |" in table
    assert table.splitlines()[0] == "| task, model | epoch 5 | epoch 20 | Paper A, epoch 2,001 |"
