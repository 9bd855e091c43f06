"""RULER's synthetic tasks (hf_attn/ruler.py): each answer recovered from its prompt by brute force, RULER's texts and
settings, prompts within one haystack unit of the requested length, determinism, the scorer and the errors.

RULER's strings below are written out again from its sources (scripts/data/synthetic/constants.py, niah.py,
synthetic.yaml), not imported, so that a change to the module's copies shows here."""

import collections
import functools
import re
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from hf_attn import ruler

SHARED = Path(__file__).parents[2] / "shared" / "data"
HAYSTACK = SHARED / "wikitext-2-raw"
LENGTHS = (1024, 4096, 8192)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE_TASKS = [task for task in ruler.TASKS if task.startswith("niah_")]
# synthetic.yaml: type_haystack, type_needle_k, type_needle_v, num_needle_k, num_needle_v, num_needle_q
RULER_NEEDLES = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}
NEEDLE = re.compile(r"One of the special magic (\w+) for (.+?) is: ([\w-]+)\.")
VALUE = {"numbers": r"[1-9]\d{6}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")


@pytest.fixture(scope="module")
def records(tokenizer):
    """Two records of seed 42 per task and length, generated once for the whole module."""

    @functools.cache
    def generated(task: str, length: int) -> list[dict]:
        return ruler.generate(task, tokenizer, length, 2, haystack_dir=HAYSTACK)

    return generated


def tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, verbose=False).input_ids)


def between(text: str, start: str, end: str) -> str:
    """The text after the last `start` and before the `end` that follows it."""
    after = text[text.rindex(start) + len(start) :]
    return after[: after.index(end)]


def test_tasks_are_rulers_synthetic_ones_with_its_settings():
    assert list(ruler.TASKS) == [*RULER_NEEDLES, "vt", "cwe", "fwe"]  # RULER's order, less qa_1 and qa_2
    for task, expected in RULER_NEEDLES.items():
        config = ruler.TASKS[task]
        fields = (config.haystack, config.key_kind, config.value_kind)
        assert (*fields, config.num_keys, config.num_values, config.num_queries) == expected, task
    vt, cwe, fwe = ruler.TASKS["vt"], ruler.TASKS["cwe"], ruler.TASKS["fwe"]
    assert (vt.num_chains, vt.num_hops, cwe.freq_cw, cwe.freq_ucw, cwe.num_cw, fwe.alpha) == (1, 4, 30, 3, 10, 2.0)
    # constants.py's tokens_to_generate
    assert {ruler.TASKS[task].max_new_tokens for task in RULER_NEEDLES} == {128}
    assert (vt.max_new_tokens, cwe.max_new_tokens, fwe.max_new_tokens) == (30, 120, 50)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("task", NEEDLE_TASKS)
