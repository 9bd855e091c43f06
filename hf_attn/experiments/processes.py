"""Which process writes: the main one of a `torchrun` / `accelerate launch` run, and one script per output folder.

Every process trains and evaluates; only the main process writes results, cards and reports, and says what it does.
A script holds OUTPUT_DIR/hf_attn.lock while it runs, so that a second one into the same folder refuses at start.
"""

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path

from accelerate import PartialState

LOCK_FILE = "hf_attn.lock"


def is_main_process() -> bool:
    """True in a single-process run and in the main process of a `torchrun` / `accelerate launch` run."""
    return PartialState().is_main_process


def wait_for_everyone() -> None:
    PartialState().wait_for_everyone()


def say(message: str) -> None:
    """Prints from the main process only, so a multi-process run reports each event once."""
    if is_main_process():
        print(message, flush=True)


def lock_output_dir(output_dir: Path) -> None:
    """Holds OUTPUT_DIR until this process exits: a second run into it refuses at start, naming the holder; a lock
    left by a process that no longer runs (killed) is taken over, saying so. Under `torchrun` only the main process
    locks (the launcher ends the others when it stops)."""
    if not is_main_process():
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    lock, me = output_dir / LOCK_FILE, {"pid": os.getpid(), "host": socket.gethostname()}
    while True:
        mine = lock.with_name(f"{LOCK_FILE}.{me['pid']}")
        mine.write_text(json.dumps({**me, "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv}))
        try:
            os.link(mine, lock)  # atomic: fails if the lock exists, never leaves a half-written lock
            atexit.register(release_lock, lock, me)
            return
        except FileExistsError:
            holder = lock_holder(lock)
        finally:
            mine.unlink()
        if holder is None:
            continue  # released meanwhile
        if held_by(holder, me):
            return  # this process holds it already (main called again)
        if holder.get("host") == me["host"] and not process_runs(holder["pid"]):
            say(f"{lock}: taking over the lock of process {holder['pid']}, which no longer runs")
            lock.unlink(missing_ok=True)
            continue
        raise ValueError(
            f"{output_dir} is in use by process {holder['pid']} on {holder['host']} since {holder.get('since')} "
            f"({' '.join(holder.get('command', []))}). Wait for it to finish; if it is gone, delete {lock}."
        )


def lock_holder(lock: Path) -> dict | None:
    """Who holds `lock` (pid, host, since, command); None once it is released."""
    try:
        return json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise ValueError(f"{lock} is not a lock this script wrote: delete it if no run uses its folder") from None


def process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def release_lock(lock: Path, me: dict) -> None:
    if (holder := lock_holder(lock)) is not None and held_by(holder, me):
        lock.unlink()


def held_by(holder: dict, me: dict) -> bool:
    return all(holder.get(key) == value for key, value in me.items())
