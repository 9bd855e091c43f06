"""How closely two rankings of a model's key/value groups agree: one from `select_heads` (a benchmarks.long_context
score file, scores/SCORE-kK-sS.json) and another, such as kvpress's DuoAttention scores as run_presses.py caches them
(OUT/kvpress-duo-scores/*.npy, layers x key/value heads). Lower is local (streaming) first in both. It checks that two
scorings choose the same heads before their rows are read as the same head choice.

    python -m benchmarks.head_agreement --scores OUT/kvpress-duo-scores/KEY.npy \\
        docs/results/long_context/smollm2-135m-instruct/scores/reach-k256-s128.json --output-dir DIR

For every pair: the Pearson correlation of the scores, the largest absolute difference, and for each share of groups
made local (`--fractions`, rounded as `select_heads` rounds them), how many of the lowest-scored groups both choose.
"""

import json
from pathlib import Path

import numpy

from benchmarks.common import command_line_parser
from benchmarks.records import write_whole

FRACTIONS = (0.25, 0.5, 0.75)


def read_scores(path: Path) -> numpy.ndarray:
    """A (layers, key/value heads) array from a .npy file or a score file's "scores"."""
    if path.suffix == ".npy":
        return numpy.load(path).astype(numpy.float64)
    return numpy.asarray(json.loads(path.read_text())["scores"], dtype=numpy.float64)


def lowest(scores: numpy.ndarray, count: int) -> set[int]:
    """The flat indices (layer x heads + head) of the `count` lowest scores, ties to the lower index."""
    return set(numpy.argsort(scores.ravel(), kind="stable")[:count].tolist())


def agreement(first: numpy.ndarray, second: numpy.ndarray, fractions: tuple[float, ...]) -> dict:
    if first.shape != second.shape:
        raise SystemExit(f"the scores must have the same (layers, heads) shape, got {first.shape} and {second.shape}")
    groups = first.size
    shared = {}
    for fraction in fractions:
        count = round(fraction * groups)  # as select_heads and kvpress's DuoAttentionPress round it
        shared[str(fraction)] = {"local": count, "shared": len(lowest(first, count) & lowest(second, count))}
    return {"groups": groups, "correlation": round(float(numpy.corrcoef(first.ravel(), second.ravel())[0, 1]), 4),
            "max_abs_difference": round(float(numpy.abs(first - second).max()), 4), "lowest": shared}  # fmt: skip


def markdown(pairs: list[dict], fractions: tuple[float, ...]) -> str:
    lines = ["# Agreement of head scorings", "",
             "Lowest n: of the n lowest-scored key/value groups (those made local at that share), how many both "
             "choose.", "",
             "| first | second | correlation | max abs difference | "
             + " | ".join(f"lowest at {fraction}" for fraction in fractions) + " |",
             "|---|---|---|---|" + "---|" * len(fractions)]  # fmt: skip
    for pair in pairs:
        cells = [f"{s['shared']} of {s['local']}" for s in pair["lowest"].values()]
        lines.append(f"| {pair['first']} | {pair['second']} | {pair['correlation']:.3f} | "
                     f"{pair['max_abs_difference']:.4f} | " + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = command_line_parser("benchmarks.head_agreement", __doc__)
    parser.add_argument("--scores", type=Path, nargs="+", required=True, help="score files (.json) or kvpress's "
                        ".npy; the first is set against each of the others")  # fmt: skip
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS), help="shares made local")
    parser.add_argument("--output-dir", type=Path, required=True, help="where agreement.json and agreement.md go")
    args = parser.parse_args(argv)
    problems = [f"--scores must be .json score files or .npy arrays that exist, got {path}" for path in args.scores
                if not path.is_file() or path.suffix not in (".json", ".npy")]  # fmt: skip
    if len(args.scores) < 2:
        problems.append(f"--scores needs at least two files, got {len(args.scores)}")
    if any(not 0 < fraction <= 1 for fraction in args.fractions):
        problems.append(f"--fractions must all be in (0, 1], got {args.fractions}")
    if problems:
        parser.error("; ".join(problems))
    first, *others = args.scores
    pairs = [{"first": str(first), "second": str(other)} | agreement(read_scores(first), read_scores(other),
             tuple(args.fractions)) for other in others]  # fmt: skip
    write_whole(args.output_dir / "agreement.json", json.dumps(pairs, indent=1) + "\n")
    write_whole(args.output_dir / "agreement.md", text := markdown(pairs, tuple(args.fractions)))
    print(text, end="")


if __name__ == "__main__":
    main()
