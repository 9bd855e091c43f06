"""Paper A's data generators against brute-force references written here with plain Python loops."""

import dataclasses
import math
import re
import statistics

import numpy as np
import pytest
import torch

from hf_attn.data import (
    ALGORITHMIC_TASKS,
    MIXED_TASKS,
    CharVocab,
    InductionVocab,
    MixedSample,
    algorithmic_dataset,
    algorithmic_targets,
    khop_dataset,
    khop_targets,
    mixed_dataset,
    parse_answer,
    render_for_positional,
    render_text,
    render_text_with_answer,
    sample_mixed,
    sample_subranges,
    sample_values,
)

# ---------------------------------------------------------------- naive references


def naive_max_subarray(xs: list[float]) -> float:
    return max(sum(xs[i : j + 1]) for i in range(len(xs)) for j in range(i, len(xs)))


NAIVE_TARGETS = {
    "cumulative_sum": lambda xs, i: sum(xs[: i + 1]),
    "cumulative_min": lambda xs, i: min(xs[: i + 1]),
    "cumulative_median": lambda xs, i: statistics.median(xs[: i + 1]),
    "sort": lambda xs, i: sorted(xs)[i],
    "cumulative_max_subarray_sum": lambda xs, i: naive_max_subarray(xs[: i + 1]),
}


def naive_khop(sequence: list, hops: int, no_answer):
    """The definition, one position at a time: k times, jump right after the previous occurrence of the current item."""
    targets = []
    for t in range(len(sequence)):
        position = t
        for _ in range(hops):
            earlier = [j for j in range(position) if sequence[j] == sequence[position]]
            if not earlier:
                position = None
                break
            position = earlier[-1] + 1
        targets.append(no_answer if position is None else sequence[position])
    return targets


PRICE = re.compile(r"\d{2,}\.\d{2}")
QUERY = re.compile(r"Find (min|sum|max) of categories (Cat\S), (Cat\S), (Cat\S) and (Cat\S)\.")


def parse_prompt(text: str) -> dict:
    """Read a text rendering back: priced names and prices in order, decoys, op and queried names."""
    listing, query = text.split(". Find ")
    entries = listing.split(", ")
    names, prices, decoys = [], [], []
    i = 0
    while i < len(entries):
        if re.fullmatch(r"Cat[+-].", entries[i]):
            decoys.append(entries[i])
            i += 1
        else:
            assert re.fullmatch(r"Cat[A-Z]", entries[i]) and PRICE.fullmatch(entries[i + 1]), entries[i : i + 2]
            names.append(entries[i])
            prices.append(float(entries[i + 1]))
            i += 2
    match = QUERY.fullmatch("Find " + query)
    assert match, query
    return {"names": names, "prices": prices, "decoys": decoys, "op": match[1], "queried": list(match.groups()[1:])}


# ---------------------------------------------------------------- algorithmic tasks


@pytest.mark.parametrize("task", ALGORITHMIC_TASKS)
@pytest.mark.parametrize("length", [1, 5, 8])
def test_algorithmic_targets_match_naive(task, length):
    values = sample_values(40, length, scale=3.0, seed=length)
    targets = algorithmic_targets(task, values)
    expected = [[NAIVE_TARGETS[task](row, i) for i in range(length)] for row in values.tolist()]
    np.testing.assert_allclose(targets, expected, rtol=0, atol=1e-12)


def test_median_interpolates_even_counts():
    targets = algorithmic_targets("cumulative_median", np.array([[4.0, 1.0, 3.0, 2.0]]))
    np.testing.assert_allclose(targets, [[4.0, 2.5, 3.0, 2.5]])


def test_max_subarray_of_all_negative_is_the_largest_element():
    targets = algorithmic_targets("cumulative_max_subarray_sum", np.array([[-3.0, -1.0, -2.0, 5.0, -1.0, 2.0]]))
    np.testing.assert_allclose(targets, [[-3.0, -1.0, -1.0, 5.0, 5.0, 6.0]])


