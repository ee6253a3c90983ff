"""Text from Slurm is data from users (issue 11, item 2): the Slurm parsers and the
resilient tag, fuzzed. The property: a correct result or SlurmError, never another
exception; one bad record is skipped and every good record still comes through."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from medic_core.resilient import MAX_RESTARTS, parse_resilient
from medic_core.slurm import CliSlurm, SlurmError, parse_jobs, parse_nodes

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return doc


def _newer(version: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "plugin": {"type": "openapi/slurmctld", "data_parser": f"data_parser/{version}"},
        "slurm": {"release": "24.05.1"},
    }
    return {"meta": meta, **copy.deepcopy(body), "errors": [], "warnings": []}


NEWER_JOBS = [
    {
        "job_id": 7,
        "name": "a",
        "user_name": "u",
        "job_state": ["RUNNING"],
        "nodes": "n1",
        "restart_cnt": {"set": True, "number": 1},
        "comment": "medic:resilient=2",
    },
    {"job_id": 8, "name": "b", "user_name": "u", "job_state": ["PENDING"], "nodes": ""},
    {"job_id": 9, "name": "c", "user_name": "v", "job_state": ["RUNNING"], "nodes": "n[2-3]"},
]
NEWER_NODES = [
    {"name": "n1", "state": ["IDLE"], "reason_changed_at": {"set": True, "number": 5}},
    {"name": "n2", "state": ["MIXED", "DRAIN"], "reason": "medic: x", "partitions": ["gpu"]},
    {"name": "n3", "state": ["ALLOCATED"]},
]

# Every layout Medic reads: (document, key, parser, id field).
DOCUMENTS = [
    ("22.05 squeue", _fixture("22.05/squeue.json"), "jobs"),
    ("22.05 sinfo", _fixture("22.05/sinfo.json"), "nodes"),
    ("v0.0.39 squeue", _newer("v0.0.39", {"jobs": NEWER_JOBS}), "jobs"),
    ("v0.0.42 squeue", _newer("v0.0.42", {"jobs": NEWER_JOBS}), "jobs"),
    ("v0.0.44 nodes", _newer("v0.0.44", {"nodes": NEWER_NODES}), "nodes"),
    ("23.02 node", _fixture("23.02/slurmrestd_node.json"), "nodes"),
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(["²", "٣", "\udcff", "bad\ufffd\ufffd", "9" * 5000, "n[1-x]", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def _parse(doc: dict[str, Any], key: str, text: str | None = None) -> list[Any]:
    body = json.dumps(doc) if text is None else text
    return parse_jobs(body) if key == "jobs" else parse_nodes(body)


def _ids(records: list[Any]) -> list[str]:
    return [getattr(r, "job_id", None) or r.name for r in records]


def _good(doc: dict[str, Any], key: str) -> list[str]:
    return _ids(_parse(doc, key))


@pytest.mark.parametrize(("label", "doc", "key"), DOCUMENTS, ids=[d[0] for d in DOCUMENTS])
def test_the_unfuzzed_documents_parse(label: str, doc: dict[str, Any], key: str) -> None:
    assert _good(doc, key)


@FUZZ
@given(
    which=st.sampled_from(range(len(DOCUMENTS))),
    record=st.integers(min_value=0, max_value=10),
    field=st.text(max_size=12) | st.sampled_from(["name", "job_id", "comment", "state"]),
    value=json_values,
)
@example(which=2, record=1, field="job_id", value=7)  # another record's id: found by CI
def test_one_bad_field_never_stops_the_other_records(
    which: int, record: int, field: str, value: Any
) -> None:
    label, doc, key = DOCUMENTS[which]
    before = _good(doc, key)
    doc = copy.deepcopy(doc)
    records = doc[key]
    index = record % len(records)
    records[index][field] = value
    try:
        after = _ids(_parse(doc, key))
    except SlurmError:  # pragma: no cover - only the document level may refuse
        pytest.fail(f"{label}: one record's {field!r} refused the whole document")
    others = [i for n, i in enumerate(before) if n != index]
    # Every other record comes through, in order; the fuzzed one may be dropped, or read
    # with any id (another record's too: job_id 7 beside job 7).
    rest = iter(after)
    assert all(any(i == j for j in rest) for i in others), (label, after, others)
    assert len(after) >= len(others)


# These fields Medic reads as text: whatever a user puts there, the record comes through.
USER_TEXT = {"jobs": ("name", "comment", "user_name", "admin_comment"), "nodes": ("reason",)}


@FUZZ
@given(
    which=st.sampled_from(range(len(DOCUMENTS))),
    junk=st.binary(max_size=24),
    pick=st.integers(min_value=0, max_value=3),
)
def test_raw_bytes_in_user_text_keep_every_record(which: int, junk: bytes, pick: int) -> None:
    """Bytes (invalid UTF-8 included) inside a user's string in Slurm's output, decoded the
    way medic_core.proc decodes a command's output."""
    label, doc, key = DOCUMENTS[which]
    before = _good(doc, key)
    fields = USER_TEXT[key]
    field = fields[pick % len(fields)]
    doc = copy.deepcopy(doc)
    doc[key][0][field] = "@@HERE@@"
    raw = json.dumps(doc).encode().replace(b"@@HERE@@", junk.replace(b"\\", b"").replace(b'"', b""))
    text = raw.decode("utf-8", errors="replace")
    try:
        after = _ids(_parse(doc, key, text))
    except SlurmError:  # a control character makes the JSON invalid: one clear error
        return
    assert after == before, label


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_text_is_a_result_or_a_slurm_error(text: str) -> None:
    for parse in (parse_jobs, parse_nodes):
        with contextlib.suppress(SlurmError):
            parse(text)


