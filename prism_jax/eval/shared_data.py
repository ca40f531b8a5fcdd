"""Loader for the labelled decision files in ../shared/data (format: its SOURCES.md).

The directory is PRISM_EVAL_DATA when set, else `shared/data` beside the repository root
(/work/main -> /work/shared/data), which is also where CI's copy of shared/ lies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from prism_jax.eval.items import Item, gold_index
from prism_jax.questions import DecisionRequestError, parse_question

REPO_ROOT = Path(__file__).resolve().parents[2]
# The meta field that names an item's sub-task, per file, for stratified sampling.
STRATUM_FIELDS = ("task", "subject", "scenario", "family", "question_name", "group")


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The shared data directory: the argument, else $PRISM_EVAL_DATA, else ../shared/data."""
    chosen = override or os.environ.get("PRISM_EVAL_DATA")
    return Path(chosen) if chosen else REPO_ROOT.parent / "shared" / "data"


def shared_files(directory: Path | None = None) -> list[Path]:
    """Every labelled file (*.jsonl) in the directory, by name."""
    directory = directory or data_dir()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"no shared data directory at {directory}: pass --data-dir or set PRISM_EVAL_DATA"
        )
    return sorted(directory.glob("*.jsonl"))


def resolve(name: str, directory: Path | None = None) -> Path:
    """A path, or a file name/stem inside the data directory."""
    path = Path(name)
    if path.is_file():
        return path
    directory = directory or data_dir()
    for candidate in (directory / name, directory / f"{name}.jsonl"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no data file {name!r} (looked in the working directory and {directory})"
    )


def _stratum(set_name: str, meta: dict) -> str:
    for field in STRATUM_FIELDS:
        if field in meta:
            return f"{set_name}/{meta[field]}"
    return set_name


def load_file(path: Path) -> tuple[list[Item], list[tuple[str, str]]]:
    """-> (items, skipped): skipped lists (id, reason) for lines without a usable gold (the
    REFERENCE file records another engine's answers, not labels) or with a bad question."""
    items: list[Item] = []
    skipped: list[tuple[str, str]] = []
    set_name = path.stem
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            raw = json.loads(line)
            item_id = str(raw.get("id", f"{set_name}:{number}"))
            if raw.get("gold") is None:
                skipped.append((item_id, "no gold label"))
                continue
            try:
                q = parse_question(item_id, raw["question"])
                gold = gold_index(q, raw["gold"])
            except (DecisionRequestError, ValueError, KeyError) as err:
                skipped.append((item_id, f"unusable question or gold: {err}"))
                continue
            items.append(
                Item(
                    item_id,
                    set_name,
                    _stratum(set_name, raw.get("meta") or {}),
                    raw["state"],
                    raw["question"],
                    gold,
                )
            )
    return items, skipped