@pytest.mark.parametrize("task", ALGORITHMIC_TASKS)
def test_algorithmic_dataset_has_scratchpad_and_float32_labels(task):
    data = algorithmic_dataset(task, 30, length=8, scale=2.0, seed=1)
    values, labels = data[:]["numeric_values"], data[:]["labels"]
    assert isinstance(values, torch.Tensor) and values.dtype == labels.dtype == torch.float32
    assert values.shape == labels.shape == (30, 9)
    assert (values[:, -1] == 0).all() and torch.isnan(labels[:, -1]).all()
    assert not torch.isnan(labels[:, :-1]).any()
    expected = [[NAIVE_TARGETS[task](row, i) for i in range(8)] for row in values[:, :-1].double().tolist()]
    np.testing.assert_allclose(labels[:, :-1].numpy(), expected, rtol=1e-6, atol=1e-5)

    plain = algorithmic_dataset(task, 30, length=8, scale=2.0, seed=1, scratchpad=False)
    assert plain[:]["numeric_values"].shape == (30, 8) and not torch.isnan(plain[:]["labels"]).any()
    torch.testing.assert_close(plain[:]["numeric_values"], values[:, :-1])


@pytest.mark.parametrize("scale", [1.01, 1.5, 3.0, 10.0])
def test_ood_subranges_are_never_inside_the_training_range(scale):
    ranges = sample_subranges(np.random.default_rng(0), 5000, scale, low=-2.0, high=2.0)
    low, high = ranges[:, 0], ranges[:, 1]
    assert (low <= high).all() and (low >= -2 * scale).all() and (high <= 2 * scale).all()
    assert not ((low >= -2) & (high <= 2)).any()
    assert ((low < -2) & (high > 2)).any() and ((low > -2) & (high > 2)).any()  # straddling and one-sided both occur


def test_values_lie_in_their_subranges_and_in_distribution_stays_inside():
    for scale in (1.0, 4.0):
        values = sample_values(2000, 8, scale, seed=3)
        ranges = sample_subranges(np.random.default_rng(3), 2000, scale)
        assert (values >= ranges[:, :1]).all() and (values <= ranges[:, 1:]).all()
    ranges = sample_subranges(np.random.default_rng(0), 2000, 1.0)
    assert ((ranges >= -2) & (ranges <= 2)).all()
    assert (np.abs(sample_values(2000, 8, 1.0, seed=0)) <= 2).all()
    assert np.abs(sample_values(2000, 8, 4.0, seed=0)).max() > 2


# ---------------------------------------------------------------- k-hop induction heads


def test_khop_targets_match_naive_with_repeats_allowed():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 7, size=(60, 25))  # repeats and immediate repeats on purpose
    hops = rng.integers(0, 5, size=60)
    targets = khop_targets(tokens, hops, no_answer_id=-7)
    for row, k, target in zip(tokens.tolist(), hops.tolist(), targets.tolist(), strict=True):
        assert target == naive_khop(row, k, -7)


@pytest.mark.parametrize("split", ["train", "ood"])
def test_khop_dataset_matches_definition(split):
    vocab = InductionVocab(max_hops=3)
    data = khop_dataset(200, length=40, max_hops=3, split=split, seed=5)
    input_ids, labels = data[:]["input_ids"], data[:]["labels"]
    assert input_ids.shape == labels.shape == (200, 41) and input_ids.dtype == torch.int64
    assert (labels[:, 0] == -100).all()
    hops = input_ids[:, 0]
    assert set(hops.tolist()) == {0, 1, 2, 3}
    characters = input_ids[:, 1:]
    assert (characters[:, 1:] != characters[:, :-1]).all()  # no immediate repeats
    allowed = vocab.train_char_ids if split == "train" else vocab.ood_char_ids
    assert set(characters.unique().tolist()) == set(allowed.tolist())
    for row, k, target in zip(characters.tolist(), hops.tolist(), labels[:, 1:].tolist(), strict=True):
        assert target == naive_khop(row, k, vocab.no_answer_id)
    assert (labels[hops == 0, 1:] == characters[hops == 0]).all()
    assert (labels == vocab.no_answer_id).any()