def test_needle_answer_is_every_value_of_the_queried_keys(records, task, length):
    haystack, _, value_kind, num_keys, num_values, num_queries = RULER_NEEDLES[task]
    one = num_values * num_queries == 1
    noun, verb = (value_kind[:-1], "is") if one else (value_kind, "are")
    for record in records(task, length):
        prompt = record["input"]
        intro = (f"{'A' if one else 'Some'} special magic {noun} {verb} hidden within the following text. Make sure to "
                 f"memorize it. I will quiz you about the {noun} afterwards.\n")  # fmt: skip
        assert prompt.startswith(intro)
        question = re.search(r"\nWhat (?:is|are all) the special magic (\w+) for (.+) mentioned in the provided "
                             r"text\?\Z", prompt)  # fmt: skip
        assert question and question[1] == noun
        queried = re.split(r", and |, ", question[2])
        assert len(queried) == num_queries
        prefix = f" The special magic {noun} for {question[2]} mentioned in the provided text {verb}"
        assert record["answer_prefix"] == prefix
        needles = NEEDLE.findall(prompt)
        assert {kind for kind, _, _ in needles} == {value_kind}  # the needle names the values' kind in the plural
        values = collections.defaultdict(list)
        for _, key, value in needles:
            values[key].append(value)
        assert sorted(record["outputs"]) == sorted(value for key in queried for value in values[key])
        assert len(record["outputs"]) == num_values * num_queries
        assert all(re.fullmatch(VALUE[value_kind], value) for value in record["outputs"])
        context = prompt[len(intro) : question.start()]
        if haystack == "essay":  # WikiText-2 from its start, needles at RULER's depths
            assert context.startswith(("= Robert Boulter = Robert Boulter is an English film", " One of the special"))
            assert len(needles) == len({key for _, key, _ in needles}) * num_values == len(record["depths"])
            assert len(values) == max(num_keys, num_queries)
            assert set(record["depths"]) <= set(np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))
            # A depth is a share of sentences; WikiText's are alike enough for the share of characters to be close.
            essay = [len(piece) for piece in re.split(rf" ?{NEEDLE.pattern} ?", context)[::4]]
            shares = [100 * sum(essay[: count + 1]) / sum(essay) for count in range(len(needles))]
            assert all(abs(share - depth) < 10 for share, depth in zip(shares, record["depths"], strict=True))
        else:  # lines: noise paragraphs or other keys' needles, and the queried needles at the recorded depths
            lines = context.split("\n")
            queried_lines = [index for index, line in enumerate(lines) if (found := NEEDLE.fullmatch(line))
                             and found[2] in queried]  # fmt: skip
            units = len(lines) - len(queried_lines)
            before = [index - position for position, index in enumerate(queried_lines)]
            assert record["depths"] == [round(100 * count / units) for count in before]
            others = {line for index, line in enumerate(lines) if index not in queried_lines}
            if haystack == "noise":
                assert others == {NOISE}
            else:  # distractors: needles of other keys (checked above: the queried keys have only their values)
                assert all(NEEDLE.fullmatch(line) for line in others) and len(others) > 1


def resolve(assignments: str) -> dict[str, str]:
    """Each variable's value, following `VAR X = VAR Y` back to a number."""
    sources = dict(re.findall(r"^VAR ([A-Z]+) = (?:VAR )?(\w+) ?$", assignments, re.MULTILINE))

    def value(name: str) -> str:
        return sources[name] if sources[name].isdigit() else value(sources[name])

    return {name: value(name) for name in sources}


@pytest.mark.parametrize("length", LENGTHS)
def test_vt_answer_is_every_variable_holding_the_queried_value(records, length):
    for record in records("vt", length):
        example, task = record["input"].rsplit("Memorize and track", 1)
        assert record["input"].startswith("Memorize and track the chain(s) of variable assignment hidden in the "
                                          "following text.\n\n") and example.endswith("\n\n")  # fmt: skip
        query = re.fullmatch(r"(?s).*\nQuestion: Find all variables that are assigned the value (\d{5}) in the text "
                             r"above\.", task)[1]  # fmt: skip
        prefix = " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
        assert record["answer_prefix"] == prefix + f"assgined the value {query}, they are: "  # RULER's typo
        holders = [name for name, value in resolve(task).items() if value == query]
        assert sorted(record["outputs"]) == sorted(holders) and len(holders) == 5
        assert all(re.fullmatch("[A-Z]{5}", name) for name in holders)
        # The one-shot example: three-letter names, and its answer after the prefix is right too.
        shown = re.search(r"the value (\d{5}), they are:  ([A-Z ]+)\n\n\Z", example)
        example_holders = [name for name, value in resolve(example).items() if value == shown[1]]
        assert sorted(shown[2].split()) == sorted(example_holders) and len(example_holders) == 5
        assert all(len(name) == 3 for name in example_holders)
        assert {line for line in task.split("\n")[2:-1] if not line.startswith("VAR ")} == {NOISE}


