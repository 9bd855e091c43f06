"""Paper B's formal-language generator, checked against the regex recognizers, which are checked by hand first."""

import itertools
import re

import numpy as np
import pytest

from hf_attn.data import ALPHABETS, LANGUAGES, FormalLanguageVocab, formal_language_dataset, recognizer, sample_strings

# Hand-written members and non-members: the check on the reference itself.
EXAMPLES = {
    "ends_with_a": (["a", "ba", "cca", "aba"], ["", "b", "ab", "aac"]),
    "ends_with_ab": (["ab", "aab", "cab", "bcab"], ["", "a", "b", "ba", "abc", "acb"]),
    "starts_with_a": (["a", "ab", "acc", "abcba"], ["", "b", "ca", "baaa"]),
    "contains_a_then_b": (["ab", "acb", "cacccb", "bbacab"], ["", "a", "ba", "bbcaa", "ccc"]),
    "ab_star": (["", "ab", "abab", "ababab"], ["a", "ba", "aabb", "abba", "abc", "abababa"]),
    "contains_ab": (["ab", "cab", "abc", "bbaabc"], ["", "a", "ba", "acb", "bbbaaa"]),
    "right_deterministic_polynomial": (
        ["a", "ab", "cadb", "aaa", "acdab", "dddadbb"],
        ["", "b", "ba", "ac", "bca", "aabc", "cbad"],
    ),
    "dyck2_bounded": (
        ["", "ab", "abab", "aabb", "aababb", "aabbab", "aababbab"],
        ["a", "ba", "abb", "aaabbb", "abba", "aabcb", "aab"],
    ),
}


def one_substitution_from_member(string: str, accepts, alphabet: str) -> bool:
    return any(
        accepts(string[:i] + symbol + string[i + 1 :])
        for i in range(len(string))
        for symbol in alphabet
        if symbol != string[i]
    )


def negatives(language: str, num_samples: int = 400, seed: int = 0) -> list[str]:
    strings, labels = sample_strings(language, num_samples, 1, 40, seed)
    return [string for string, label in zip(strings, labels, strict=True) if label == 0]


@pytest.mark.parametrize("language", LANGUAGES)
def test_recognizer_on_hand_written_examples(language):
    accepts = recognizer(language)
    members, non_members = EXAMPLES[language]
    assert all(accepts(string) for string in members)
    assert not any(accepts(string) for string in non_members)


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("min_length, max_length", [(0, 40), (3, 9), (40, 41)])
def test_labels_agree_with_recognizer_balanced_and_in_range(language, min_length, max_length):
    strings, labels = sample_strings(language, 600, min_length, max_length, seed=1)
    accepts = recognizer(language)
    assert [int(accepts(string)) for string in strings] == labels.tolist()
    assert labels.sum() == 300
    lengths = np.array([len(string) for string in strings])
    assert lengths.min() >= min_length and lengths.max() <= max_length
    assert set("".join(strings)) <= set(ALPHABETS[language])


@pytest.mark.parametrize("language", LANGUAGES)
def test_lengths_cover_the_allowed_range_for_both_classes(language):
    strings, labels = sample_strings(language, 4000, 1, 12, seed=2)
    lengths = np.array([len(string) for string in strings])
    expected = set(range(2 if language in ("ends_with_ab", "contains_a_then_b", "contains_ab") else 1, 13))
    if language in ("ab_star", "dyck2_bounded"):  # members only at even lengths
        expected = {length for length in expected if length % 2 == 0}
    for label in (0, 1):
        assert set(lengths[labels == label].tolist()) == expected


def test_odd_num_samples_splits_within_one():
    _, labels = sample_strings("contains_ab", 7, seed=0)
    assert labels.sum() == 3 and len(labels) == 7


@pytest.mark.parametrize(
    "language",
    ["ends_with_a", "ends_with_ab", "starts_with_a", "ab_star", "right_deterministic_polynomial", "dyck2_bounded"],
)
def test_negatives_are_one_substitution_from_a_member(language):
    accepts = recognizer(language)
    assert all(one_substitution_from_member(s, accepts, ALPHABETS[language]) for s in negatives(language))


def test_ends_with_negatives_have_a_wrong_final_symbol():
    assert all(string[-1] != "a" for string in negatives("ends_with_a"))
    ends = {string[-2:] for string in negatives("ends_with_ab")}
    assert "ab" not in ends
    assert any(end[-1] == "b" for end in ends) and any(end[0] == "a" for end in ends)  # both places get flipped


def test_starts_with_a_negatives_differ_only_in_the_first_symbol():
    accepts = recognizer("starts_with_a")
    assert all(string[0] != "a" and accepts("a" + string[1:]) for string in negatives("starts_with_a"))


def test_ab_star_and_dyck_negatives_flip_a_bracket_only():
    for language in ("ab_star", "dyck2_bounded"):
        accepts = recognizer(language)
        for string in negatives(language):
            assert "c" not in string
            assert one_substitution_from_member(string, accepts, "ab")


def test_dyck_members_nest_at_most_two_deep_and_reach_two():
    strings, labels = sample_strings("dyck2_bounded", 400, 2, 20, seed=3)
    depths = []
    for string in (s for s, label in zip(strings, labels, strict=True) if label):
        heights = np.cumsum([1 if symbol == "a" else -1 for symbol in string])
        assert heights.min() >= 0 and heights[-1] == 0
        depths.append(heights.max())
    assert set(depths) == {1, 2}


