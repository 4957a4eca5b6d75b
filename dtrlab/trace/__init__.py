"""Traces: the data model and loaders for simrd's JSON-lines operator logs."""

from .builder import LogBuilder
from .model import COMPUTE, CONSTANT_OP, GET, PIN, RELEASE, Operator, Trace
from .simrd_log import TraceFormatError, load, load_directory, load_log, load_zip, parse_lines, trace_name

__all__ = [
    "COMPUTE", "CONSTANT_OP", "GET", "PIN", "RELEASE", "LogBuilder", "Operator", "Trace", "TraceFormatError",
    "load", "load_directory", "load_log", "load_zip", "parse_lines", "trace_name",
]
