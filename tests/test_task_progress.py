"""benchmarks/task_progress.py: a task stopped after some batches resumes with the rest only, and its answers are those
of a task answered in one run; progress kept for other settings, or cut short, is not read back. The two runners
that use it are tested through their own entry points in tests/test_ruler_benchmark.py and
tests/test_kvpress_records.py."""

import json

import pytest

from benchmarks import task_progress

SETTINGS = {"model": "m", "batch_size": 2}
BATCHES = [[{"index": 2 * b}, {"index": 2 * b + 1}] for b in range(3)]


class Stop(Exception):
    """The run stopped (the machine taken back)."""


class Model:
    """Answers each record with its index squared; stops when asked for batch `stop_at` (counted from 0)."""

    def __init__(self, stop_at: int | None = None):
        self.asked: list[int] = []
        self.stop_at = stop_at

    def __call__(self, batch: list[dict]) -> list[dict]:
        if len(self.asked) == self.stop_at:
            raise Stop
        self.asked.append(batch[0]["index"])
        return [{"pred": str(record["index"] ** 2)} for record in batch]


def load() -> dict:
    return {"uptime": "up"}


def run(folder, model, settings=SETTINGS):
    return task_progress.answer_batches(folder, "vt", settings, BATCHES, model, load)


def test_a_stopped_task_resumes_with_the_batches_it_had_not_answered(tmp_path):
    whole, whole_run = run(tmp_path / "one", Model())
    with pytest.raises(Stop):
        run(tmp_path, Model(stop_at=2))
    kept = json.loads(task_progress.path_of(tmp_path, "vt").read_text())
    assert len(kept["batches"]) == 2 and kept["parts"] == 1
    rest = Model()
    answers, resumed = run(tmp_path, rest)
    assert rest.asked == [4]  # the third batch only
    assert answers == whole == [{"pred": str(i**2)} for i in range(6)]
    assert resumed["parts"] == 2 and "parts" not in whole_run
    assert resumed["started"] == kept["started"] and resumed["seconds"] >= kept["seconds"]
    assert resumed["machine"] == {"before": {"uptime": "up"}, "after": {"uptime": "up"}}


def test_progress_of_other_settings_or_cut_short_is_not_read_back(tmp_path):
    with pytest.raises(Stop):
        run(tmp_path, Model(stop_at=2))
    other = Model()
    run(tmp_path, other, SETTINGS | {"batch_size": 1})
    assert other.asked == [0, 2, 4]
    path = task_progress.path_of(tmp_path, "vt")
    path.write_text(path.read_text()[:20])  # a file cut short (not written by `keep`, which renames)
    again = Model()
    run(tmp_path, again, SETTINGS | {"batch_size": 1})
    assert again.asked == [0, 2, 4]


def test_clear_leaves_no_progress_and_the_next_run_asks_everything(tmp_path):
    run(tmp_path, Model())
    task_progress.clear(tmp_path, "vt")
    assert not task_progress.path_of(tmp_path, "vt").exists()
    model = Model()
    run(tmp_path, model)
    assert model.asked == [0, 2, 4]


def test_a_model_giving_too_few_answers_is_refused_naming_the_task(tmp_path):
    with pytest.raises(ValueError, match="vt: 1 answers for a batch of 2 records"):
        run(tmp_path, lambda batch: [{"pred": ""}])


class Together:
    """Answers for several runs at once: run i answers record r with "i:r", charged 10 (i + 1) seconds; stops when
    asked for its call `stop_at` (counted from 0)."""

    def __init__(self, stop_at: int | None = None):
        self.asked: list[tuple[int, list[int]]] = []
        self.stop_at = stop_at

    def __call__(self, batch: list[dict], which: list[int]) -> tuple[list[list[dict]], list[float]]:
        if len(self.asked) == self.stop_at:
            raise Stop
        self.asked.append((batch[0]["index"], which))
        answers = [[{"pred": f"{i}:{record['index']}"} for record in batch] for i in which]
        return answers, [10.0 * (i + 1) for i in which]


def test_runs_answered_together_each_resume_from_their_own_progress(tmp_path):
    """Two runs sharing each batch's work (kvpress's presses on one prefill): one kept two batches from a run of its
    own, the other none; together, each is asked only the batches it lacks, charged the seconds given for it, and
    leaves the progress `answer_batches` reads back."""
    with pytest.raises(Stop):
        run(tmp_path / "first", Model(stop_at=2))
    runs = [(tmp_path / "first", SETTINGS), (tmp_path / "second", SETTINGS)]
    with pytest.raises(Stop):  # the machine taken back at the third call
        task_progress.answer_together(runs, "vt", BATCHES, stopped := Together(stop_at=2), load)
    assert stopped.asked == [(0, [1]), (2, [1])]
    rest = Together()
    (first, first_run), (second, second_run) = task_progress.answer_together(runs, "vt", BATCHES, rest, load)
    assert rest.asked == [(4, [0, 1])]
    assert first == [{"pred": "0"}, {"pred": "1"}, {"pred": "4"}, {"pred": "9"}, {"pred": "0:4"}, {"pred": "0:5"}]
    assert second == [{"pred": f"1:{i}"} for i in range(6)]
    assert second_run["seconds"] == 60.0 and second_run["parts"] == 2 and first_run["parts"] == 2
    assert first_run["seconds"] >= 10.0
    never = Model()
    assert run(tmp_path / "second", never)[0] == second and never.asked == []  # read back by answer_batches


def test_runs_answered_together_are_refused_too_few_answers_naming_the_task(tmp_path):
    with pytest.raises(ValueError, match="vt: 1 answers for a batch of 2 records"):
        task_progress.answer_together([(tmp_path, SETTINGS)], "vt", BATCHES,
                                      lambda batch, which: ([[{"pred": ""}]], [0.0]), load)  # fmt: skip
