"""RULER's synthetic long-context tasks, generated offline and fitted to a token length for a given tokenizer.

RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?", NVIDIA/RULER)
tests how far into its context a model still retrieves, tracks and aggregates. Eleven of its thirteen tasks are
synthetic and built here: eight needle-in-a-haystack variants (`niah_*`), variable tracking (`vt`), common words
extraction (`cwe`) and frequent words extraction (`fwe`). Its two QA tasks are not: they need SQuAD and HotpotQA.

`generate` returns records shaped like RULER's jsonl lines: `index`, `input` (the prompt without the answer prefix),
`outputs` (the reference strings), `length` (tokens of `input + answer_prefix`), `answer_prefix` and `task`; needle
tasks add `depths`, the percent of the haystack before each needle, in prompt order. The instructions, needle
sentences and answer prefixes are RULER's character for character (its typo "assgined" included), so that scores
compare with published ones. No chat template is applied: RULER's "base" model template is the plain text; for a
chat model, put `input` in the user turn and start the reply with `answer_prefix`, as RULER's chat templates do.
`score` is RULER's `string_match_all`. Each task's `max_new_tokens` is RULER's `tokens_to_generate`.

Length fitting: as in RULER, a prompt is the template around a haystack of units (essay words, noise paragraphs,
distractor needles, list words, a count of coded words) and the number of units is searched with the tokenizer. Here
every record is fitted on its own, by doubling then bisecting, so `tokenizer(input + answer_prefix)` is at most
`length` tokens while one unit more would not be. The gap is thus under one unit; with GPT-2's tokenizer, over 15
records per task at 1K, 4K and 8K tokens, at most: 2 tokens for the essay tasks, 11 for fwe, 12 for cwe (a word is
three list entries), 17 for niah_multikey_2 (a number distractor), 24 for a noise paragraph (niah_single_1, vt) and 66
for niah_multikey_3 (a uuid distractor).

Every record draws from its own generator, seeded by (task, length, seed, index): the same arguments give the same
records, and a record does not change with `num_samples`.

Differences from RULER, checked against its scripts/synthetic.yaml, scripts/data/prepare.py, scripts/data/tokenizer.py,
scripts/data/synthetic/{constants,niah,variable_tracking,common_words_extraction,freq_words_extraction}.py and
scripts/eval/synthetic/constants.py (NVIDIA/RULER as of its binary-search revision, read in its forks):
- The essay haystack is WikiText-2's test split (`wiki.test.raw` in `haystack_dir`, whitespace collapsed) instead of
  Paul Graham's essays, which RULER downloads. Like RULER, the text repeats when a length needs more words.
- Needles go between sentences split after ".", "!" or "?" and a space, not by NLTK's punkt.
- `length` bounds the prompt alone: RULER's `max_seq_length` also holds `tokens_to_generate`, and its record `length`
  adds them. For RULER's bucket L, pass `length=L - TASKS[task].max_new_tokens`.
- Tokens are counted as `tokenizer(text)` encodes them, special tokens included (RULER counts `tokenize(text)`), so
  a BOS the caller's encoding adds is within `length`.
- RULER fits one unit count per task and length, then drops 5 to 500 units when a sample overflows; fwe there grows
  the word count in steps of length/32 and reserves no room for the answer. Here each record is fitted to one unit.
- RULER draws from one global generator and shuffles needles, word lists and coded texts with a fresh
  `Random(seed)`, the same permutation for every sample; here each record's generator does all the drawing. Random
  words join an adjective and a noun drawn apart: RULER's distribution (uniform over the pairs) without building its
  six-million-long list of them.
- Keys are distinct, niah_multikey_2/3's distractors never reuse a real key, and vt's variable names and values are
  distinct; RULER does not check (a collision is rare, but makes the answer ambiguous).
- vt's one-shot example is drawn with fresh three-letter names and value, where RULER renames a fixed one by string
  replacement (`randomize_icl`); the shape is the same: an example fitted to 500 tokens, its answer, a blank line.
- cwe draws its words from wonderwords' 8,166 nouns, adjectives and verbs only: past them (about 110K GPT-2 tokens)
  it refuses, where RULER switches to a larger English word list (json/english_words.json).
- fwe's vocabulary is RULER's `max_seq_length // 50` words (with `max_seq_length = length + max_new_tokens`, as for
  cwe's switch to smaller counts under 4096), but at least 5, so that tiny lengths keep a unique answer.
"""

import functools
import itertools
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

# RULER's texts, verbatim: templates and answer prefixes from scripts/data/synthetic/constants.py, the needle and the
# noise from niah.py (variable_tracking.py has the same noise).
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assgined the "
    "value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