@FUZZ
@given(doc=json_values)
def test_any_json_document_is_a_result_or_a_slurm_error(doc: Any) -> None:
    for key in ("jobs", "nodes"):
        wrapped = _newer("v0.0.42", {key: doc}) if isinstance(doc, list) else doc
        with contextlib.suppress(SlurmError):
            _parse({}, key, json.dumps(wrapped))


def test_deeply_nested_json_is_a_slurm_error() -> None:
    with pytest.raises(SlurmError, match="nested too deeply"):
        parse_jobs("[" * 100_000 + "]" * 100_000)


def test_a_job_name_with_invalid_utf8_through_the_real_command(tmp_path: Path) -> None:
    """`sbatch -J $'bad\\xff\\xfe'`: squeue prints the bytes as they are; the job comes
    through with U+FFFD in its name, and the resilient job next to it too."""
    doc = _newer("v0.0.42", {"jobs": NEWER_JOBS})
    doc["jobs"][1]["name"] = "@@NAME@@"
    out = json.dumps(doc).encode().replace(b"@@NAME@@", b"bad\xff\xfe")
    (tmp_path / "out.json").write_bytes(out)
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\nexec cat {tmp_path / 'out.json'}\n")
    squeue.chmod(0o755)
    jobs = CliSlurm(env=dict(os.environ), bin_dirs=[tmp_path]).jobs()
    assert [j.job_id for j in jobs] == ["7", "8", "9"]
    assert jobs[1].name == "bad\ufffd\ufffd"
    assert parse_resilient(jobs[0].comment) == 2


def test_a_lone_surrogate_escape_is_made_writable() -> None:
    doc = _newer("v0.0.42", {"jobs": NEWER_JOBS})
    text = json.dumps(doc).replace('"name": "b"', '"name": "b\\udcff"')
    jobs = parse_jobs(text)
    jobs[1].name.encode("utf-8")  # would raise UnicodeEncodeError with the surrogate kept
    assert jobs[1].name == "b?"


def test_a_bad_record_is_logged_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    doc = _newer("v0.0.42", {"jobs": NEWER_JOBS})
    doc["jobs"][0]["restart_cnt"] = "²"
    del doc["jobs"][2]["job_id"]
    jobs = parse_jobs(json.dumps(doc))
    assert [j.job_id for j in jobs] == ["8"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "medic.slurm"]
    assert "skipped 2 of 3 jobs" in line and "7 (ValueError" in line


@pytest.mark.parametrize(
    "comment",
    [
        "medic:resilient=²",
        "medic:resilient=٣",
        "medic:resilient=３",
        "medic:resilient=" + "9" * 5000,
    ],
)
def test_resilient_tag_accepts_ascii_digits_only(comment: str) -> None:
    assert parse_resilient(comment) is None


@FUZZ
@given(comment=st.text(max_size=60), n=st.integers(min_value=0, max_value=MAX_RESTARTS))
def test_resilient_tag_never_raises_and_keeps_a_good_tag(comment: str, n: int) -> None:
    found = parse_resilient(comment)
    assert found is None or 0 <= found <= MAX_RESTARTS
    words = [w for w in comment.split() if not w.startswith("medic:resilient=")]
    assert parse_resilient(" ".join([*words, f"medic:resilient={n}"])) == n