def test_contains_negatives_miss_the_pattern_but_use_both_symbols():
    for language, pattern in (("contains_ab", r"ab"), ("contains_a_then_b", r"a.*b")):
        strings = negatives(language)
        assert not any(re.search(pattern, string) for string in strings)
        assert np.mean(["a" in string and "b" in string for string in strings]) > 0.6
        accepts = recognizer(language)
        near = [one_substitution_from_member(string, accepts, ALPHABETS[language]) for string in strings]
        assert np.mean(near) > 0.8


def test_polynomial_negatives_break_the_last_a():
    for string in negatives("right_deterministic_polynomial"):
        last_a = string.rfind("a")
        assert last_a < 0 or "b" in string[:last_a] or "c" in string[last_a + 1 :]


@pytest.mark.parametrize("language", LANGUAGES)
def test_seed_reproducible(language):
    first, first_labels = sample_strings(language, 50, seed=5)
    again, again_labels = sample_strings(language, 50, seed=5)
    other, _ = sample_strings(language, 50, seed=6)
    assert first == again and first_labels.tolist() == again_labels.tolist()
    assert first != other


@pytest.mark.parametrize("language", LANGUAGES)
def test_dataset_framing(language):
    vocab = FormalLanguageVocab(language)
    dataset = formal_language_dataset(language, 64, min_length=1, max_length=15, seed=4)
    strings, labels = sample_strings(language, 64, 1, 15, seed=4)
    input_ids, mask, token_labels, lengths = (dataset[:][key].numpy() for key in dataset.column_names)
    assert dataset.column_names == ["input_ids", "attention_mask", "labels", "length"]
    assert input_ids.shape[1] == lengths.max() + 2
    accepts = recognizer(language)
    for row, string in enumerate(strings):
        eos = lengths[row] + 1
        assert input_ids[row, 0] == vocab.bos_id and input_ids[row, eos] == vocab.eos_id
        assert (input_ids[row, eos + 1 :] == vocab.pad_id).all()
        assert input_ids[row, : eos + 1].tolist() == vocab.encode(string)
        assert vocab.decode(input_ids[row]) == string
        assert mask[row].tolist() == [1] * (eos + 1) + [0] * (input_ids.shape[1] - eos - 1)
        assert np.flatnonzero(token_labels[row] != -100).tolist() == [eos]
        assert token_labels[row, eos] == labels[row] == int(accepts(string))
    assert vocab.vocab_size == 3 + len(ALPHABETS[language])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"language": "anbn"}, "language"),
        ({"num_samples": 0}, "num_samples"),
        ({"min_length": -1}, "min_length"),
        ({"min_length": 5, "max_length": 4}, "max_length"),
        ({"language": "ab_star", "min_length": 1, "max_length": 1}, "min_length"),
        ({"language": "contains_ab", "min_length": 0, "max_length": 1}, "min_length"),
    ],
)
def test_bad_inputs_raise_naming_the_field(kwargs, field):
    arguments = {"language": "ends_with_a", "num_samples": 10} | kwargs
    with pytest.raises(ValueError, match=f"`{field}`"):
        formal_language_dataset(**arguments)
    with pytest.raises(ValueError, match=f"`{field}`"):
        sample_strings(**arguments)


def test_vocab_refuses_unknown_language_and_symbols():
    with pytest.raises(ValueError, match="`language`"):
        FormalLanguageVocab("dyck")
    with pytest.raises(ValueError, match="`string`"):
        FormalLanguageVocab("ends_with_a").encode("abd")


# --- contains_positives="uniform" --------------------------------------------------------------------------------


def share_with_ab_in_last(symbols: int) -> float:
    """Brute force over every string of `symbols` symbols of {a, b, c}: the share holding ab. A long uniform member of
    Σ*abΣ* ends so with this probability (whether an ab comes earlier hardly matters)."""
    strings = ["".join(s) for s in itertools.product("abc", repeat=symbols)]
    return sum("ab" in s for s in strings) / len(strings)


def test_uniform_members_are_uniform_strings_that_hold_the_pattern():
    strings, labels = sample_strings("contains_ab", 4000, 300, 300, seed=7, contains_positives="uniform")
    members = [s for s, label in zip(strings, labels, strict=True) if label == 1]
    assert all(recognizer("contains_ab")(s) for s in members) and len(members) == 2000
    for symbols in (6, 11):  # what a 1-local and a 2-local model of 5 layers can see from the end
        share = sum("ab" in s[-symbols:] for s in members) / len(members)
        assert abs(share - share_with_ab_in_last(symbols)) < 0.04
    written_in, labels = sample_strings("contains_ab", 4000, 300, 300, seed=7)
    members = [s for s, label in zip(written_in, labels, strict=True) if label == 1]
    assert sum("ab" in s[-6:] for s in members) / len(members) < 0.1  # one ab, anywhere: rarely in the last 6


@pytest.mark.parametrize("language", ["contains_a_then_b", "contains_ab"])
def test_uniform_members_keep_the_adversarial_non_members(language):
    strings, labels = sample_strings(language, 600, 1, 40, seed=3, contains_positives="uniform")
    assert {recognizer(language)(s) for s, label in zip(strings, labels, strict=True) if label == 1} == {True}
    assert {recognizer(language)(s) for s, label in zip(strings, labels, strict=True) if label == 0} == {False}


def test_an_unknown_contains_positives_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=re.escape("`contains_positives` must be one of ['written_in', 'uniform']")):
        sample_strings("contains_ab", 10, contains_positives="random")
