"""Resumable measurements for `benchmarks.long_context`: each is stored as JSON the moment it ends, and a rerun with
the same settings reads it back instead of measuring it again."""

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.records import write_whole

# The settings each kind of measurement depends on: a stored one measured with others is measured again.
SCORE_SETTINGS = ("model", "dtype", "device", "data_dir", "calibration_blocks", "calibration_block_size",
                  "score_batch_size")  # fmt: skip
QUALITY_SETTINGS = (*SCORE_SETTINGS, "prompt_format", "passkey_lengths", "passkey_depths", "keys_per_depth",
                    "key_seed", "new_tokens", "passkey_batch_size", "ppl_blocks", "ppl_block_size")  # fmt: skip
TIMING_SETTINGS = ("model", "timing_dtype", "prefill_context", "timing_context", "decode_steps", "timing_repeats")


def stored(path: Path, settings: dict) -> dict | None:
    """The record at `path` if it parses and was measured with `settings`; None if missing, partial, corrupt or
    stale."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("settings") == settings else None


def measured(path: Path, settings: dict, measure: Callable[[], dict], stored_only: bool = False) -> dict:
    """The record stored at `path` (`stored`), else `measure()`'s with its seconds and the load average, stored first
    (atomically: an interrupted write leaves no file); `stored_only`: a missing record is an error."""
    if (record := stored(path, settings)) is not None:
        return record
    if stored_only:
        raise SystemExit(f"--stored_only: {path} is missing or was measured with other settings than {settings}")
    start = time.perf_counter()
    record = measure() | {"settings": settings, "seconds": time.perf_counter() - start, "load_average": os.getloadavg()}
    write_whole(path, json.dumps(record, indent=1) + "\n")
    return record


def settings_of(args, names: tuple[str, ...]) -> dict:
    """The arguments `names` of the command line: what a record of one kind was measured with."""
    return {name: getattr(args, name) for name in names}
