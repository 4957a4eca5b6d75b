"""The compiled log reader (dtrlab/trace/_logparse.c) builds exactly parse_lines' trace, or leaves the log to
parse_lines: never a trace where parse_lines raises, never a different one where it does not."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import LOGS, ROOT
from dtrlab.trace import TraceFormatError, load_log, simrd_log
from dtrlab.trace.cache import trace_from_flat
from test_properties import random_logs
from test_trace_cache import assert_identical

pytestmark = pytest.mark.skipif(simrd_log._read_compiled is None,
                                reason="the compiled log reader is not built (pip install -e .)")

START = {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}


def compiled(data: bytes, start: bool = True):
    flat = simrd_log._read_compiled(data, start)
    return None if flat is None else trace_from_flat(flat, flat["operators"], flat["tensors"], "t", "t.log")


def parsed(data: bytes, start: bool = True):
    """parse_lines' trace of the bytes (as load_log builds it without the compiled reader), or its error."""
    try:
        return simrd_log._parse_bytes(data, Path("t.log"), "t", start)
    except TraceFormatError as error:
        return error


def check(data: bytes, start: bool = True, taken: bool | None = None):
    """The compiled reader's trace is parse_lines' or None, None where parse_lines raises; ``taken``: whether
    the reader must take the log."""
    mine, theirs = compiled(data, start), parsed(data, start)
    if isinstance(theirs, TraceFormatError):
        assert mine is None, f"the compiled reader built a trace where parse_lines says {theirs}"
    elif mine is not None:
        assert_identical(mine, theirs)
    if taken is not None:
        assert (mine is not None) == taken
    return mine, theirs


def text(records, separator="\n") -> bytes:
    return (separator.join(json.dumps(r, separators=(",", ":")) for r in records) + separator).encode()


# ---------------------------------------------------------------------------------------------- real logs

REAL_LOGS = sorted(LOGS.glob("*.log")) if LOGS.is_dir() else []


@pytest.mark.shared
@pytest.mark.skipif(not REAL_LOGS, reason=f"{LOGS} is absent (../shared/dtr-logs)")
@pytest.mark.parametrize("start", [True, False])
def test_every_dtr_log_is_read_compiled_to_the_parsed_trace(start):
    for log in REAL_LOGS:
        check(log.read_bytes(), start, taken=True)


@pytest.mark.parametrize("log", sorted((ROOT / "traces").glob("**/*.jsonl.gz")), ids=lambda p: p.name)
def test_every_shipped_trace_is_read_compiled_to_the_parsed_trace(log):
    check(gzip.decompress(log.read_bytes()), taken=True)


def test_load_log_reads_a_plain_log_compiled_and_caches_only_what_it_leaves(tmp_path, monkeypatch):
    records = [START, {"INSTRUCTION": "CONSTANT", "NAME": "a"}, {"INSTRUCTION": "MEMORY", "NAME": "a", "MEMORY": "8"},
               {"INSTRUCTION": "RELEASE", "NAME": "a"}]
    taken, left = tmp_path / "taken.log", tmp_path / "left.log"
    taken.write_bytes(text(records))
    left.write_bytes(text(records[:-1] + [{"INSTRUCTION": "RELEASE", "NAME": "a", "NOTE": "an unknown field"}]))
    expected = {path: parsed(path.read_bytes()) for path in (taken, left)}
    parses = []
    real = simrd_log.parse_lines
    monkeypatch.setattr(simrd_log, "parse_lines", lambda *a, **k: parses.append(1) or real(*a, **k))
    assert load_log(taken, cache=tmp_path / "cache").operators == expected[taken].operators
    assert parses == [] and not (tmp_path / "cache").exists()  # as fast as a cached copy: none is kept
    assert load_log(left, cache=tmp_path / "cache").operators == expected[left].operators
    assert parses == [1] and len(list((tmp_path / "cache").glob("*/*.npz"))) == 1


# ---------------------------------------------------------------------------------------------- edge cases

CONSTANT_A = [START, {"INSTRUCTION": "CONSTANT", "NAME": "a"}]


def lines(*extra: str, head=None) -> bytes:
    return "\n".join([json.dumps(r) for r in (head or CONSTANT_A)] + list(extra)).encode()


