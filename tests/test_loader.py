"""The simrd log loader: schedule semantics, containers, and errors that name file and line."""

import gzip
import json
import zipfile

import pytest

from conftest import RESNET_LOG, UNET_LOG
from dtrlab.trace import COMPUTE, GET, PIN, RELEASE, LogBuilder, TraceFormatError, load, load_log, parse_lines


def small_log() -> LogBuilder:
    log = LogBuilder(start=False)
    log.constant("ignored", 4)  # before START: skipped
    log.annotate("START")
    log.constant("w", 8)
    log.copy("w2", "w")
    log.call("mm", ["w2"], [("y", 16), ("y_view", 0, 0)], time=7)
    log.backward()
    log.mutate("add_", ["y", "w"], [0], time=3)
    log.copy_from("w2", "y")
    log.release("w2", "nonexistent")
    return log


def test_schedule_follows_simrd_semantics():
    trace = small_log().trace("small")
    names = lambda kind_operand: (STEP[kind_operand[0]], trace.tensor_names[kind_operand[1]]  # noqa: E731
                                  if kind_operand[0] != COMPUTE else trace.operators[kind_operand[1]].name)
    assert [names(step) for step in trace.schedule] == [
        ("compute", "constant"), ("pin", "w"),          # CONSTANT + MEMORY
        ("get", "w"),                                   # COPY w2 <- w
        ("compute", "mm"),                              # CALL with a tuple result, one alias
        ("compute", "add_"), ("release", "y"),          # MUTATE: y$ replaces y
        ("release", "w"), ("get", "y$"),                # COPY_FROM w2 <- y (now y$)
        ("release", "y$"),                              # RELEASE w2; the unknown name is ignored
        # outputs: per name (in first-definition order: w, w2, y, y_view) whose tensor
        # still holds a reference; w2 and y both name y$, so it is pinned twice
        ("pin", "w"), ("pin", "y$"), ("pin", "y$"), ("pin", "y_view"),
    ]
    mm = trace.operators[1]
    assert (mm.cost, mm.sizes, mm.aliases, mm.backward) == (7, (16, 0), (-1, 0), False)
    add = trace.operators[2]
    assert (add.sizes, add.aliases, add.backward) == ((16,), (-1,), True)
    assert trace.model_compute == 10


STEP = {COMPUTE: "compute", GET: "get", PIN: "pin", RELEASE: "release"}


#: The line that starts the step (the bad logs below begin with it).
START = '{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}'

BAD_LOGS = [
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION": "CONST'], 2, "malformed JSON"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"FROB"}'], 2, "unknown instruction 'FROB'"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"COPY","DST":"a","SRC":"zz"}'], 2,
     "undefined tensor 'zz'"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}',
      '{"INSTRUCTION":"RELEASE","NAME":"a"}'], 3, "expected MEMORY for 'a'"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}',
      '{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":["r"]}'], 2, "ends where a MEMORY line"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":["r"]}',
      '{"INSTRUCTION":"MEMORY","NAME":"r","MEMORY":"4"}', '{"INSTRUCTION":"ALIAS","NAME":"r","ALIAS":"-1"}'], 2,
     "lacks field 'TIME'"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"MEMORY","NAME":"r","MEMORY":"4"}'], 2,
     "does not follow a CONSTANT or CALL"),
    (['["not", "an", "object"]'], 1, "JSON object with an INSTRUCTION"),
    # a field of the wrong JSON type (a string is iterable, null is not a name): one line, not a traceback
    ([START, '{"INSTRUCTION":"CALL","NAME":null,"ARGS":[],"RESULT":["r"],"TIME":"1"}'], 2,
     "CALL field 'NAME' must be a tensor name (a string), got None"),
    ([START, '{"INSTRUCTION":"CALL","NAME":"f","ARGS":"ab","RESULT":["r"],"TIME":"1"}'], 2,
     "CALL field 'ARGS' must be a list of tensor names (strings), got 'ab'"),
    ([START, '{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":"r","TIME":"1"}'], 2,
     "CALL field 'RESULT' must be a list of tensor names (strings), got 'r'"),
    ([START, '{"INSTRUCTION":"RELEASE","NAME":["a"]}'], 2, "RELEASE field 'NAME' must be a tensor name"),
    ([START, '{"INSTRUCTION":"COPY","DST":1,"SRC":"a"}'], 2, "COPY field 'DST' must be a tensor name"),
    ([START, '{"INSTRUCTION":"MUTATE","NAME":"add_","ARGS":[],"MUTATE":["0"],"TIME":"1"}'], 2,
     "MUTATE field 'MUTATE' must be a list of argument indices (integers), got ['0']"),
    # numbers beyond a 64-bit integer (the cache and the compiled core store int64)
    ([START, '{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":[],"TIME":1e400}'], 2, "TIME is not an integer: inf"),
    ([START, '{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":[],"TIME":"9223372036854775808"}'], 2,
     "TIME must be < 2**63"),
    ([START, '{"INSTRUCTION":"CONSTANT","NAME":"a"}', '{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"1e400"}'], 3,
     "MEMORY is not an integer: '1e400'"),
    ([START, '{"INSTRUCTION":"CONSTANT","NAME":"a"}',
      '{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":99999999999999999999}'], 3, "MEMORY must be < 2**63"),
]