def numbered(text: str) -> list[str]:
    """The words of "1. w 2. w ...", checking the numbering."""
    pieces = re.split(r"(?:^| )(\d+)\. ", text)
    assert pieces[0] == "" and [int(number) for number in pieces[1::2]] == list(range(1, len(pieces) // 2 + 1))
    return pieces[2::2]


def most_common(words: list[str], count: int, ignore: str | None = None) -> tuple[list[str], list[int]]:
    """The `count` most frequent words, and the sorted counts, checking that the cut is unambiguous."""
    counts = collections.Counter(word for word in words if word != ignore)
    ranked = counts.most_common()
    assert ranked[count - 1][1] > ranked[count][1], "a tie at the cut"
    return [word for word, _ in ranked[:count]], sorted(counts.values(), reverse=True)


@pytest.mark.parametrize("length", LENGTHS)
def test_cwe_answer_is_the_ten_most_common_words(records, length):
    common, uncommon = (30, 3) if length + 120 >= 4096 else (6, 1)  # RULER's max_seq_length = prompt + 120
    instruction = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize "
                   "the ones that appear most often.\n")  # fmt: skip
    question = "\nQuestion: What are the 10 most common words in the above list?"
    for record in records("cwe", length):
        prompt = record["input"]
        assert prompt.startswith(instruction) and prompt.endswith(question) and prompt.count(instruction) == 2
        assert record["answer_prefix"] == " Answer: The top 10 words that appear most often in the list are:"
        top, counts = most_common(numbered(between(prompt, instruction, question)), 10)
        assert sorted(record["outputs"]) == sorted(top)
        assert set(counts[:10]) == {common} and set(counts[10:]) == {uncommon}
        example = between(prompt[: prompt.rindex(instruction)], instruction, question)
        shown = between(prompt, question + record["answer_prefix"] + " ", "\n")
        assert sorted(numbered(shown)) == sorted(most_common(numbered(example), 10)[0])


@pytest.mark.parametrize("length", LENGTHS)
def test_fwe_answer_is_the_three_most_frequent_coded_words(records, length):
    for record in records("fwe", length):
        intro = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                 "frequently appeared coded words. ")  # fmt: skip
        question = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                    "most frequently appeared words in the above coded text?")  # fmt: skip
        assert record["input"].startswith(intro) and record["input"].endswith(question)
        assert record["answer_prefix"] == (" Answer: According to the coded text above, the three most frequently "
                                           "appeared words are:")  # fmt: skip
        words = between(record["input"], intro, question).split(" ")
        top, counts = most_common(words, 3, ignore="...")
        assert sorted(record["outputs"]) == sorted(top)
        assert all(re.fullmatch("[a-z]{6}", word) for word in words if word != "...")
        dots = words.count("...")  # the rank-1 word: int(n / zeta(2)); rank 2: int(n / (4 zeta(2)))
        assert dots > counts[0] and abs(dots - 4 * counts[0]) < 4 and abs(dots - 9 * counts[1]) < 9


def unit_tokens(tokenizer, task: str, record: dict) -> int:
    """Tokens that one more haystack unit adds, at most, counted from the prompt."""
    config = ruler.TASKS[task]
    if task == "vt" or getattr(config, "haystack", None) == "noise":
        return tokens(tokenizer, "\n" + NOISE)
    if getattr(config, "haystack", None) == "needle":
        lines = [line for line in record["input"].split("\n") if NEEDLE.fullmatch(line)]
        return max(tokens(tokenizer, "\n" + line) for line in lines)
    if task == "cwe":  # one more word: 3 more list entries, or 1 under RULER's 4096
        entries = re.findall(r" \d+\. [^\d]+(?= \d|\n)", record["input"])
        return (3 if record["length"] + 120 >= 4096 else 1) * max(tokens(tokenizer, entry) for entry in entries)
    if task == "fwe":  # one more word of the count adds under a word of each of a few ranks
        coded = set(between(record["input"], "coded words. ", "\nQuestion").split(" "))
        return 3 * max(tokens(tokenizer, " " + word) for word in coded)
    return 8  # essay: one more WikiText word


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_prompt_is_at_most_the_length_and_within_one_unit_of_it(tokenizer, records, task, length):
    for record in records(task, length):
        assert record["length"] == tokens(tokenizer, record["input"] + record["answer_prefix"])
        assert 0 <= length - record["length"] < unit_tokens(tokenizer, task, record) + 2, record["length"]
        assert (record["task"], record["index"]) == (task, records(task, length).index(record))


