"""benchmarks/head_agreement.py on scorings whose agreement is known by hand."""

import json

import numpy
import pytest

from benchmarks import head_agreement


def test_correlation_difference_and_shared_lowest_groups_of_a_npy_and_a_score_file(tmp_path, capsys):
    numpy.save(tmp_path / "kvpress.npy", numpy.array([[0.1, 0.2], [0.3, 0.4]], dtype=numpy.float32))
    (tmp_path / "same.json").write_text(json.dumps({"scores": [[0.2, 0.3], [0.4, 0.5]]}))  # shifted: same order
    (tmp_path / "flipped.json").write_text(json.dumps({"scores": [[0.4, 0.3], [0.2, 0.1]]}))  # reversed
    head_agreement.main(["--scores", str(tmp_path / "kvpress.npy"), str(tmp_path / "same.json"),
                         str(tmp_path / "flipped.json"), "--fractions", "0.25", "0.5", "--output-dir",
                         str(tmp_path / "out")])  # fmt: skip
    same, flipped = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert same["correlation"] == 1.0 and same["max_abs_difference"] == 0.1 and same["groups"] == 4
    assert same["lowest"] == {"0.25": {"local": 1, "shared": 1}, "0.5": {"local": 2, "shared": 2}}
    assert flipped["correlation"] == -1.0 and flipped["max_abs_difference"] == 0.3
    assert flipped["lowest"] == {"0.25": {"local": 1, "shared": 0}, "0.5": {"local": 2, "shared": 0}}
    text = capsys.readouterr().out
    assert text == (tmp_path / "out" / "agreement.md").read_text() and "| 1.000 | 0.1000 | 1 of 1 | 2 of 2 |" in text


def test_shapes_files_and_fractions_are_checked(tmp_path, capsys):
    numpy.save(tmp_path / "a.npy", numpy.zeros((2, 2)))
    numpy.save(tmp_path / "b.npy", numpy.zeros((2, 3)))
    with pytest.raises(SystemExit, match="the same \\(layers, heads\\) shape, got \\(2, 2\\) and \\(2, 3\\)"):
        head_agreement.main(["--scores", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--output-dir",
                             str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit):
        head_agreement.main(["--scores", str(tmp_path / "a.npy"), "--fractions", "0", "--output-dir", str(tmp_path)])
    error = capsys.readouterr().err
    assert "--scores needs at least two files, got 1" in error
    assert "--fractions must all be in (0, 1], got [0.0]" in error
