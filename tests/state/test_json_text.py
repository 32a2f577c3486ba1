"""The state's JSON text is what it was before issue 42 made it cheaper: compact_json is
json.dumps with compact separators, character for character (ASCII escapes, key order, floats,
nested values), and a journal line is the entry's dataclasses.asdict, in its field order."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cnidra.api.refs import ObjectRef
from cnidra.state.journal import ATTACHED, Entry, Journal
from cnidra.state.store import compact_json

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), VALUES, max_size=6))
def test_compact_json_is_json_dumps_with_compact_separators(data: dict[str, Any]) -> None:
    assert compact_json(data) == json.dumps(data, separators=(",", ":"))


ENTRIES = st.builds(
    Entry,
    st.integers(min_value=0),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.text(),
    st.text(),
    st.text(),
    st.text(),
    st.text(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.text(), VALUES, max_size=3),
)


@given(ENTRIES)
def test_an_entrys_json_is_its_asdict_in_field_order(entry: Entry) -> None:
    data = entry.to_json()
    assert list(data.items()) == list(asdict(entry).items())
    assert compact_json(data) == json.dumps(asdict(entry), separators=(",", ":"))
    again = Entry.from_json(json.loads(compact_json(data)))  # NaN is not NaN: by its text
    assert compact_json(again.to_json()) == compact_json(data)


def test_the_journals_lines_read_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    pod = ObjectRef("ns", "pod", "uid-1")
    written = journal.record(ATTACHED, pod, "sandbox-1", "attached net1", 1.5, interfaces=["net1"])
    [line] = path.read_text().splitlines()
    assert line == json.dumps(asdict(written), separators=(",", ":"))
    assert list(Journal(path).entries) == [written]