@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_records_are_seeded_and_independent(tokenizer, task):
    generate = functools.partial(ruler.generate, task, tokenizer, 1024, haystack_dir=HAYSTACK)
    two = generate(2, seed=7)
    assert generate(2, seed=7) == two and generate(1, seed=7) == two[:1]  # a record does not depend on num_samples
    assert two[0]["input"] != two[1]["input"] and generate(1, seed=8)[0]["input"] != two[0]["input"]


def test_score_is_rulers_string_match_all():
    references = [["1111111", "2222222", "3333333", "4444444"], ["5555555"]]
    assert ruler.score("niah_multivalue", ["1111111, 2222222 and 3333333.", ""], references) == 37.5  # (3/4 + 0) / 2
    assert ruler.score("cwe", ["APPLE, Banana"], [["apple", "banana"]]) == 100.0  # case ignored
    assert ruler.score("vt", [""], [["ABCDE"]]) == 0.0
    assert ruler.score("fwe", ["a", "a", "b"], [["a"], ["b"], ["b"]]) == 66.67  # 2/3, rounded as RULER reports
    assert ruler.match_fraction("VAR ABCDEF", ["ABCDE", "XYZ"]) == 0.5  # a substring counts, as in RULER


def test_bad_inputs_are_refused_with_what_is_allowed(tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"`task` must be one of \['niah_single_1', .*'fwe'\], got 'niah'"):
        ruler.generate("niah", tokenizer, 1024, 1)
    with pytest.raises(ValueError, match="QA tasks are not generated here"):
        ruler.generate("qa_1", tokenizer, 1024, 1)
    for task, length in [("niah_single_1", 40), ("niah_multikey_3", 100), ("vt", 400), ("cwe", 300), ("fwe", 100)]:
        with pytest.raises(ValueError, match=rf"`length` must be at least \d+ tokens for '{task}'") as error:
            ruler.generate(task, tokenizer, length, 1)
        assert int(re.search(r"at least (\d+)", str(error.value))[1]) > length
    with pytest.raises(ValueError, match="'niah_single_2' hides its needles in essay text: pass `haystack_dir`"):
        ruler.generate("niah_single_2", tokenizer, 1024, 1)
    with pytest.raises(ValueError, match="`haystack_dir` must hold wiki.test.raw"):
        ruler.generate("niah_multivalue", tokenizer, 1024, 1, haystack_dir=tmp_path)
    with pytest.raises(ValueError, match="'niah_single_3' hides its needles in essay text, but `essay_text` holds no"):
        ruler.generate("niah_single_3", tokenizer, 1024, 1, essay_text=" \n")
    with pytest.raises(ValueError, match=r"'cwe' cannot fill 140000 tokens: with all 8166 of its haystack units"):
        ruler.generate("cwe", tokenizer, 140_000, 1)  # wonderwords' words make about 110K GPT-2 tokens
    with pytest.raises(ValueError, match="`num_samples` must be >= 1, got 0"):
        ruler.generate("fwe", tokenizer, 1024, 0)
    with pytest.raises(ValueError, match="must be as long"):
        ruler.score("vt", ["ABCDE"], [["ABCDE"], ["FGHIJ"]])
    with pytest.raises(ValueError, match="`task` must be one of"):
        ruler.score("qa_2", ["x"], [["x"]])
    with pytest.raises(ValueError, match="at least one reference"):
        ruler.match_fraction("x", [])