@pytest.mark.parametrize("lines, line_number, message", BAD_LOGS)
def test_errors_name_file_and_line(lines, line_number, message):
    with pytest.raises(TraceFormatError) as error:
        parse_lines(lines, source="bad.log")
    assert str(error.value).startswith(f"bad.log:{line_number}: ")
    assert message in str(error.value)
    assert error.value.line_number == line_number


@pytest.mark.parametrize("lines, line_number, message", BAD_LOGS + [
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"ANNOTATE"}, {"INSTRUCTION":"ANNOTATE"}'], 2,
     "malformed JSON"),
    (['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"ANNOTATE"'], 2, "malformed JSON"),
])
def test_a_log_file_read_at_once_names_the_same_line(tmp_path, lines, line_number, message):
    """load_log decodes a whole file in one JSON call; any bad line sends it to the line-by-line reader."""
    path = tmp_path / "bad.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as error:
        load_log(path, cache=False)
    assert str(error.value).startswith(f"{path}:{line_number}: ")
    assert message in str(error.value)


SMALL_LOG = ['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}',
             '{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}',
             '{"INSTRUCTION":"CALL","NAME":"f","ARGS":["a"],"RESULT":["b"],"TIME":"3"}',
             '{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"4"}', '{"INSTRUCTION":"ALIAS","NAME":"b","ALIAS":"-1"}',
             '{"INSTRUCTION":"RELEASE","NAME":"a"}']


@pytest.mark.parametrize("separator", ["\n", "\r\n", "\n\n", "\n  \t\n"])
def test_blank_lines_and_crlf_read_at_once_as_line_by_line(tmp_path, separator):
    """The one-decode reader has a path for blank-free files (line i is record i) and one that numbers
    the non-blank lines; both give the line-by-line trace, and an error names the file's own line."""
    path = tmp_path / "small.log"
    path.write_bytes((separator.join(SMALL_LOG) + separator).encode())
    trace = load_log(path, cache=False)
    assert trace == parse_lines(path.read_bytes().splitlines(keepends=True), source=str(path), name=trace.name)
    bad = SMALL_LOG[:-1] + ['{"INSTRUCTION":"RELEASE"}']
    text = separator.join(bad) + separator
    path.write_bytes(text.encode())
    line = text[:text.index(bad[-1])].count("\n") + 1
    with pytest.raises(TraceFormatError, match=rf"small.log:{line}: .*lacks field 'NAME'"):
        load_log(path, cache=False)


def test_parsing_restores_the_cyclic_collector(tmp_path):
    """A parse pauses the cyclic garbage collector (it only slows a parse down); it is on again after a
    parse, a failed one included, and stays off where the caller turned it off."""
    import gc

    path = tmp_path / "small.log"
    path.write_text("\n".join(SMALL_LOG) + "\n")
    assert gc.isenabled()
    load_log(path, cache=False)
    assert gc.isenabled()
    path.write_text("\n".join(SMALL_LOG[:-1] + ['{"INSTRUCTION":"RELEASE"}']) + "\n")
    with pytest.raises(TraceFormatError):
        load_log(path, cache=False)
    assert gc.isenabled()
    gc.disable()
    try:
        path.write_text("\n".join(SMALL_LOG) + "\n")
        load_log(path, cache=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("log", [RESNET_LOG, UNET_LOG])
def test_reading_a_log_at_once_gives_the_line_by_line_trace(logs_dir, log):
    path = logs_dir / log
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/dtr-logs)")
    trace = load_log(path, cache=False)
    with open(path, "rb") as lines:
        assert parse_lines(lines, source=str(path), name=trace.name) == trace