def test_induction_vocab_layout_and_fixed_hops():
    vocab = InductionVocab(max_hops=3)
    assert vocab.tokens[:4] == ("<hop0>", "<hop1>", "<hop2>", "<hop3>")
    assert vocab.tokens[vocab.no_answer_id] == "<no_answer>" and vocab.tokens[vocab.pad_id] == "<pad>"
    assert vocab.vocab_size == 4 + 10 + 2 == len(vocab.tokens)
    assert not set(vocab.train_char_ids.tolist()) & set(vocab.ood_char_ids.tolist())
    assert vocab.decode([2, 4, 5, 4, vocab.no_answer_id, -100]) == "<hop2>aba<no_answer>"
    data = khop_dataset(20, length=10, max_hops=2, hops=1, seed=0)
    assert (data[:]["input_ids"][:, 0] == InductionVocab(2).hop_ids[1]).all()


# ---------------------------------------------------------------- mixed text + numbers


@pytest.mark.parametrize("task", MIXED_TASKS)
@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_mixed_renderings_describe_the_same_sample(task, scale):
    text = mixed_dataset(60, task, rendering="text", scale=scale, seed=2)
    positional = mixed_dataset(60, task, rendering="positional", scale=scale, seed=2)
    vocab = CharVocab()
    for i in range(60):
        row, numeric = text[i], positional[i]
        answer = row["text"].rsplit(" ", 1)[1]
        assert row["text"] == f"{row['prompt']} Answer: {answer}" and re.fullmatch(r"\d{3,}\.\d{2}", answer)
        parsed = parse_prompt(row["prompt"])
        assert len(parsed["names"]) == 8 and len(parsed["decoys"]) == 2 and len(set(parsed["queried"])) == 4
        prices = dict(zip(parsed["names"], parsed["prices"], strict=True))
        queried = [prices[name] for name in parsed["queried"]]
        expected = {"min": min, "max": max, "sum": lambda xs: round(sum(xs), 2)}[parsed["op"]](queried)
        assert parse_answer(row["text"]) == pytest.approx(expected, abs=1e-9) == row["answer"]

        mask, values = numeric["numeric_mask"], numeric["numeric_values"]
        assert mask.sum() == 9 and mask[-9:].all() and numeric["attention_mask"].all()
        np.testing.assert_allclose(values[mask][:8].numpy(), parsed["prices"], rtol=1e-6)
        assert values[mask][8] == 0 and (values[~mask] == 0).all()  # scratchpad slot, then the characters
        assert numeric["labels"].item() == pytest.approx(expected, rel=1e-6)
        characters = vocab.decode(numeric["input_ids"][~mask])
        assert characters == PRICE.sub("#", row["prompt"])
        assert (numeric["input_ids"][mask] == vocab.number_id).all()


def test_mixed_task_ops_and_names():
    assert {s.op for s in sample_mixed(100, "min")} == {"min"}
    assert {s.op for s in sample_mixed(100, "sum")} == {"sum"}
    assert {s.op for s in sample_mixed(100, "multitask")} == {"min", "max"}
    seen = {name[-1] for s in sample_mixed(300, "sum", names="seen") for name in s.categories + s.decoys}
    unseen = {name[-1] for s in sample_mixed(300, "sum", names="unseen") for name in s.categories + s.decoys}
    assert seen and unseen and not seen & unseen
    for sample in sample_mixed(300, "multitask", scale=4.0, seed=9):
        assert all(round(price, 2) == price and price >= 0 for price in sample.prices)
        assert set(sample.queried) <= set(sample.categories) and len(set(sample.queried)) == 4
        assert not set(sample.decoys) & set(sample.categories)
        assert all(re.fullmatch(r"Cat[+-].", decoy) for decoy in sample.decoys)
        assert parse_prompt(render_text(sample))["decoys"] == list(sample.decoys)  # never followed by a price


def test_text_rendering_formats_numbers():
    sample = MixedSample(
        categories=("CatA", "CatB"),
        prices=(0.71, 12.5),
        decoys=("Cat+B",),
        decoy_positions=(1,),
        queried=("CatA", "CatB"),
        op="sum",
        answer=123.45,
    )
    assert render_text(sample) == "CatA, 00.71, Cat+B, CatB, 12.50. Find sum of categories CatA and CatB."
    assert render_text_with_answer(sample).endswith("CatB. Answer: 123.45")
    assert render_text_with_answer(dataclasses.replace(sample, answer=0.5)).endswith("CatB. Answer: 000.50")
    positional = render_for_positional(sample)
    characters = "CatA, #, Cat+B, CatB, #. Find sum of categories CatA and CatB."
    assert CharVocab().decode(positional["input_ids"]) == characters + "<num>" * 3  # 2 prices and the scratchpad
    np.testing.assert_allclose(positional["numeric_values"][-3:], [0.71, 12.5, 0.0])
    assert positional["labels"] == pytest.approx(123.45)