@pytest.mark.parametrize("data, taken", [
    # numbers: JSON integers or strings of ASCII digits with a sign; everything int() reads otherwise is left
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":8}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"+8"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"008"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8_0"}'), False),  # int() reads 80
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":" 8"}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"\\u0038"}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":8.0}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":true}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"-1"}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"9223372036854775807"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":9223372036854775808}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"99999999999999999999999"}'), False),  # an error
    # the object: repeated, unknown or misplaced keys, escapes, non-ASCII, white space, a second value
    (lines('{"INSTRUCTION":"MEMORY","NAME":"b","NAME":"a","MEMORY":"8"}'), False),  # json.loads keeps the last
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8","SIZE":"9"}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"\\u0061","MEMORY":"8"}'), False),
    (lines('\t{ "INSTRUCTION" : "MEMORY" ,\t"NAME":"a", "MEMORY" : "8" }\r'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"} {}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8",}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '', '  ', '\r'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"RELEASE","NAME":"\u00e9"}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '\x0c'), False),  # str.strip() drops a form feed
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"RELEASE","NAME":["a"]}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"8"}'), False),  # MEMORY of another name: an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"ALIAS","NAME":"a","ALIAS":"-1"}'),
     False),  # an ALIAS outside a CALL: an error
    # names: a constant may take a copy's name (parse_lines allows it); a result may not take a defined one
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"COPY","DST":"c","SRC":"a"}',
           '{"INSTRUCTION":"CONSTANT","NAME":"c"}', '{"INSTRUCTION":"MEMORY","NAME":"c","MEMORY":"4"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}',
           '{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"4"}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
           '{"INSTRUCTION":"CALL","NAME":"f_backward","ARGS":["a","a"],"RESULT":[],"TIME":5}',
           '{"INSTRUCTION":"MUTATE","NAME":"g","ARGS":["a"],"MUTATE":[0],"TIME":"1"}',
           '{"INSTRUCTION":"MUTATE","NAME":"h","ARGS":["a"],"MUTATE":[],"TIME":"1"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
           '{"INSTRUCTION":"MUTATE","NAME":"g","ARGS":["a","a"],"MUTATE":[0,1],"TIME":"1"}'), False),  # a$ twice
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
           '{"INSTRUCTION":"MUTATE","NAME":"g","ARGS":["a"],"MUTATE":[true],"TIME":"1"}'), False),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
           '{"INSTRUCTION":"MUTATE","NAME":"g","ARGS":["a"],"MUTATE":[1],"TIME":"1"}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
           '{"INSTRUCTION":"MUTATE","NAME":"g","ARGS":["a"],"MUTATE":[-1],"TIME":"1"}'), False),  # an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"COPY","DST":"a","SRC":"a"}'),
     False),  # a COPY to a defined name: an error
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"RELEASE","NAME":"\\u0061"}'),
     False),  # releases a
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"COPY_FROM","DST":"a","SRC":"a"}',
           '{"INSTRUCTION":"ANNOTATE","ANNOTATION":"BACKWARD"}', '{"INSTRUCTION":"ANNOTATE","ANNOTATION":"X"}',
           '{"INSTRUCTION":"ANNOTATE"}', '{"INSTRUCTION":"RELEASE","NAME":"never"}'), True),
    (lines('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', '{"INSTRUCTION":"ANNOTATE","ANNOTATION":1}'), False),
    (b"", False),  # no START: an error
    (lines(head=[{"INSTRUCTION": "FROB"}, START]), False),  # an unknown instruction before START: an error
    (lines(head=[{"INSTRUCTION": "RELEASE", "NAME": 1}, START]), True),  # before START only INSTRUCTION is read
    (lines(head=[{"INSTRUCTION": "RELEASE", "NAME": None}, START]), False),  # but the line must be one it reads
], ids=lambda value: value if isinstance(value, bool) else "")
def test_edge_cases_are_read_as_parsed_or_left(data, taken):
    check(data, taken=taken)
    check(data, start=False)


def test_without_start_an_empty_log_is_an_empty_trace():
    mine, theirs = check(b"\n \n", start=False, taken=True)
    assert mine.operators == () and mine.schedule == ()


