"""The files benchmark records live in: written whole (a stop while writing leaves the old file or none), read back
leniently where a missing or spoiled record only means "measure it again". Standard library alone:
benchmarks/kvpress/run_presses.py imports it in kvpress's environment."""

import hashlib
import json
import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` by renaming a finished temporary file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def read_json(path: Path) -> dict | None:
    """`path`'s JSON, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def jsonl(records: list[dict]) -> str:
    """RULER's files: one `json.dumps` per line (NeMo's write_manifest)."""
    return "".join(json.dumps(record) + "\n" for record in records)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