@pytest.mark.parametrize(
    "generated, expected",
    [
        ("... and CatH. Answer: 00.89", 0.89),
        ("Answer:12.5", 12.5),
        ("Answer: 123.45 Answer: 1.00", 123.45),
        ("Answer: 7 and more", 7.0),
        ("", None),
        ("no answer here 12.5", None),
        ("Answer:", None),
        ("Answer: abc 3.0", None),
        ("Answer: .", None),
        (None, None),
        (b"Answer: 1.0", None),
    ],
)
def test_parse_answer_never_raises(generated, expected):
    assert parse_answer(generated) == expected


def test_char_vocab_is_fixed_and_covers_both_name_sets():
    vocab = CharVocab()
    assert vocab.pad_id == 0 and vocab.number_id == 1 and vocab.vocab_size == len(vocab.characters) + 2
    for names in ("seen", "unseen"):
        for sample in sample_mixed(50, "multitask", names=names):
            assert (vocab.encode(render_text(sample)) >= 2).all()
    with pytest.raises(ValueError, match="`text`"):
        vocab.encode("CatA costs $5")


# ---------------------------------------------------------------- shared properties

BUILDERS = {
    "algorithmic": lambda seed: algorithmic_dataset("sort", 50, seed=seed, scale=2.0)[:]["numeric_values"],
    "khop": lambda seed: khop_dataset(20, length=30, seed=seed)[:]["input_ids"],
    "mixed_positional": lambda seed: mixed_dataset(20, "sum", seed=seed)[:]["numeric_values"],
    "mixed_text": lambda seed: mixed_dataset(20, "multitask", rendering="text", seed=seed)["text"],
}


@pytest.mark.parametrize("kind", BUILDERS)
def test_seeded(kind):
    build = BUILDERS[kind]
    first, again, other = build(0), build(0), build(1)
    if isinstance(first, torch.Tensor):
        assert torch.equal(first, again) and not torch.equal(first, other)
    else:
        assert first == again and first != other


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: algorithmic_targets("mean", np.zeros((2, 3))), "task"),
        (lambda: algorithmic_dataset("cumulative_mean", 10), "task"),
        (lambda: algorithmic_targets("sort", np.zeros(3)), "values"),
        (lambda: sample_values(10, 8, scale=0.5, seed=0), "scale"),
        (lambda: sample_values(10, 8, scale=math.nan, seed=0), "scale"),
        (lambda: sample_values(10, 8, scale=1.0, seed=0, low=2.0, high=-2.0), "low"),
        (lambda: sample_values(10, 0, scale=1.0, seed=0), "length"),
        (lambda: sample_values(0, 8, scale=1.0, seed=0), "num_samples"),
        (lambda: khop_dataset(10, split="test"), "split"),
        (lambda: khop_dataset(10, max_hops=-1), "max_hops"),
        (lambda: khop_dataset(10, max_hops=2, hops=3), "hops"),
        (lambda: khop_dataset(10, length=0), "length"),
        (lambda: khop_dataset(0), "num_samples"),
        (lambda: khop_targets(np.zeros((2, 3)), np.zeros(2, dtype=int)), "tokens"),
        (lambda: khop_targets(np.zeros((2, 3), dtype=int), np.array([0, -1])), "hops"),
        (lambda: sample_mixed(10, "max"), "task"),
        (lambda: sample_mixed(10, "sum", names="greek"), "names"),
        (lambda: sample_mixed(10, "sum", scale=0.9), "scale"),
        (lambda: sample_mixed(0, "sum"), "num_samples"),
        (lambda: mixed_dataset(10, "sum", rendering="image"), "rendering"),
        (lambda: CharVocab("aa"), "characters"),
    ],
)
def test_bad_inputs_name_the_field(call, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        call()
