"""Collapsed runs: detected against a brute-force input-blind predictor, recorded, and kept out of the averages."""

import itertools
import math

import numpy as np
import pytest

from hf_attn.experiments import (
    aggregate,
    collapse_check,
    input_blind_error_rate,
    input_blind_mse,
    markdown_table,
    plateau_exit_step,
    unigram_nll,
    write_report,
)


def test_input_blind_mse_is_the_best_mse_of_any_per_position_constant():
    rng = np.random.default_rng(0)
    labels = rng.normal(size=(50, 4)) + np.arange(4)  # each position has its own mean
    labels[:, -1] = np.nan  # a scratchpad: never scored
    labels[3, 1] = np.nan
    best = input_blind_mse(labels)
    labelled = ~np.isnan(labels)
    for shift in itertools.product([-0.1, 0.0, 0.1], repeat=3):  # nudging any position's constant only hurts
        constants = np.nanmean(labels[:, :3], axis=0) + np.array(shift)
        mse = np.mean((labels[:, :3] - constants)[labelled[:, :3]] ** 2)
        assert mse >= best - 1e-12
    assert best == pytest.approx(np.mean((labels[:, :3] - np.nanmean(labels[:, :3], axis=0))[labelled[:, :3]] ** 2))
    answers = rng.normal(size=30)  # one answer per sample: the variance
    assert input_blind_mse(answers) == pytest.approx(np.var(answers))


def test_input_blind_error_rate_predicts_each_positions_majority():
    labels = np.array([[1, 2, -100], [1, 3, 5], [4, 3, 5], [1, 3, -100]])
    # position 0: 1 three times of 4; position 1: 3 three times of 4; position 2: 5 twice of 2
    assert input_blind_error_rate(labels) == pytest.approx(1 - (3 + 3 + 2) / 10)


def test_collapse_check_flags_errors_within_tolerance_of_the_input_blind_predictor():
    assert collapse_check(0.754, 0.776, "mse")["collapsed"]  # the cumulative-median run
    assert not collapse_check(0.005, 0.776, "mse")["collapsed"]
    assert not collapse_check(0.70, 0.776, "mse")["collapsed"]  # 10% better than blind: it learned something


def test_unigram_nll_is_the_smoothed_frequency_models_loss_token_by_token():
    reference, scored = [0, 0, 1, 2, 2, 2], [2, 0, 3]  # token 3 never seen: add-one smoothing keeps it finite
    vocab = 5
    probability = {t: (reference.count(t) + 1) / (len(reference) + vocab) for t in range(vocab)}
    expected = -sum(math.log(probability[t]) for t in scored) / len(scored)
    assert unigram_nll(reference, scored, vocab) == pytest.approx(expected)
    assert unigram_nll(np.array(reference), np.array(scored), vocab) == pytest.approx(expected)


def test_plateau_exit_step_is_the_first_log_clearly_below_the_plateau():
    curve = [[50, 7.6], [100, 7.3], [150, 7.2], [200, 6.8], [250, 6.1]]
    assert plateau_exit_step(curve, 7.4) == 200  # 7.2 is within 5% of 7.4, 6.8 is not
    assert plateau_exit_step(curve, 7.4, tolerance=0.01) == 100  # 7.3 < 0.99 * 7.4
    assert plateau_exit_step(curve[:3], 7.4) is None
    assert plateau_exit_step([], 7.4) is None


def result(model, seed, mse, collapsed):
    check = collapse_check(0.8 if collapsed else 0.01, 0.8, "mse")
    return {"model": model, "seed": seed, "collapse": check, "by_scale": {"1": {"mse": mse}, "2": {"mse": 2 * mse}}}


def test_collapsed_runs_are_listed_and_left_out_of_means_and_medians(tmp_path):
    results = [result("positional", 0, 0.01, False), result("positional", 1, 0.03, False),
               result("positional", 2, 0.8, True), result("standard", 0, 0.8, True)]  # fmt: skip
    summary = aggregate(results, "mse")
    assert summary["positional"]["1"] == {"mean": pytest.approx(0.02), "median": pytest.approx(0.02), "min": 0.01,
                                          "max": 0.03, "runs": 2}  # fmt: skip
    assert summary["standard"]["1"]["runs"] == 0 and math.isnan(summary["standard"]["1"]["mean"])  # all collapsed
    assert "| 1 | 0.020 | 0.020 | n/a | n/a |" in markdown_table(summary)
    report = write_report(tmp_path, "min: MSE", results, [("mse", "MSE", True)])
    assert "positional 2, standard 0" in report
    assert "positional seed 2 (mse 0.800, input-blind predictor 0.800)" in report
    assert "standard seed 0" in report and (tmp_path / "results.md").read_text() == report


def test_report_says_when_no_run_collapsed(tmp_path):
    report = write_report(tmp_path, "min: MSE", [result("positional", 0, 0.01, False)], [("mse", "MSE", True)])
    assert "No run collapsed" in report
    assert not math.isnan(aggregate([result("positional", 0, 1.0, False)], "mse")["positional"]["1"]["mean"])