DEPTHS = [round(100 * step / 39) for step in range(40)]  # niah.py: np.linspace(0, 100, 40) rounded, in percent
ESSAY_FILE = "wiki.test.raw"
VT_EXAMPLE_LENGTH = 500  # variable_tracking.py fits its one-shot example (without the answer) to 500 tokens
CWE_SHORT = 4096  # common_words_extraction.py: under this max_seq_length, the smaller counts of `_cwe_prompt`


@dataclass(frozen=True)
class NeedleTask:
    """niah.py: `num_keys` keys with `num_values` values each, hidden as needles in a haystack; `num_queries` keys
    are asked for, and the answer is all their values."""

    haystack: str  # "noise" (NOISE repeated), "essay" (WikiText-2 words) or "needle" (distractor needles)
    key_kind: str  # "words" (adjective-noun), "numbers" (7 digits) or "uuids"
    value_kind: str
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    max_new_tokens: int = 128


@dataclass(frozen=True)
class VariableTrackingTask:
    """variable_tracking.py: chains of `VAR X = VAR Y` assignments hidden in noise after a one-shot example; the
    answer is every variable of the first chain, all of which hold its value."""

    num_chains: int = 1
    num_hops: int = 4
    max_new_tokens: int = 30


@dataclass(frozen=True)
class CommonWordsTask:
    """common_words_extraction.py: a numbered list where `num_cw` words appear `freq_cw` times and the others
    `freq_ucw` times (6 and 1 when RULER's max_seq_length, `length + max_new_tokens`, is under 4096), after a one-shot
    example; the answer is the common words."""

    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    max_new_tokens: int = 120


@dataclass(frozen=True)
class FrequentWordsTask:
    """freq_words_extraction.py: random coded words with Zipf(`alpha`) counts, the most frequent written '...'; the
    answer is the next three."""

    alpha: float = 2.0
    word_length: int = 6
    max_new_tokens: int = 50


Task = NeedleTask | VariableTrackingTask | CommonWordsTask | FrequentWordsTask