# ---------------------------------------------------------------------------------------------- random logs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def rendered_logs(draw):
    """A random log's records as bytes in any of the spellings a JSON writer may use: keys in any order,
    white space, integers as numbers or strings, blank lines, CRLF; with backward annotations and
    COPY_FROMs between its instructions (which may make it invalid: then parse_lines raises)."""
    records = draw(random_logs()).records
    defined, lines_out = [], []
    for index, record in enumerate(records):
        if record["INSTRUCTION"] not in ("MEMORY", "ALIAS"):  # between instructions
            extra = draw(st.sampled_from([None, None, None, "backward", "copy_from"]))
            if extra == "backward":
                lines_out.append({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "BACKWARD"})
            elif extra == "copy_from" and defined:
                lines_out.append({"INSTRUCTION": "COPY_FROM", "DST": draw(st.sampled_from(defined)),
                                  "SRC": draw(st.sampled_from(defined))})
        record = dict(record)
        for key in ("MEMORY", "TIME", "ALIAS"):
            if key in record:
                record[key] = draw(st.sampled_from([record[key], int(record[key]), "+" * (record[key][0] != "-")
                                                    + record[key]]))
        if record["INSTRUCTION"] in ("CALL", "MUTATE") and draw(st.booleans()):
            record["NAME"] += "_backward"
        lines_out.append(record)
        defined += [record[key] for key in ("NAME", "DST") if key in record and record["INSTRUCTION"] in
                    ("CONSTANT", "COPY")] + record.get("RESULT", [])
    separator = draw(st.sampled_from(["\n", "\r\n", "\n\n", "\n \t\n"]))
    out = []
    for record in lines_out:
        items = draw(st.permutations(list(record.items())))
        space = draw(st.sampled_from(["", " ", "\t"]))
        out.append("{" + f"{space},{space}".join(f"{json.dumps(k)}{space}:{space}{json.dumps(v)}" for k, v in items)
                   + "}")
    return (separator.join(out) + draw(st.sampled_from(["", separator]))).encode()


@SETTINGS
@given(data=rendered_logs(), start=st.booleans())
def test_random_logs_are_read_compiled_as_parsed(data, start):
    """Every valid spelling is taken (and built as parse_lines builds it); an invalid log is left."""
    theirs = parsed(data, start)
    check(data, start, taken=not isinstance(theirs, TraceFormatError))


SNIPPETS = ['"', "{", "}", "[", "]", ",", ":", "\\", "\\u0041", "-", "0", "9", ".5", "e", " ", "\t", "\x00",
            "\u00e9", '"NAME":"t1",', '"ALIAS":"0",', '"MEMORY":"-3",', '"TIME":1e3,', '"MUTATE":[0],',
            '{"INSTRUCTION":"COPY_FROM","DST":"t1","SRC":"t2"}\n', '{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}\n',
            '{"INSTRUCTION":"CALL","NAME":"f","ARGS":["t1"],"RESULT":["t1"],"TIME":"1"}\n']


@st.composite
def damaged_logs(draw):
    """A random log with a few edits: lines deleted, repeated or swapped, bytes replaced, snippets inserted."""
    data = bytearray(draw(rendered_logs()))
    for _ in range(draw(st.integers(1, 3))):
        line_list = bytes(data).split(b"\n")
        edit = draw(st.sampled_from(["delete", "repeat", "swap", "replace", "insert"]))
        i, j = draw(st.integers(0, len(line_list) - 1)), draw(st.integers(0, len(line_list) - 1))
        if edit == "delete":
            del line_list[i]
        elif edit == "repeat":
            line_list.insert(j, line_list[i])
        elif edit == "swap":
            line_list[i], line_list[j] = line_list[j], line_list[i]
        if edit in ("delete", "repeat", "swap"):
            data = bytearray(b"\n".join(line_list))
            continue
        at = draw(st.integers(0, max(0, len(data) - 1)))
        snippet = draw(st.sampled_from(SNIPPETS)).encode()
        data[at:at + (edit == "replace")] = snippet
    return bytes(data)


@SETTINGS
@given(data=damaged_logs(), start=st.booleans())
def test_damaged_logs_are_read_as_parsed_or_left(data, start):
    check(data, start)
