"""training/reports.py: the committed reports and README tables are what the committed results give."""

import filecmp
import json
import shutil

import pytest

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
    monkeypatch.setattr(reports, "DOCS", tmp_path / "docs")
    reports.publish(tmp_path / "out", "demo")
    copied = tmp_path / "docs" / "demo" / "min"
    assert (copied / "results.md").read_text() == "# report"
    assert (copied / "positional" / "seed-0" / "results.json").exists()
    assert not (copied / "positional" / "seed-0" / "model").exists()
    assert not (copied / "positional" / "seed-0" / "checkpoint-4").exists()


def test_readme_tables_are_the_committed_results():
    readme = reports.README.read_text()
    assert readme.count("<!-- generated: ") == len(reports.TABLES)
    assert reports.splice_tables(readme) == readme, "run `python -m training.reports` and commit README.md"


@pytest.mark.parametrize("name", reports.PUBLISHED)
def test_committed_reports_are_the_committed_results(name, tmp_path):
    copy = tmp_path / name
    shutil.copytree(reports.DOCS / name, copy)
    reports.write_family_reports(copy)
    reports_md = sorted(path.relative_to(copy) for path in copy.glob("**/results.md"))
    assert reports_md, f"no report in docs/results/{name}"
    for path in reports_md:
        assert filecmp.cmp(copy / path, reports.DOCS / name / path, shallow=False), f"{name}/{path} is stale"


def test_runs_of_several_commands_report_as_one_experiment():
    """Two commands, each on a subset of the languages (run in parallel), make one experiment in canonical order."""

    def result(languages, variants):
        experiment = {"languages": languages, "variants": variants, "seeds": [0], "test_max_length": 500}
        return {"experiment": "formal_languages", "config": {"experiment": experiment}}

    results = [result(["dyck2_bounded", "ab_star"], ["hybrid-1", "global"]), result(["ends_with_a"], ["global"])]
    experiment = reports.experiment_of(reports.formal_languages.ExperimentArguments, results)
    assert experiment.languages == ["ends_with_a", "ab_star", "dyck2_bounded"]
    assert experiment.variants == ["global", "hybrid-1"] and experiment.test_max_length == 500