@pytest.mark.parametrize("line, message", [
    ('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"-8"}', "MEMORY must be >= 0, got -8"),
    ('{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"8"}', None),
])
def test_negative_sizes_and_times_are_refused(line, message):
    lines = ['{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}', '{"INSTRUCTION":"CONSTANT","NAME":"a"}', line,
             '{"INSTRUCTION":"CALL","NAME":"f","ARGS":["a"],"RESULT":["b"],"TIME":"-1"}',
             '{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"4"}', '{"INSTRUCTION":"ALIAS","NAME":"b","ALIAS":"-1"}']
    expected = f"bad.log:3: {message}" if message else "bad.log:4: TIME must be >= 0, got -1"
    with pytest.raises(TraceFormatError, match=expected):
        parse_lines(lines, source="bad.log")


def test_damaged_containers_name_the_file_and_line(tmp_path):
    log = small_log()
    text = "\n".join(log.lines()).encode()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(text)[:-12])  # the end of the stream is missing
    with pytest.raises(TraceFormatError, match=r"cut\.jsonl\.gz:\d+: cannot be read \(the compressed stream ends"):
        load_log(cut, cache=False)
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_bytes(text)
    with pytest.raises(TraceFormatError, match=r"plain\.jsonl\.gz:1: cannot be read \(Not a gzipped file"):
        load_log(not_gzip, cache=False)
    assert parse_lines(text.splitlines(keepends=True), source="bytes").schedule == log.trace("x").schedule
    (tmp_path / "notzip.zip").write_text("PK? no")
    zipfile.ZipFile(tmp_path / "empty.zip", "w").close()
    for name in ("notzip.zip", "empty.zip"):
        with pytest.raises(TraceFormatError, match=rf"{name}: (not a zip archive|the zip holds no \.log)"):
            load(tmp_path / name)


@pytest.mark.parametrize("manifest, message", [
    ({"models": [{"name": "Small", "has_start": True}]}, "manifest.json: model 1 ('Small') has no \"log\" file name"),
    ({"models": "small.log"}, "manifest.json: manifest.json must have a 'models' list"),
    ({"models": [{"log": "logs/absent.log"}]}, "manifest.json lists 'logs/absent.log', but there is no"),
])
def test_bad_manifests_name_the_file(tmp_path, manifest, message):
    small_log().write(tmp_path / "small.log")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises((TraceFormatError, FileNotFoundError)) as error:
        load(tmp_path)
    assert str(error.value).startswith(str(tmp_path / "manifest.json")) and message in str(error.value)


def test_missing_start_is_explained():
    with pytest.raises(TraceFormatError, match="no ANNOTATE START"):
        parse_lines(['{"INSTRUCTION":"CONSTANT","NAME":"a"}'], source="nostart.log")


def test_file_error_names_the_path(tmp_path):
    path = tmp_path / "broken.log"
    path.write_text('{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}\n{oops\n')
    with pytest.raises(TraceFormatError, match=r"broken\.log:2: malformed JSON"):
        load_log(path)


def test_containers_load_the_same_trace(tmp_path):
    log = small_log()
    plain = tmp_path / "dir" / "small.log"
    plain.parent.mkdir()
    log.write(plain)
    (tmp_path / "dir" / "manifest.json").write_text(json.dumps(
        {"models": [{"name": "Small", "title": "Small", "log": "logs/small.log", "has_start": True}]}))
    with gzip.open(tmp_path / "small.jsonl.gz", "wt") as handle:
        handle.write("\n".join(log.lines()))
    with zipfile.ZipFile(tmp_path / "logs.zip", "w") as archive:
        archive.write(plain, "logs/small.log")
        archive.write(tmp_path / "dir" / "manifest.json", "logs/manifest.json")

    reference = load(plain)
    from_directory = load(tmp_path / "dir")
    from_zip = load(tmp_path / "logs.zip")
    from_gzip = load(tmp_path / "small.jsonl.gz")
    assert list(from_directory) == list(from_zip) == ["small"]
    assert from_directory["small"].meta["manifest_name"] == "Small"
    for trace in (from_directory["small"], from_zip["small"], from_gzip):
        assert trace.content_hash == reference.content_hash
        assert trace.schedule == reference.schedule


@pytest.mark.shared
def test_real_log_counts(load_shared_log):
    trace = load_shared_log(RESNET_LOG)
    summary = trace.summary()
    assert (summary["operators"], summary["constants"], summary["tensors"]) == (509, 223, 696)
    assert summary["schedule_steps"] == 3552
