"""Whether a change made hybridized models slower: `benchmarks.long_context`'s timing of the same shapes under this
checkout and under an earlier git revision of hf_attn, in alternating fresh processes, with the unmodified model timed
in each round beside them.

Days apart, the same command on this project's 2-core CPU has timed the unmodified model's 4,096-token prefill at
10.4 s and at 6.9 s, so a ratio recorded before a change says little about the change: this measures both revisions
in one run. Each process is `benchmarks.long_context_timing.measure_speed` of its own revision (the revision's
files from `git archive`, the model saved once by this checkout), under glibc's default allocator; the order of the
processes is reversed every round. Prints and writes, per shape, the median over rounds of this checkout's prefill
seconds over the revision's (< 1: faster now) and of each against the unmodified model; decoding too where
`--timing_context` leaves steps to time at length.

    python -m benchmarks.revision_speed 8be048c^ --local_windows 64 256 --sink_tokens 4 --fractions 0.5
"""

import argparse
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.common import ALLOCATOR_VARIABLES, DEFAULT_ALLOCATOR, machine_load
from benchmarks.long_context_configs import Config, layout_for
from benchmarks.long_context_timing import DTYPES
from benchmarks.serving import code_version
from hf_attn.pretrained import load_causal_lm

ROOT = Path(__file__).resolve().parent.parent
MEASURE = ("import json, sys; from benchmarks.long_context_timing import measure_speed; "
           "print(json.dumps(measure_speed(json.loads(sys.argv[1]))))")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("revision", help="the git revision to compare with (a commit, tag or branch of this repository)")
    add("--model", default="smollm2-135m-instruct", help="Hub id, folder, .gguf file or hf_attn.pretrained name")
    add("--dtype", choices=["float32", "bfloat16"], default="float32", help="the timed models'")
    add("--local_windows", type=int, nargs="+", default=[64, 256], help="k of the timed shapes")
    add("--sink_tokens", type=int, nargs="+", default=[4], help="S of the timed shapes")
    add("--fractions", type=float, nargs="+", default=[0.5], help="shares of key/value groups local (random, seed 0)")
    add("--prefill_context", type=int, default=4096, help="tokens of the timed prefill")
    add("--timing_context", type=int, default=48, help="context at the end of the timed decode (the default times "
        "prefill alone: decoding 32 steps after a 16-token prompt)")  # fmt: skip
    add("--decode_steps", type=int, default=32, help="timed greedy steps (the first two are warm-up)")
    add("--rounds", type=int, default=5, help="rounds of one process per revision and shape, plus the unmodified")
    add("--threads", type=int, default=2, help="torch threads of every process")
    add("--output", default="outputs/revision_speed/results.json", help="where the records go (JSON; results.md "
        "beside it)")  # fmt: skip
    args = parser.parse_args(argv)
    problems = [f"--{name} must be >= {low}, got {getattr(args, name)}"
                for name, low in [("rounds", 1), ("threads", 1), ("prefill_context", 1), ("decode_steps", 3)]
                if getattr(args, name) < low]  # fmt: skip
    if args.timing_context <= args.decode_steps:
        problems.append(f"--timing_context must exceed --decode_steps ({args.decode_steps}), got {args.timing_context}")
    if any(not 0 < fraction <= 1 for fraction in args.fractions):
        problems.append(f"--fractions must all be in (0, 1], got {args.fractions}")
    if problems:
        parser.error("; ".join(problems))
    return args


def export_revision(revision: str, folder: Path) -> str:
    """The revision's files into `folder` (`git archive`); its full commit hash. A bad revision stops here."""
    found = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"revision must name a commit of {ROOT}, got {revision!r}: {found.stderr.strip()}")
    commit = found.stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return commit


def measure(tree: Path, spec: dict) -> dict:
    """`measure_speed(spec)` in a fresh interpreter running `tree`'s code."""
    env = {name: value for name, value in os.environ.items() if name not in ALLOCATOR_VARIABLES}
    env |= DEFAULT_ALLOCATOR | {"PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(spec)], cwd=tree, env=env, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the timing process in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(rounds: list[dict], key: str) -> dict:
    """Medians and ranges over rounds of current/revision and of each against the unmodified model."""

    def summary(values: list[float]) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "current_over_revision": summary([r["current"][key] / r["revision"][key] for r in rounds]),
        "current_over_unmodified": summary([r["current"][key] / r["unmodified"][key] for r in rounds]),
        "revision_over_unmodified": summary([r["revision"][key] / r["unmodified"][key] for r in rounds]),
    }


def time_shape(name: str, spec: dict, tree: Path, args) -> dict:
    """`args.rounds` rounds of the unmodified model, this checkout and the revision, the order reversed each round."""
    runs = {"unmodified": (ROOT, spec | {"layout": None}), "current": (ROOT, spec), "revision": (tree, spec)}
    rounds = []
    for index in range(args.rounds):
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        rounds.append({run: measure(*runs[run]) for run in order})
        seconds = ", ".join(f"{run} {rounds[-1][run]['prefill_seconds']:.2f} s" for run in runs)
        print(f"{name} round {index + 1}: prefill {seconds}", flush=True)
    shape = {"rounds": rounds, "prefill_seconds": ratios(rounds, "prefill_seconds")}
    if args.timing_context - args.decode_steps > 16:
        shape["decode_ms"] = ratios(rounds, "decode_ms")
    return shape


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start, before = time.perf_counter(), machine_load()
    result = {"command": " ".join(["python -m benchmarks.revision_speed", *(argv or sys.argv[1:])]),
              "code": code_version(), "machine": {"before": before}, "shapes": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        tree, model_folder = Path(scratch) / "revision", Path(scratch) / "model"
        result["revision"] = export_revision(args.revision, tree)
        model = load_causal_lm(args.model, dtype=DTYPES[args.dtype])
        model.save_pretrained(model_folder)
        base = {"folder": str(model_folder), "dtype": args.dtype, "threads": args.threads,
                "prefill_context": args.prefill_context, "timing_context": args.timing_context,
                "decode_steps": args.decode_steps}  # fmt: skip
        for window, sinks, fraction in itertools.product(args.local_windows, args.sink_tokens, args.fractions):
            config = Config(window, sinks, fraction, "random", 0)
            spec = base | {"layout": layout_for(config, None, model.config), "local_window": window,
                           "sink_tokens": sinks}  # fmt: skip
            result["shapes"][config.shape] = time_shape(config.shape, spec, tree, args)
    result["machine"]["after"], result["seconds"] = machine_load(), time.perf_counter() - start
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.output).with_name("results.md").write_text(text := report(result))
    print(text)


def report(result: dict) -> str:
    lines = [
        "# This checkout against an earlier revision",
        "",
        f"Now: {result['code']['commit']}{' with uncommitted changes' if result['code']['uncommitted'] else ''}; "
        f"then: {result['revision'][:12]}. Medians over rounds (min-max); < 1: less time.",
        "",
        "| shape | measure | now / then | now / unmodified | then / unmodified |",
        "|---|---|---|---|---|",
    ]
    for shape, figures in result["shapes"].items():
        for key in ("prefill_seconds", "decode_ms"):
            if key in figures:
                cells = [f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})" for f in figures[key].values()]
                lines.append(f"| {shape} | {key} | " + " | ".join(cells) + " |")
    lines += ["", f"{result['seconds'] / 60:.1f} min; `uptime` before: `{result['machine']['before']['uptime']}`, "
              f"after: `{result['machine']['after']['uptime']}`"]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