TASKS: dict[str, Task] = {  # RULER's order and settings (scripts/synthetic.yaml)
    "niah_single_1": NeedleTask("noise", "words", "numbers"),
    "niah_single_2": NeedleTask("essay", "words", "numbers"),
    "niah_single_3": NeedleTask("essay", "words", "uuids"),
    "niah_multikey_1": NeedleTask("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NeedleTask("needle", "words", "numbers"),
    "niah_multikey_3": NeedleTask("needle", "uuids", "uuids"),
    "niah_multivalue": NeedleTask("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NeedleTask("essay", "words", "numbers", num_queries=4),
    "vt": VariableTrackingTask(num_chains=1, num_hops=4),
    "cwe": CommonWordsTask(freq_cw=30, freq_ucw=3, num_cw=10),
    "fwe": FrequentWordsTask(alpha=2.0),
}


@dataclass(frozen=True)
class _Prompt:
    input: str
    answer_prefix: str
    outputs: list[str]
    depths: list[int] | None = None


def _task(task: str) -> Task:
    if task not in TASKS:
        left_out = " (RULER's QA tasks are not generated here: they need SQuAD and HotpotQA)" if "qa" in task else ""
        raise ValueError(f"`task` must be one of {list(TASKS)}, got {task!r}{left_out}")
    return TASKS[task]


@functools.cache
def _wonderwords(category: str) -> tuple[str, ...]:
    """wonderwords' list for `category` ("noun", "adjective", "verb"), sorted and unique: RULER's word source."""
    try:
        from wonderwords import RandomWord
    except ImportError as error:
        raise ImportError("RULER's random words come from `wonderwords`: pip install 'hf_attn[ruler]'") from error
    return tuple(sorted(set(RandomWord().filter(include_categories=[category]))))


@functools.cache
def _cwe_pool() -> tuple[str, ...]:
    return tuple(sorted(set(_wonderwords("noun") + _wonderwords("adjective") + _wonderwords("verb"))))


@functools.lru_cache(maxsize=2)
def _essay_words(folder: Path) -> tuple[str, ...]:
    path = folder / ESSAY_FILE
    if not path.is_file():
        raise ValueError(f"`haystack_dir` must hold {ESSAY_FILE} (WikiText-2 raw), but {path} is not a file")
    return tuple(path.read_text(encoding="utf-8").split())


def _zeta(alpha: float, terms: int = 1000) -> float:
    """Riemann's zeta(alpha), alpha > 1 (RULER takes scipy's): a partial sum and its Euler-Maclaurin tail."""
    tail = terms ** (1 - alpha) / (alpha - 1) + terms**-alpha / 2 + alpha * terms ** (-alpha - 1) / 12
    return sum(k**-alpha for k in range(1, terms)) + tail


def _distinct(draw: Callable[[], str], count: int, taken: Collection[str] = ()) -> list[str]:
    """`count` draws, none equal to another or to one in `taken`."""
    drawn, seen = [], set(taken)
    while len(drawn) < count:
        if (item := draw()) not in seen:
            drawn.append(item)
            seen.add(item)
    return drawn


def _draw(kind: str, rng: random.Random) -> str:
    """niah.py's generate_random: one key or value of `kind`."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(_wonderwords('adjective'))}-{rng.choice(_wonderwords('noun'))}"


def _singular(text: str) -> str:
    """niah.py's rewording when one value is asked for ("Some ... are" becomes "A ... is")."""
    for plural, singular in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(plural, singular)
    return text


def _needle_prompt(task: NeedleTask, rng: random.Random, size: int, essay: Sequence[str]) -> _Prompt:
    """niah.py's generate_input_output, with `size` haystack units: essay words, noise paragraphs or distractors."""
    kind = task.value_kind
    keys = _distinct(lambda: _draw(task.key_kind, rng), max(task.num_keys, task.num_queries))
    values = {key: _distinct(lambda: _draw(kind, rng), task.num_values) for key in keys}
    needles = [NEEDLE.format(type_needle_v=kind, key=key, value=value) for key in keys for value in values[key]]
    rng.shuffle(needles)
    queries = rng.sample(keys, task.num_queries)
    if task.haystack == "essay":  # needles between sentences, at depths drawn from DEPTHS
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        sentences = re.split(r"(?<=[.!?]) ", " ".join(itertools.islice(itertools.cycle(essay), size)))
        cuts = [0] + [int(len(sentences) * (depth / 100)) for depth in depths] + [len(sentences)]
        parts = [" ".join(sentences[: cuts[1]])]
        for needle, (start, stop) in zip(needles, itertools.pairwise(cuts[1:]), strict=True):
            parts += [needle, " ".join(sentences[start:stop])]
        context = " ".join(parts)
    else:  # needles between lines, at distinct line indices
        if task.haystack == "noise":
            lines = [NOISE] * size
        else:  # distractor needles, drawn before the indices so that a larger size only adds lines
            lines = [NEEDLE.format(type_needle_v=kind, key=_distinct(lambda: _draw(task.key_kind, rng), 1, keys)[0],
                                   value=_draw(kind, rng)) for _ in range(size)]  # fmt: skip
        indices = sorted(rng.sample(range(size), len(needles)), reverse=True)
        for index, needle in zip(indices, needles, strict=True):
            lines.insert(index, needle)
        context = "\n".join(lines)
        depths = [round(100 * index / size) for index in reversed(indices)]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, answer_prefix, noun = NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, kind
    if task.num_queries * task.num_values == 1:
        template, answer_prefix, noun = _singular(template), _singular(answer_prefix), kind[:-1]
    return _Prompt(template.format(type_needle_v=noun, context=context, query=query),
                   answer_prefix.format(type_needle_v=noun, query=query),
                   [value for key in queries for value in values[key]], depths)  # fmt: skip


def _vt_prompt(task: VariableTrackingTask, rng: random.Random, size: int, name_length: int = 5) -> _Prompt:
    """variable_tracking.py's generate_input_output on its noise haystack: `size` noise paragraphs with each chain's
    assignments inserted in order at distinct positions."""
    hops = task.num_hops
    names = _distinct(lambda: "".join(rng.choices(string.ascii_uppercase, k=name_length)), task.num_chains * (hops + 1))
    chains = [names[start : start + hops + 1] for start in range(0, len(names), hops + 1)]
    values = _distinct(lambda: str(rng.randint(10000, 99998)), task.num_chains)  # numpy's randint(10000, 99999)
    lines = [NOISE] * size
    for chain, value in zip(chains, values, strict=True):
        assignments = [f"VAR {chain[0]} = {value}"] + [f"VAR {chain[j + 1]} = VAR {chain[j]} " for j in range(hops)]
        for offset, position in enumerate(sorted(rng.sample(range(len(lines)), len(assignments)))):
            lines.insert(position + offset, assignments[offset])
    context = "\n".join(lines).replace(". \n", ".\n")
    return _Prompt(VT_TEMPLATE.format(context=context, query=values[0]),
                   VT_ANSWER_PREFIX.format(num_v=hops + 1, query=values[0]), chains[0])  # fmt: skip


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{number}. {word}" for number, word in enumerate(words, 1))


def _word_list(rng: random.Random, words: list[str], num_common: int, common: int,
               uncommon: int) -> tuple[str, list[str]]:  # fmt: skip
    """common_words_extraction.py's get_example: the first `num_common` of `words` `common` times each, the others
    `uncommon` times, shuffled and numbered; and the common words."""
    listed = words[:num_common] * common + words[num_common:] * uncommon
    rng.shuffle(listed)
    return _numbered(listed), words[:num_common]


def _cwe_prompt(task: CommonWordsTask, rng: random.Random, size: int, short: bool) -> _Prompt:
    """common_words_extraction.py's generate_input_output: a one-shot example (20 or 40 words) then the task's list
    of `size` words; the counts are RULER's, smaller when `short` (its max_seq_length under CWE_SHORT)."""
    example_words, example_common, example_uncommon, common, uncommon = (
        (20, 3, 1, 6, 1) if short else (40, 10, 3, task.freq_cw, task.freq_ucw)
    )
    pool = _cwe_pool()
    example, example_answer = _word_list(rng, rng.sample(pool, example_words), task.num_cw, example_common,
                                         example_uncommon)  # fmt: skip
    # A prefix of one permutation of the pool, so that a larger size only adds words.
    context, answer = _word_list(rng, rng.sample(pool, len(pool))[:size], task.num_cw, common, uncommon)
    shot = CWE_TEMPLATE.format(context=example) + CWE_ANSWER_PREFIX + " " + _numbered(example_answer)
    return _Prompt(shot + "\n" + CWE_TEMPLATE.format(context=context), CWE_ANSWER_PREFIX, answer)


def _fwe_min_words(alpha: float) -> int:
    """The fewest words whose Zipf counts keep the fourth-ranked word (the third coded one) strictly ahead of the
    fifth at that size and every larger one: the answer stays unique."""
    return math.ceil(_zeta(alpha) / (4**-alpha - 5**-alpha))


def _fwe_prompt(task: FrequentWordsTask, rng: random.Random, size: int, vocabulary: int) -> _Prompt:
    """freq_words_extraction.py's generate_input_output: the word of rank k appears int(size * k^-alpha / zeta)
    times, shuffled."""
    vocab = _distinct(lambda: "".join(rng.choices(string.ascii_lowercase, k=task.word_length)), vocabulary)
    vocab[0] = "..."  # RULER: the most frequent word is noise, to be ignored
    zeta = _zeta(task.alpha)
    coded = [word for rank, word in enumerate(vocab, 1) for _ in range(int(size * rank**-task.alpha / zeta))]
    rng.shuffle(coded)
    return _Prompt(FWE_TEMPLATE.format(context=" ".join(coded)), FWE_ANSWER_PREFIX, vocab[1:4])


def _fit(build: Callable[[int], _Prompt], count: Callable[[_Prompt], int], length: int, low: int,
         high: int | None, task: str) -> tuple[_Prompt, int]:  # fmt: skip
    """The prompt of the most haystack units (from `low`, to `high` if given) within `length` tokens, and its
    tokens: doubling the units until the prompt is too long, then bisecting. A prompt is kept only if it fits, so
    the result fits even where more units happen to give fewer tokens."""
    best = build(low)
    if (tokens := count(best)) > length:
        raise ValueError(f"`length` must be at least {tokens} tokens for {task!r} with this tokenizer (its template "
                         f"around the smallest haystack), got {length}")  # fmt: skip
    step, top = 1, None
    while top is None:
        probe = low + step if high is None else min(low + step, high)
        if probe == low:
            raise ValueError(f"{task!r} cannot fill {length} tokens: with all {high} of its haystack units (for cwe, "
                             f"wonderwords' distinct words) the prompt has {tokens}")  # fmt: skip
        prompt = build(probe)
        if (probe_tokens := count(prompt)) > length:
            top = probe
        else:
            low, best, tokens, step = probe, prompt, probe_tokens, 2 * step
    while top - low > 1:
        middle = (low + top) // 2
        prompt = build(middle)
        if (middle_tokens := count(prompt)) > length:
            top = middle
        else:
            low, best, tokens = middle, prompt, middle_tokens
    return best, tokens


def _builder(config: Task, name: str, length: int, count: Callable[[_Prompt], int],
             essay: Sequence[str]) -> tuple[Callable[[int], _Prompt], int, int | None]:  # fmt: skip
    """The record's prompt as a function of its haystack size, and the smallest and largest sizes. Each size starts
    the generator seeded by `name` afresh, so sizes differ only in the haystack."""
    if isinstance(config, NeedleTask):
        smallest = 1 if config.haystack == "essay" else max(config.num_keys, config.num_queries) * config.num_values
        return (lambda size: _needle_prompt(config, random.Random(name), size, essay)), smallest, None
    if isinstance(config, VariableTrackingTask):
        example_task = VariableTrackingTask(config.num_chains, min(10, config.num_hops))  # as RULER's example
        example, _ = _fit(lambda size: _vt_prompt(example_task, random.Random(name + "/example"), size, 3), count,
                          VT_EXAMPLE_LENGTH, example_task.num_hops + 1, None, "vt")  # fmt: skip
        shot = example.input + example.answer_prefix + " " + " ".join(example.outputs) + "\n"

        def build(size: int) -> _Prompt:
            prompt = _vt_prompt(config, random.Random(name), size)
            return _Prompt(shot + "\n" + prompt.input, prompt.answer_prefix, prompt.outputs)

        return build, config.num_hops + 1, None
    budget = length + config.max_new_tokens  # RULER's max_seq_length, which sets cwe's counts and fwe's vocabulary
    if isinstance(config, CommonWordsTask):
        short = budget < CWE_SHORT
        return (lambda size: _cwe_prompt(config, random.Random(name), size, short)), config.num_cw, len(_cwe_pool())
    vocabulary = max(budget // 50, 5)
    return (lambda size: _fwe_prompt(config, random.Random(name), size, vocabulary)), _fwe_min_words(config.alpha), None


def generate(task: str, tokenizer: PreTrainedTokenizerBase, length: int, num_samples: int, seed: int = 42,
             haystack_dir: str | Path | None = None, essay_text: str | None = None) -> list[dict]:  # fmt: skip
    """`num_samples` records of RULER's `task` whose prompt, `input + answer_prefix`, is at most `length` tokens of
    `tokenizer` and within one haystack unit of it. Essay tasks read `wiki.test.raw` from `haystack_dir`, or take
    `essay_text` itself (calibration text, which must not be the evaluation's)."""
    config = _task(task)
    if num_samples < 1:
        raise ValueError(f"`num_samples` must be >= 1, got {num_samples}")
    essay: Sequence[str] = ()
    if isinstance(config, NeedleTask) and config.haystack == "essay":
        if essay_text is not None:
            if not (essay := tuple(essay_text.split())):
                raise ValueError(f"{task!r} hides its needles in essay text, but `essay_text` holds no words")
        elif haystack_dir is None:
            raise ValueError(f"{task!r} hides its needles in essay text: pass `haystack_dir`, a folder holding "
                             f"{ESSAY_FILE} (WikiText-2 raw, e.g. ../shared/data/wikitext-2-raw), or "
                             "`essay_text`")  # fmt: skip
        else:
            essay = _essay_words(Path(haystack_dir).resolve())

    def count(prompt: _Prompt) -> int:
        return len(tokenizer(prompt.input + prompt.answer_prefix, verbose=False).input_ids)

    records = []
    for index in range(num_samples):
        build, smallest, largest = _builder(config, f"{task}/{length}/{seed}/{index}", length, count, essay)
        prompt, tokens = _fit(build, count, length, smallest, largest, task)
        record = {"index": index, "input": prompt.input, "outputs": prompt.outputs, "length": tokens,
                  "answer_prefix": prompt.answer_prefix, "task": task}  # fmt: skip
        if prompt.depths is not None:
            record["depths"] = prompt.depths
        records.append(record)
    return records


def match_fraction(prediction: str, references: Sequence[str]) -> float:
    """One record's `string_match_all`: the share of `references` found in `prediction`, ignoring case."""
    if not references:
        raise ValueError("`references` must hold at least one reference string")
    found = prediction.lower()
    return sum(reference.lower() in found for reference in references) / len(references)


def score(task: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's score of `task` (scripts/eval/synthetic/constants.py: `string_match_all` for every synthetic task): the
    mean of `match_fraction` over records, times 100, rounded to 2 decimals as RULER reports it. RULER first strips
    predictions and turns control characters into newlines, which changes no match, so that is left out."""
    _task(task)
    if not predictions or len(predictions) != len(references):
        raise ValueError(f"`predictions` and `references` must be as long and not empty, got {len(predictions)} and "
                         f"{len(references)}")  # fmt: skip
    return round(100 * sum(map(match_fraction, predictions, references)) / len(predictions), 2)


__all__ = [
    "TASKS",
    "NeedleTask",
    "VariableTrackingTask",
    "CommonWordsTask",
    "FrequentWordsTask",
    "generate",
    "match_fraction",
    "score",
]
