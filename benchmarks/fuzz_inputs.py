"""Fuzz the tool's file inputs and output paths as a new user would, and check every answer.

Generates (deterministically, from ``--seed``) hundreds of commands over graph files
(``-g FILE.json``), machine files (``--machine FILE.json`` and their measured tables),
strategy files (``--evaluate FILE`` and ``--evaluate -``), model factories (``-g torch:...``)
and output paths (``--dot-path``, ``--export-graph``, ``--export-jax``, ``pase calibrate
--out``), runs them through ``pase.cli.main`` in a worker process (and a few as real
``python3 scheduler.py`` processes), and checks the rules of the command line:

- a documented exit status (never 70, the internal error; never an escaped exception, a
  hang or a crash), and the status the case calls for (1: an unreadable or invalid file,
  2: a bad command line or value);
- a failing run prints exactly one ``pase: error:`` line on stderr (``pase: note:`` lines
  aside), no traceback, nothing on stdout, and nothing outside the streams it was given;
- a successful run prints finite numbers, and inputs that mean the same thing give the same
  total (a graph file against the built-in graph it was exported from, a strategy file
  against the search that wrote it, a machine file against the preset it copies);
- output files: a failing run leaves the directory exactly as it was; a successful one
  writes the file completely, through symlinks, without replacing devices or links, and
  leaves no temporary file behind.

The ``declared`` category takes inputs declared one line each in ``VALUES``, ``INPUT_FILES``,
``OUTPUT_PATHS``, ``REFUSALS`` and ``ACCEPTED`` (a new flag, input file or output path joins the
fuzzing with one line there; see the comment above ``Value``).

Writes ``benchmarks/results/fuzz_inputs.md``: what was tried, counts per category, and every
failure with its command. Exit status 1 if any case failed.

    python benchmarks/fuzz_inputs.py                 # a few minutes on 2 cores
    python benchmarks/fuzz_inputs.py --only graph    # one category
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: The virtual environment with PyTorch for the ``torch:`` cases (skipped when missing).
TORCH_PYTHON = "/work/venvs/torch/bin/python"
#: Where this Python has PyTorch itself, it runs the PyTorch cases, and the other cases run with
#: torch hidden (``sys.modules["torch"] = None``), as in a Python without it.
if not os.path.exists(TORCH_PYTHON) and importlib.util.find_spec("torch") is not None:
    TORCH_PYTHON = sys.executable
#: Exit statuses ``pase --help`` documents (70, the internal error, is a failure here).
DOCUMENTED = {0, 1, 2, 3, 4, 5, 130}
#: Seconds one in-process case may run before it counts as a hang.
CASE_TIMEOUT = 30
#: Address space of the worker process: a hostile input must be refused, not exhaust memory.
WORKER_MEMORY = 4 * 1024 ** 3

BAD_FILE = frozenset({1})
BAD_VALUE = frozenset({2})
#: A machine file that cannot be read or is invalid is a bad --machine value (issue 11: exit 2).
BAD_MACHINE = BAD_VALUE
OK = frozenset({0})
ANY = frozenset(DOCUMENTED - {5, 130})


# ---------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    """One command: its files, arguments, what it must give, and how to check its output."""

    category: str
    kind: str  # sub-category, counted in the report
    what: str  # one line: what the input is
    argv: list
    expect: frozenset = ANY
    files: dict = field(default_factory=dict)  # relative path -> bytes, or ("symlink", target), ("dir",), ...
    stdin: str | None = None
    same_as: str | None = None  # a group whose successful totals must all be equal
    outputs: tuple = ()  # files a successful run must leave complete: (path, "json" | "dot" | "html" | "text")
    python: str = "system"  # "system" or "torch" (the interpreter of the worker)
    process: bool = False  # run as a real process (python3 scheduler.py) instead of in-process
    env: dict = field(default_factory=dict)  # process cases: extra environment
    stdout_file: str | None = None  # process cases: a path (inside the case) to send stdout to
    close_stdin: bool = False  # process cases: start with standard input closed
    stdout_has: str | None = None  # text a successful run's stdout must contain
    notes_have: str | None = None  # text a successful run's stderr (its note lines) must contain
    stdout_lacks: str | None = None  # text a successful run's stdout must not contain
    stderr_has: str | None = None  # text a failed run's error line must contain (its reason)
    refuse_within: float | None = None  # seconds a refusal may take ("no hang before a no")
    skip: str | None = None  # why the case is not run here
    index: int = 0
    directory: str = ""

    def command(self) -> str:
        prefix = "python3 scheduler.py" if self.process else "pase"
        if self.python == "torch":
            prefix = "(torch venv) " + prefix
        text = prefix + " " + " ".join(_quote(a) for a in self.argv)
        if self.stdin is not None:
            text += f" < stdin({_short(self.stdin, 40)})"
        if self.stdout_file:
            text += f" > {self.stdout_file}"
        if self.close_stdin:
            text += " <&-"
        return text


def _quote(arg: str) -> str:
    """A shell word; control characters (a NUL, a newline) as ``$'...'`` escapes."""
    if not re.search(r"[\x00-\x1f\x7f]", arg):
        return shlex.quote(arg)
    return "$'" + "".join(c if " " <= c < "\x7f" and c not in "'\\" else f"\\x{ord(c):02x}" for c in arg) + "'"


def _short(value, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: "\\n" if m.group() == "\n" else f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------
# Reference inputs


def zoo_graph() -> dict:
    """A small graph file with one layer of every type (checked to load and plan)."""
    L = lambda name, op, inputs, **args: {"name": name, "op": op, "inputs": inputs, "args": args}  # noqa: E731
    return {
        "format": "pase-graph", "version": 1, "name": "zoo", "cutoff": 1, "batch": 4,
        "inputs": [
            {"name": "image", "shape": [4, 3, 8, 8], "letters": "bchw", "param": False},
            {"name": "ids", "shape": [4, 6], "letters": "bl", "param": False},
            {"name": "w", "shape": [8, 8], "letters": "kn", "param": True},
        ],
        "layers": [
            L("conv", "Conv", ["image"], filters=4, kernel=[3, 3], stride=[1, 1], pad=[1, 1], pw=1),
            L("bn", "BatchNorm", ["conv"], pw=0),
            L("pool", "Pooling", ["bn"], window=[2, 2], stride=[2, 2], pad=[0, 0]),
            L("mean", "ReduceMean", ["pool"], axes=[2, 3], keepdims=False),
            L("flat", "Ravel", ["pool"]),
            L("unflat", "Unravel", ["flat"], shape=[4, 64], letters="bk"),
            L("fc", "FC", ["unflat"], units=8, pw=1, letters="b"),
            L("cat", "Concat", ["fc", "mean"], axis=1),
            L("head", "SoftmaxCrossEntropy", ["cat"]),
            L("emb", "Embedding", ["ids"], vocab=16, width=8, letters="bl"),
            L("lstm", "LSTM", ["emb"], layers=2),
            L("proj", "Einsum", ["lstm", "w"], equation="blk,kn->bln", pw=0, batch="b"),
            L("add", "Elementwise", ["proj", "emb"], pw=0),
            L("norm", "Norm", ["add"], axis=2, pw=0),
            L("rms", "RMSNorm", ["norm"], axis=2, pw=0),
            L("stack", "Stack", ["rms", "norm"], axis=0, batch_dim=1),
            L("split", "Unstack", ["stack"], axis=0, batch_dim=1),
            L("soft", "Softmax", ["split:0"], axis=2),
            L("sum", "Elementwise", ["soft", "split:1"], pw=0),
            L("loss", "SoftmaxCrossEntropy", ["sum"]),
        ],
    }


def mini_graph(batch: int = 8, k: int = 16, n: int = 4) -> dict:
    """The smallest useful graph file: an FC layer and its loss."""
    return {
        "format": "pase-graph", "version": 1, "name": "mini", "cutoff": 1, "batch": batch,
        "inputs": [{"name": "x", "shape": [batch, k], "letters": "bk", "param": False}],
        "layers": [{"name": "fc", "op": "FC", "inputs": ["x"], "args": {"units": n}},
                   {"name": "loss", "op": "SoftmaxCrossEntropy", "inputs": ["fc"], "args": {}}],
    }


def _dump(data) -> bytes:
    return (json.dumps(data) + "\n").encode()


#: The JSON type each graph-file field takes (``None`` allowed where marked).
GRAPH_TOP = {"format": str, "version": int, "name": str, "cutoff": int, "batch": (int, None),
             "inputs": list, "layers": list}
GRAPH_INPUT = {"name": str, "shape": list, "letters": str, "param": bool}
GRAPH_LAYER = {"name": str, "op": str, "inputs": list, "args": dict}
GRAPH_OPTIONAL = {"batch", "letters", "param", "args"}
#: Layer arguments by JSON type ("pair": an integer or a list of two).
ARG_TYPES = {
    "filters": int, "units": int, "pw": int, "vocab": int, "width": int, "layers": int, "axis": int,
    "batch_dim": (int, None), "kernel": "pair", "stride": "pair", "pad": "pair", "window": "pair", "axes": list,
    "shape": list, "keepdims": bool, "equation": str, "batch": (str, None), "letters": (str, None),
}
#: Values of every JSON type, for replacing a field.
PALETTE = [None, True, False, 0, 1, -1, 2, 1.5, -0.0, 10 ** 30, "", "x", "FC", [], [1], [[1]], {}, {"a": 1}]


def _json_type(value):
    if value is None:
        return None
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    for kind in (float, str, list, dict):
        if isinstance(value, kind):
            return kind
    raise TypeError(value)


def _type_fits(value, kind) -> bool:
    """Whether ``value``'s JSON type is one the field takes (its value may still be wrong)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    t = _json_type(value)
    for k in kinds:
        if k == "pair" and (t is int or (t is list and len(value) == 2)):
            return True
        if k is t:
            return True
    return False


# ---------------------------------------------------------------------------------------
# Case generators


def graph_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    zoo = zoo_graph()
    zoo_text = _dump(zoo)

    def add(kind, what, data, *extra, expect=BAD_FILE, name="graph.json", **kw):
        body = data if isinstance(data, bytes) else _dump(data)
        files = dict(kw.pop("files", {}))
        files[name] = body
        cases.append(Case("graph", kind, what, ["-g", name, "-p", "4", *extra], expect, files, **kw))

    # Good files: every layer type; round trips of built-in graphs give the very same totals.
    add("good", "a graph with one layer of every type", zoo, expect=OK)
    add("good", "a graph with one layer of every type, JSON output", zoo, "--json", expect=OK, same_as="zoo")
    add("good", "the same graph, keys reordered and indented", json.dumps(
        {k: zoo[k] for k in reversed(list(zoo))}, indent=3).encode(), "--json", expect=OK, same_as="zoo")
    add("good", "the same graph, every name \\u-escaped", json.dumps(zoo, ensure_ascii=True).encode().replace(
        b'"conv"', b'"\\u0063onv"'), "--json", expect=OK, same_as="zoo")
    add("good", "the same graph with -b equal to its batch", zoo, "-b", "4", "--json", expect=OK, same_as="zoo")
    add("good", "the graph re-exported", zoo, "--export-graph", "again.json", expect=OK,
        outputs=(("again.json", "json"),))
    for name, text in refs["exported"].items():
        add("round trip", f"built-in {name} exported with --export-graph", text, "-b", "8", "--json",
            expect=OK, same_as=f"builtin:{name}")
        cases.append(Case("graph", "round trip", f"built-in {name}", ["-g", name, "-p", "4", "-b", "8", "--json"],
                          OK, same_as=f"builtin:{name}"))
        add("round trip", f"{name} exported, then exported again", text, "--export-graph", "copy.json",
            expect=OK, outputs=(("copy.json", "same:graph.json"),))

    # Syntax: truncation, encodings, JSON extensions, hostile nesting and numbers.
    offsets = sorted({0, 1, len(zoo_text) - 2, len(zoo_text) - 3} | {rng.randrange(2, len(zoo_text) - 3)
                                                                     for _ in range(14)})
    for cut in offsets:
        add("syntax", f"the zoo graph truncated to {cut} of {len(zoo_text)} bytes", zoo_text[:cut])
    for what, body in [
        ("an empty file", b""), ("only white space", b" \n\t\n"), ("null", b"null"), ("a list", b"[]"),
        ("a number", b"42"), ("a string", b'"zoo"'), ("an empty object", b"{}"),
        ("a UTF-8 byte-order mark before the JSON", b"\xef\xbb\xbf" + zoo_text),
        ("UTF-16 text", json.dumps(zoo).encode("utf-16")),
        ("a Latin-1 byte in a layer name", zoo_text.replace(b'"conv"', b'"conv\xe9"')),
        ("binary noise", bytes(rng.randrange(256) for _ in range(300))),
        ("NaN as a dimension", zoo_text.replace(b"[4, 3, 8, 8]", b"[4, 3, NaN, 8]", 1)),
        ("Infinity as a dimension", zoo_text.replace(b"[4, 3, 8, 8]", b"[4, 3, Infinity, 8]", 1)),
        ("-Infinity as the cutoff", zoo_text.replace(b'"cutoff": 1', b'"cutoff": -Infinity')),
        ("1e999 (overflows to infinity) as a dimension", zoo_text.replace(b"[4, 3, 8, 8]", b"[4, 3, 1e999, 8]", 1)),
        ("100000 nested lists", b"[" * 100000 + b"]" * 100000),
        ("a layer argument nested 5000 deep", zoo_text.replace(b'"units": 8', b'"units": ' + b"[" * 5000 + b"]" * 5000)),
        ("a 5000-digit integer as a dimension", zoo_text.replace(b"[4, 3, 8, 8]", b"[4, 3, " + b"9" * 5000 + b", 8]", 1)),
        ("two JSON documents", zoo_text + zoo_text),
        ("a comment", b"// graph\n" + zoo_text),
        ("a trailing comma", zoo_text.rstrip().rstrip(b"}") + b", }"),
        ("single quotes", zoo_text.replace(b'"format"', b"'format'")),
    ]:
        add("syntax", what, body)
    # Issue 25, item 5: two values for one key are refused (which one counts is not the reader's to guess).
    add("syntax", "a duplicated key (refused)", zoo_text.replace(b'"units": 8', b'"units": 3, "units": 8'),
        "--json")

    # Wrong types and missing fields, field by field.
    def mutate(path, value):
        data = copy.deepcopy(zoo)
        target = data
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return data

    fields = [((k,), t) for k, t in GRAPH_TOP.items()]
    fields += [(("inputs", 0, k), t) for k, t in GRAPH_INPUT.items()]
    for v in (0, 6, 16):
        fields += [(("layers", v, k), t) for k, t in GRAPH_LAYER.items()]
    for path, kind in fields:
        label = _path_text(path)
        optional = path[-1] in GRAPH_OPTIONAL
        add("missing field", f"field {label} missing", mutate(path, _DELETE), expect=ANY if optional else BAD_FILE)
        for value in rng.sample(PALETTE, 8):
            if _type_fits(value, kind):
                continue  # a value of the right type: the "values" cases cover those
            add("wrong type", f"field {label} = {_short(value)}", mutate(path, value))
    for v, layer in enumerate(zoo["layers"]):
        for arg in layer["args"]:
            add("layer args", f"{layer['op']} argument {arg} missing", mutate(("layers", v, "args", arg), _DELETE),
                expect=ANY)
            for value in rng.sample(PALETTE, 5):
                fits = _type_fits(value, ARG_TYPES[arg])
                add("layer args", f"{layer['op']} argument {arg} = {_short(value)}",
                    mutate(("layers", v, "args", arg), value), expect=ANY if fits else BAD_FILE)
        add("layer args", f"{layer['op']} with an unknown argument", mutate(("layers", v, "args", "bogus"), 1))
        other = rng.choice([op for op in _layer_types() if op != layer["op"]])
        add("layer args", f"layer {layer['name']} ({layer['op']}) given op {other}",
            mutate(("layers", v, "op"), other), expect=ANY)

    # Fields the reader does not know: a typo must not be silently ignored.
    for what, data in [
        ("an unknown top-level field", mutate(("comment",), "hi")),
        ("an unknown field in an input", mutate(("inputs", 2, "trainable"), True)),
        ("'params' for 'param' in an input", _rename(zoo, ("inputs", 2), "param", "params")),
        ("an unknown field in a layer", mutate(("layers", 0, "bias"), True)),
        ("'arg' for 'args' in a layer", _rename(zoo, ("layers", 17), "args", "arg")),
        ("'input' for 'inputs' in a layer", _rename(zoo, ("layers", 1), "inputs", "input")),
    ]:
        add("unknown field", what, data)

    # Values: dimensions, counts and the format's own fields.
    for value, expect in [(0, BAD_FILE), (-4, BAD_FILE), (1, ANY), (3, ANY), (10 ** 12, ANY), (2 ** 53, ANY),
                          (2 ** 62, ANY), (2 ** 63, ANY), (2 ** 64 + 1, ANY), (10 ** 30, ANY), (10 ** 400, ANY)]:
        add("dimensions", f"the batch dimension of the image input = {_short(value)}",
            mutate(("inputs", 0, "shape", 0), value), expect=expect)
        add("dimensions", f"the first dimension of the mini graph's input = {_short(value)}",
            _mini_with(value), expect=expect)
        add("dimensions", f"FC units = {_short(value)}", mutate(("layers", 6, "args", "units"), value),
            expect=expect)
    for what, data, expect in [
        ("an empty shape", mutate(("inputs", 0, "shape"), []), BAD_FILE),
        ("a rank-30 input", _mini_shape([2] * 30), ANY),
        ("a rank-40 input of 2**50 dims", _mini_shape([2 ** 50] * 40), ANY),
        ("letters longer than the shape", mutate(("inputs", 0, "letters"), "bchwx"), BAD_FILE),
        ("cutoff 0", mutate(("cutoff",), 0), BAD_FILE),
        ("cutoff 10**30", mutate(("cutoff",), 10 ** 30), ANY),
        ("batch 0", mutate(("batch",), 0), BAD_FILE),
        ("batch null", mutate(("batch",), None), OK),
        ("batch 10**30", mutate(("batch",), 10 ** 30), ANY),
        ("version 2", mutate(("version",), 2), BAD_FILE),
        ("format 'pase-graph2'", mutate(("format",), "pase-graph2"), BAD_FILE),
        ("an empty graph name", mutate(("name",), ""), ANY),
        ("a 100000-character graph name", mutate(("name",), "n" * 100000), OK),
        ("no layers", mutate(("layers",), []), BAD_FILE),
        ("no inputs", mutate(("inputs",), []), BAD_FILE),
        ("a layer reading nothing", mutate(("layers", 1, "inputs"), []), BAD_FILE),
        ("an unknown op", mutate(("layers", 0, "op"), "Convolution"), BAD_FILE),
        ("an op in lower case", mutate(("layers", 0, "op"), "conv"), BAD_FILE),
        ("an empty op", mutate(("layers", 0, "op"), ""), BAD_FILE),
        ("an op named like a Python attribute", mutate(("layers", 0, "op"), "__class__"), BAD_FILE),
    ]:
        add("values", what, data, expect=expect)

    # Structure: references, cycles, names, shapes.
    for what, data in [
        ("a layer reading an undefined tensor", mutate(("layers", 1, "inputs"), ["nothing"])),
        ("a layer reading a later layer (forward reference)", mutate(("layers", 1, "inputs"), ["pool"])),
        ("a layer reading itself", mutate(("layers", 1, "inputs"), ["bn"])),
        ("a cycle: conv reads bn, bn reads conv", mutate(("layers", 0, "inputs"), ["bn"])),
        ("output :2 of a two-output layer", mutate(("layers", 17, "inputs"), ["split:2"])),
        ("output :0 of a one-output layer", mutate(("layers", 1, "inputs"), ["conv:0"])),
        ("a reference that is a number", mutate(("layers", 1, "inputs"), [0])),
        ("two layers with one name", mutate(("layers", 2, "name"), "conv")),
        ("a layer named like a graph input", mutate(("layers", 2, "name"), "image")),
        ("two inputs with one name", mutate(("inputs", 1, "name"), "image")),
        ("an input with an empty name", mutate(("inputs", 1, "name"), "")),
        ("a layer with an empty name", mutate(("layers", 1, "name"), "")),
        ("an FC reading a rank-1 tensor", mutate(("layers", 6, "inputs"), ["flat"])),
        ("an Elementwise of two shapes", mutate(("layers", 12, "inputs"), ["proj", "w"])),
        ("an Einsum whose equation does not match", mutate(("layers", 11, "args", "equation"), "bk,kn->bn")),
        ("an Einsum with an upper-case letter", mutate(("layers", 11, "args", "equation"), "blK,Kn->bln")),
        ("a Conv reading a rank-2 tensor", mutate(("layers", 0, "inputs"), ["ids"])),
        ("a Conv kernel larger than the image", mutate(("layers", 0, "args", "kernel"), [30, 30])),
        ("an Unravel to the wrong number of elements", mutate(("layers", 5, "args", "shape"), [4, 65])),
        ("a Concat of shapes that differ off the axis", mutate(("layers", 7, "inputs"), ["fc", "emb"])),
        ("a Stack of two shapes", mutate(("layers", 15, "inputs"), ["rms", "proj", "fc"])),
        ("an Embedding of a layer output", mutate(("layers", 9, "inputs"), ["fc"])),
        ("a Norm axis out of range", mutate(("layers", 13, "args", "axis"), 3)),
        ("ReduceMean over a repeated axis", mutate(("layers", 3, "args", "axes"), [2, 2])),
    ]:
        add("structure", what, data)
    for what, name in [("a layer name with a double quote", 'co"nv'), ("a layer name with a newline", "co\nnv"),
                       ("a layer name with a backslash", "co\\nv"), ("a layer name in Devanagari", "परत"),
                       ("a layer name with braces and a semicolon", "a};b{")]:
        data = copy.deepcopy(zoo)
        data["layers"][0]["name"] = name
        data["layers"][1]["inputs"] = [name]
        add("structure", what + ", DOT output", data, "--dot-path", "g.dot", expect=OK, outputs=(("g.dot", "dot"),))

    # Size: very many layers, very many outputs.
    add("size", "a chain of 3000 Elementwise layers", _chain(3000), expect=OK)
    add("size", "a Concat of 3000 inputs", _wide_concat(3000), expect=ANY)
    add("size", "a Stack of the same tensor 3000 times", _stack_many(3000), expect=ANY)
    add("size", "an Unstack into 1000 outputs", _unstack(1000), expect=OK)
    for count in (10 ** 8, 2 ** 40, 10 ** 30):
        add("size", f"an Unstack into {count} outputs", _unstack(count))
    add("size", "an Elementwise over a rank-30 input of 2**40 dims (10**361 elements)", _square([2 ** 40] * 30),
        expect=ANY)
    add("size", "an Elementwise over a rank-12 input of 2**40 dims (10**144 elements)", _square([2 ** 40] * 12),
        expect=ANY)

    # Random mutations of the zoo graph and of an exported GPT-2: one to three values each.
    for i in range(150):
        data, what = random_mutation(rng, zoo, rng.randint(1, 3))
        add("random", f"zoo: {what}", data, expect=ANY)
    gpt = json.loads(refs["exported"]["gpt2-small"])
    for i in range(30):
        data, what = random_mutation(rng, gpt, 1)
        add("random", f"gpt2-small: {what}", data, "-b", "8", expect=ANY)
    for i in range(40):
        body = bytearray(zoo_text)
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        add("random", f"zoo with {i % 4 + 1} random bytes", bytes(body), expect=ANY)

    # The file system.
    files_cases = [
        ("a missing file", ["-g", "missing.json"], {}, BAD_FILE),
        ("a directory named x.json", ["-g", "x.json"], {"x.json": ("dir",)}, BAD_FILE),
        ("a symlink loop", ["-g", "loop.json"], {"loop.json": ("symlink", "loop.json")}, BAD_FILE),
        ("a dangling symlink", ["-g", "dangling.json"], {"dangling.json": ("symlink", "nowhere.json")}, BAD_FILE),
        ("a symlink to /dev/null", ["-g", "null.json"], {"null.json": ("symlink", "/dev/null")}, BAD_FILE),
        ("a symlink to /dev/zero (endless NUL bytes)", ["-g", "zero.json"], {"zero.json": ("symlink", "/dev/zero")},
         BAD_FILE),
        ("a symlink to /dev/urandom", ["-g", "random.json"], {"random.json": ("symlink", "/dev/urandom")}, BAD_FILE),
        ("a file name of 300 characters", ["-g", "g" * 295 + ".json"], {}, BAD_FILE),
        ("a path through a file", ["-g", "file.txt/g.json"], {"file.txt": b"x"}, BAD_FILE),
        ("a path with a NUL byte (in-process only)", ["-g", "gr\0aph.json"], {}, frozenset({1, 2})),
        ("just '.json'", ["-g", ".json"], {}, BAD_FILE),
        ("a graph file not ending in .json", ["-g", "graph.txt"], {"graph.txt": zoo_text}, BAD_VALUE),
        ("an empty -g", ["-g", ""], {}, BAD_VALUE),
    ]
    if os.geteuid() != 0:
        files_cases.append(("an unreadable file", ["-g", "secret.json"], {"secret.json": ("mode", zoo_text, 0)},
                            BAD_FILE))
    for what, argv, files, expect in files_cases:
        cases.append(Case("graph", "file system", what, argv + ["-p", "4"], expect, files))
    if os.geteuid() == 0:
        cases.append(Case("graph", "file system", "an unreadable file", [], skip="running as root, which reads any file"))

    # Flags that go with a graph file.
    for what, extra, expect in [
        ("-b other than the file's batch", ["-b", "8"], BAD_VALUE), ("-m with a graph file", ["-m", "64"], BAD_VALUE),
        ("--loss with a graph file", ["--loss", "none"], BAD_VALUE),
        # Issue 43: no layer fills 7 devices: planned on at most 7 (issue 35 refused it), with a note.
        ("-p not dividing anything", ["-p", "7"], OK),
        ("-p not dividing anything, --allow-replication", ["-p", "7", "--allow-replication"], OK),
        ("--sweep", ["--sweep", "1,2,4", "--json"], OK), ("--algo 1", ["--algo", "1"], OK),
        ("--memory far too small", ["--memory", "1e-9"], frozenset({4})),
    ]:
        argv = ["-g", "graph.json"] + extra + ([] if "-p" in extra or "--sweep" in extra else ["-p", "4"])
        cases.append(Case("graph", "flags", what, argv, expect, {"graph.json": zoo_text}))
    return cases


_DELETE = object()

#: Values random mutations draw from: the palette, and numbers at the edges of every range.
EXTREMES = PALETTE + [2 ** 31, 2 ** 53, 2 ** 53 + 1, 2 ** 63, -(2 ** 63), 10 ** 400, 1e-300, 5e-324, 1e300, -1e300,
                      "\u0000", "é", "a" * 1000, [[[[[]]]]], [1, 2, 3, 4, 5, 6, 7, 8]]


def _leaves(data, path=()):
    """Every path to a value inside ``data`` (objects and lists included)."""
    out = [path] if path else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _leaves(value, path + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _leaves(value, path + (i,))
    return out


def random_mutation(rng: random.Random, data, count: int) -> tuple:
    """``(mutated copy, description)``: ``count`` values replaced, deleted or duplicated at random."""
    data = copy.deepcopy(data)
    done = []
    for _ in range(count):
        paths = _leaves(data)
        if not paths:
            break
        path = rng.choice(paths)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.7:
            value = rng.choice(EXTREMES)
            parent[path[-1]] = copy.deepcopy(value)
            done.append(f"{_path_text(path)} = {_short(value, 30)}")
        elif action < 0.85:
            del parent[path[-1]]
            done.append(f"{_path_text(path)} deleted")
        elif isinstance(parent, list):
            parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
            done.append(f"{_path_text(path)} duplicated")
        else:
            parent[f"{path[-1]}_"] = copy.deepcopy(parent[path[-1]])
            done.append(f"{_path_text(path)} copied to a new key")
    return data, "; ".join(done)


def _path_text(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def _rename(data, path, old, new):
    data = copy.deepcopy(data)
    target = data
    for key in path:
        target = target[key]
    target[new] = target.pop(old)
    return data


def _layer_types() -> list:
    from pase.model.layers import LAYER_TYPES

    return sorted(LAYER_TYPES)


def _mini_with(first: int) -> dict:
    data = mini_graph()
    data["batch"] = None
    data["inputs"][0]["shape"][0] = first
    return data


def _mini_shape(shape: list) -> dict:
    data = mini_graph()
    data["batch"] = None
    data["inputs"][0]["shape"] = shape
    data["inputs"][0]["letters"] = ""
    return data


def _square(shape: list) -> dict:
    data = _mini_shape(shape)
    data["layers"] = [{"name": "sq", "op": "Elementwise", "inputs": ["x", "x"], "args": {}}]
    return data


def _chain(n: int) -> dict:
    data = mini_graph()
    layers = [{"name": "l0", "op": "Elementwise", "inputs": ["x", "x"], "args": {}}]
    layers += [{"name": f"l{i}", "op": "Elementwise", "inputs": [f"l{i - 1}", "x"], "args": {}} for i in range(1, n)]
    data["layers"] = layers
    return data


def _wide_concat(n: int) -> dict:
    data = mini_graph()
    data["inputs"] = [{"name": f"x{i}", "shape": [8, 2], "letters": "bk"} for i in range(n)]
    data["layers"] = [{"name": "cat", "op": "Concat", "inputs": [f"x{i}" for i in range(n)], "args": {"axis": 1}},
                      {"name": "loss", "op": "SoftmaxCrossEntropy", "inputs": ["cat"], "args": {}}]
    return data


def _stack_many(n: int) -> dict:
    data = mini_graph()
    data["layers"] = [{"name": "fc", "op": "FC", "inputs": ["x"], "args": {"units": 4}},
                      {"name": "st", "op": "Stack", "inputs": ["fc"] * n, "args": {"axis": 0}}]
    return data


def _unstack(count: int) -> dict:
    data = mini_graph()
    data["batch"] = None
    data["inputs"][0]["shape"] = [count, 4]
    data["layers"] = [{"name": "parts", "op": "Unstack", "inputs": ["x"], "args": {"axis": 0, "batch_dim": 1}},
                      {"name": "loss", "op": "SoftmaxCrossEntropy", "inputs": ["parts:0"], "args": {}}]
    return data


# -- machine files --------------------------------------------------------------------------

MACHINE_FIELDS = {"name": str, "devices_per_node": int, "memory_gb": float, "peak_tflops": float,
                  "hbm_gbps": float, "intra_node": dict, "inter_node": dict, "act_bytes": float,
                  "grad_bytes": float, "measured": str, "device": str, "notes": str}
MACHINE_OPTIONAL = {"measured", "device", "notes"}


def _number_fits(value, kind) -> bool:
    if kind is float:
        return _json_type(value) in (int, float)
    return _type_fits(value, kind)


def machine_cases(rng: random.Random, refs: dict) -> list:
    from pase.machines.calibrated import PRESET_TABLES, PRESETS

    cases = []
    preset = dict(PRESETS["h100-sxm"])
    bare = {k: v for k, v in preset.items() if k not in ("measured", "memory_gib")}
    bare["name"] = "box"
    bare["memory_gb"] = 80  # the decimal field; memory_gib's cases below
    with open(PRESET_TABLES["h100-sxm"], "rb") as f:
        shipped_table = f.read()
    small = {"gemm": [[b, m, n, k, 1e-6 * b * (1 + m * n * k / 64)] for b in (1, 8) for m in (1, 64)
                      for n in (1, 64) for k in (1, 64)],
             "memory_bound": [["add", 1024, 2e-6], ["add", 1 << 20, 5e-5]]}

    def add(kind, what, description, *extra, expect=BAD_MACHINE, files=None, **kw):
        files = dict(files or {})
        files["machine.json"] = description if isinstance(description, bytes) else _dump(description)
        procs = [] if "-p" in extra or "--sweep" in extra else ["-p", "8"]
        cases.append(Case("machine", kind, what, ["-g", "mini.json", "--machine", "machine.json", *procs, *extra],
                          expect, dict(files, **{"mini.json": _dump(mini_graph())}), **kw))

    # Good files; a copy of the preset (with its table) prices exactly as the preset.
    add("good", "the h100-sxm preset without its table", bare, expect=OK)
    add("good", "the h100-sxm preset copied with its table", dict(preset, name="copy"), "--json", expect=OK,
        files={"h100-sxm-measured.json": shipped_table}, same_as="h100")
    cases.append(Case("machine", "good", "the h100-sxm preset by name", ["-g", "mini.json", "--machine", "h100-sxm",
                                                                          "-p", "8", "--json"], OK,
                      {"mini.json": _dump(mini_graph())}, same_as="h100"))
    add("good", "a table in a subdirectory", dict(bare, measured="tables/t.json"), expect=OK,
        files={"tables/t.json": _dump(small)})
    add("good", "a small table", dict(bare, measured="t.json"), "--sweep", "1,8,16", expect=OK,
        files={"t.json": _dump(small)})

    # Field by field: missing, wrong types, out-of-range values.
    for name, kind in MACHINE_FIELDS.items():
        data = dict(bare, measured="t.json")
        if name in data:
            del data[name]
        add("missing field", f"field {name} missing", data, expect=ANY if name in MACHINE_OPTIONAL else BAD_MACHINE,
            files={"t.json": _dump(small)})
        for value in rng.sample(PALETTE, 9):
            if _number_fits(value, kind):
                continue
            add("wrong type", f"field {name} = {_short(value)}", dict(bare, **{name: value}))
    for link in ("intra_node", "inter_node"):
        for sub in ("gbps", "latency_us"):
            data = copy.deepcopy(bare)
            del data[link][sub]
            add("missing field", f"field {link}.{sub} missing", data)
            for value in (None, "1", [], True):
                data = copy.deepcopy(bare)
                data[link][sub] = value
                add("wrong type", f"field {link}.{sub} = {_short(value)}", data)
    for name in ("memory_gb", "peak_tflops", "hbm_gbps", "act_bytes", "grad_bytes", "intra_node.gbps",
                 "inter_node.gbps", "intra_node.latency_us", "inter_node.latency_us", "devices_per_node"):
        for value in (0, -1, 1e-300, 5e-324, 1e300, 10 ** 30, 2 ** 62, 1e999):
            if name == "devices_per_node" and isinstance(value, float):
                continue
            data = copy.deepcopy(bare)
            if "." in name:
                link, sub = name.split(".")
                data[link][sub] = value
            else:
                data[name] = value
            zero_ok = name.endswith("latency_us") and value == 0
            bad = (value <= 0 and not zero_ok) or value == math.inf
            add("values", f"field {name} = {value!r}", data, "--json", expect=BAD_MACHINE if bad else ANY)
    in_gib = {k: v for k, v in bare.items() if k != "memory_gb"}
    for value in (79.65, 0, -1, 1e300, "80", True, None):
        bad = not (isinstance(value, float) and 0 < value < 1e9)
        add("values", f"field memory_gib = {value!r}", dict(in_gib, memory_gib=value), "--json",
            expect=BAD_MACHINE if bad else ANY)
    for what, data in [("memory_gb and memory_gib both", dict(bare, memory_gib=79.65)),
                       ("neither memory_gb nor memory_gib", {k: v for k, v in in_gib.items()}),
                       ("an unknown field", dict(bare, gpus=8)),
                       ("an unknown field in a link", dict(bare, inter_node={"gbps": 50, "latency_us": 1, "hops": 2})),
                       ("a name of spaces", dict(bare, name="   ")),
                       ("an empty device text", dict(bare, device="")),
                       ("a list, not an object", [bare]), ("null", None)]:
        add("fields", what, data)
    # A fitted field (pase calibrate --from-runs): good, and each constant out of its bounds or of
    # the wrong type (the optional wait across nodes included).
    fitted = {"engine": "nanotron", "compute_efficiency": 0.85, "block_overhead_seconds": 4e-3,
              "pipeline_tp_wait_seconds": 5e-3, "tp_node_wait_seconds": 4.9e-3,
              "collective_scale": {"intra_node": 0.65, "inter_node": 1.3}}
    add("fitted", "a fitted field", dict(bare, fitted=fitted), "--json", expect=OK)
    for key, value in [("tp_node_wait_seconds", 0.5), ("tp_node_wait_seconds", -1e-3), ("tp_node_wait_seconds", "5ms"),
                       ("tp_node_wait_seconds", None), ("compute_efficiency", 3.0), ("block_overhead_seconds", 1e300),
                       ("collective_scale", {"intra_node": 1.0}), ("runs", 0), ("colour", 1)]:
        add("fitted", f"fitted {key} = {_short(value)}", dict(bare, fitted=dict(fitted, **{key: value})))
    for what, body in [("an empty file", b""), ("truncated", _dump(bare)[:40]), ("NaN", _dump(bare).replace(
            b'"memory_gb": 80', b'"memory_gb": NaN')), ("nested 100000 deep", b"[" * 100000),
            ("not UTF-8", _dump(bare).replace(b"box", b"b\xffx"))]:
        add("syntax", what, body)

    # Device counts against nodes.
    for g, procs, expect in [(3, 8, BAD_VALUE), (3, 2, OK), (3, 9, OK), (8, 12, BAD_VALUE), (1, 64, OK),
                             (2 ** 62, 8, ANY), (10 ** 30, 8, ANY)]:
        # (--allow-replication: the mini graph's dimensions have no factor 3, issue 35's refusal.)
        add("nodes", f"devices_per_node {g} with -p {procs}", dict(bare, devices_per_node=g), "-p", str(procs),
            "--allow-replication", expect=expect)
    add("nodes", "devices_per_node 3 with --sweep 2,3,4", dict(bare, devices_per_node=3), "--sweep", "2,3,4",
        expect=BAD_VALUE)

    # The measured table: missing, malformed, hostile, enormous.
    def table_case(what, body, expect=BAD_MACHINE, measured="t.json"):
        files = {} if body is None else {"t.json": body if isinstance(body, (bytes, tuple)) else _dump(body)}
        add("measured table", what, dict(bare, measured=measured), expect=expect, files=files)

    grid = small["gemm"]
    table_case("a missing table", None)
    table_case("the table is a directory", ("dir",))
    table_case("the table is the machine file itself", None, measured="machine.json")
    table_case("the table is a symlink loop", ("symlink", "t.json"))
    table_case("the table is /dev/zero", ("symlink", "/dev/zero"))
    table_case("an absolute path to a missing table", None, measured="/nonexistent/t.json")
    table_case("a path out of the directory", None, measured="../../../../../../etc/hostname")
    for what, body in [
        ("an empty table", b""), ("truncated", _dump(small)[:100]), ("a list", []), ("no gemm", {"memory_bound": []}),
        ("an empty gemm", {"gemm": []}), ("gemm not a list", {"gemm": "rows"}), ("a short row", {"gemm": grid + [[1, 2]]}),
        ("a row of strings", {"gemm": grid + [["1", "1", "1", "1", "1"]]}),
        ("a boolean size", {"gemm": [[True] + r[1:] for r in grid]}),
        ("a zero size", {"gemm": grid + [[0, 1, 1, 1, 1e-6]]}), ("negative seconds", {"gemm": grid + [[2, 1, 1, 1, -1]]}),
        ("zero seconds", {"gemm": grid + [[2, 1, 1, 1, 0]]}), ("a float size", {"gemm": grid + [[2.5, 1, 1, 1, 1e-6]]}),
        ("a 5000-digit size", b'{"gemm": [[1, 1, 1, ' + b"9" * 5000 + b", 1e-6]]}"),
        ("a repeated row", {"gemm": grid + [grid[0]]}), ("one value of B", {"gemm": [r for r in grid if r[0] == 1]}),
        ("a memory_bound op with one size", dict(small, memory_bound=[["add", 1024, 1e-6]])),
        ("a memory_bound row of four", dict(small, memory_bound=[["add", 1024, 1e-6, 1]])),
        ("memory_bound not a list", dict(small, memory_bound=5)),
        ("an empty op name", dict(small, memory_bound=[["", 1, 1e-6], ["", 2, 2e-6]])),
    ]:
        table_case(what, body)
    for what, body in [
        ("a size of 10**400", {"gemm": grid + [[2, 1, 1, 10 ** 400, 1e-6]]}),
        ("a size of 2**64", {"gemm": grid + [[2, 1, 1, 2 ** 64, 1e-6]]}),
        ("seconds of 1e300", {"gemm": [r[:4] + [1e300] for r in grid]}),
        ("seconds of 5e-324", {"gemm": [r[:4] + [5e-324] for r in grid]}),
        ("memory_bound seconds of 1e300", dict(small, memory_bound=[["add", 1, 1e300], ["add", 2, 1e300]])),
        ("an unknown memory_bound op", dict(small, memory_bound=[["bogus", 1, 1e-6], ["bogus", 2, 2e-6]])),
        ("a diagonal of 40 rows (a 40**4 grid, nearly all holes)",
         {"gemm": [[i + 1, i + 1, i + 1, i + 1, 1e-6 * (i + 1)] for i in range(40)]}),
        ("a diagonal of 400 rows (a 400**4 grid)",
         {"gemm": [[i + 1, i + 1, i + 1, i + 1, 1e-6 * (i + 1)] for i in range(400)]}),
        ("200000 memory_bound ops of two sizes each",
         dict(small, memory_bound=[[f"op{i}", s, 1e-6 * s] for i in range(100000) for s in (1, 2)])),
        ("the shipped table", shipped_table),
    ]:
        table_case(what, body, expect=ANY)

    # Random mutations of a description and of a measured table.
    for i in range(80):
        data, what = random_mutation(rng, dict(bare, measured="t.json"), rng.randint(1, 3))
        add("random", what, data, "--json", expect=ANY, files={"t.json": _dump(small)})
    for i in range(40):
        data, what = random_mutation(rng, small, rng.randint(1, 2))
        add("random", f"table: {what}", dict(bare, measured="t.json"), "--json", expect=ANY,
            files={"t.json": _dump(data)})

    # Names and flags.
    for what, argv, files, expect in [
        ("an unknown machine name", ["--machine", "h200"], {}, BAD_VALUE),
        ("an empty machine name", ["--machine", ""], {}, BAD_VALUE),
        ("a missing machine file", ["--machine", "missing.json"], {}, BAD_MACHINE),
        ("a directory", ["--machine", "dir.json"], {"dir.json": ("dir",)}, BAD_MACHINE),
        ("a directory without .json", ["--machine", "sub/"], {"sub": ("dir",)}, BAD_MACHINE),
        ("a symlink loop", ["--machine", "loop.json"], {"loop.json": ("symlink", "loop.json")}, BAD_MACHINE),
        ("a file and --flops", ["--machine", "m.json", "--flops", "5"], {"m.json": _dump(bare)}, BAD_VALUE),
        ("paper and --bw", ["--machine", "paper", "--bw", "1e-7"], {}, BAD_VALUE),
    ]:
        files = dict(files, **{"mini.json": _dump(mini_graph())})
        cases.append(Case("machine", "names", what, ["-g", "mini.json", "-p", "8", *argv], expect, files))
    return cases


# -- strategy files ---------------------------------------------------------------------------


def strategy_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    plan = refs["plan"]  # alexnet, -b 8, -p 4, --json
    plan_text = json.dumps(plan).encode()
    configs = [layer["config"] for layer in plan["layers"]]

    def add(kind, what, data, *extra, expect=BAD_FILE, files=None, **kw):
        files = dict(files or {})
        files["plan.json"] = data if isinstance(data, bytes) else json.dumps(data).encode()
        cases.append(Case("strategy", kind, what, ["--evaluate", "plan.json", *extra], expect, files, **kw))

    cases.append(Case("strategy", "good", "the search that wrote the plan", ["-g", "alexnet", "-p", "4", "-b", "8",
                                                                             "--json"], OK, same_as="alexnet plan"))
    add("good", "a previous --json output", plan_text, "--json", expect=OK, same_as="alexnet plan")
    cases.append(Case("strategy", "good", "the same plan on standard input", ["--evaluate", "-", "--json"], OK,
                      stdin=plan_text.decode(), same_as="alexnet plan"))
    add("good", "only the configurations", {"configs": configs}, "-g", "alexnet", "-b", "8", "-p", "4", "--json",
        expect=OK, same_as="alexnet plan")
    add("good", "configurations written as floats (2.0)", {"configs": [[float(c) for c in cfg] for cfg in configs]},
        "-g", "alexnet", "-b", "8", "-p", "4", "--json", expect=OK, same_as="alexnet plan")
    add("good", "layers in reverse order with their ids", dict(plan, layers=plan["layers"][::-1]), "--json",
        expect=OK, same_as="alexnet plan")
    add("good", "the plan with -p 8 (an override, with a note)", plan_text, "-p", "8", expect=OK)

    # Graphs that do not match.
    add("mismatch", "an alexnet plan on resnet101", plan_text, "-g", "resnet101")
    add("mismatch", "an alexnet plan on transformer", plan_text, "-g", "transformer")
    add("mismatch", "an alexnet plan with -b 6", plan_text, "-b", "6", expect=ANY)
    add("mismatch", "an alexnet plan with -p 2 (too few devices)", plan_text, "-p", "2")
    add("mismatch", "an alexnet plan with -m 64 (alexnet has no width)", plan_text, "-m", "64", expect=BAD_VALUE)

    # Configurations: ranks, splits, values.
    def with_config(v, config):
        cfgs = [list(c) for c in configs]
        cfgs[v] = config
        return {"configs": cfgs}

    rank = len(configs[0])
    for what, config in [
        ("one entry too few", configs[0][:-1]), ("one entry too many", configs[0] + [1]), ("an empty configuration", []),
        ("a split that does not divide", [3] + [1] * (rank - 1)), ("more devices than p", [8] + [1] * (rank - 1)),
        ("a zero split", [0] + [1] * (rank - 1)), ("a negative split", [-2] + [1] * (rank - 1)),
        ("a split of 2.5", [2.5] + [1] * (rank - 1)), ("a boolean split", [True] + [1] * (rank - 1)),
        ("a string split", ["2"] + [1] * (rank - 1)), ("a null split", [None] + [1] * (rank - 1)),
        ("a nested list", [[1]] + [1] * (rank - 1)), ("a split of 10**30", [10 ** 30] + [1] * (rank - 1)),
        ("a split of 2**63", [2 ** 63] + [1] * (rank - 1)), ("a configuration that is a number", 4),
        ("a configuration that is null", None), ("a configuration that is an object", {"b": 4}),
    ]:
        add("configs", what, with_config(0, config), "-g", "alexnet", "-b", "8", "-p", "4")
    add("configs", "a split of 1e999 (infinity)", json.dumps(with_config(0, [1] * rank)).replace(
        "[[1, 1", "[[1e999, 1", 1).encode(), "-g", "alexnet", "-b", "8", "-p", "4")
    add("configs", "one configuration too few", {"configs": configs[:-1]}, "-g", "alexnet", "-b", "8", "-p", "4")
    add("configs", "no configurations", {"configs": []}, "-g", "alexnet", "-b", "8", "-p", "4")
    add("configs", "configs is an object", {"configs": {"0": configs[0]}}, "-g", "alexnet", "-b", "8", "-p", "4")
    for what, layers in [
        ("a layer without config", [{k: v for k, v in plan["layers"][0].items() if k != "config"}]
         + plan["layers"][1:]),
        ("a repeated layer id", [dict(plan["layers"][0], id=1)] + plan["layers"][1:]),
        ("a layer id of 0.0", [dict(plan["layers"][0], id=0.0)] + plan["layers"][1:]),
        ("a layer id out of range", [dict(plan["layers"][0], id=99)] + plan["layers"][1:]),
        ("a layer that is a list", [[1]] + plan["layers"][1:]),
        ("layers is an object", {"0": plan["layers"][0]}),
    ]:
        add("layers", what, dict(plan, layers=layers))
    add("layers", "neither configs nor layers", {"graph": "alexnet"})

    # Recorded settings of the wrong type or out of range.
    for key in ("graph", "procs", "batch", "model", "flops", "bw", "machine"):
        for value in rng.sample(PALETTE, 7):
            add("settings", f"recorded {key} = {_short(value)}", dict(plan, **{key: value}), expect=ANY)
    for key in ("param_bytes", "act_bytes", "cap_bytes"):
        for value in rng.sample(PALETTE, 6):
            add("settings", f"recorded memory.{key} = {_short(value)}",
                dict(plan, memory=dict(plan["memory"], **{key: value})), expect=ANY)
    add("settings", "memory is a list", dict(plan, memory=[1]), expect=ANY)
    add("settings", "an unknown graph name, no -g", dict(plan, graph="alexnet2"), expect=BAD_VALUE)
    add("settings", "an unknown graph name, -g alexnet", dict(plan, graph="alexnet2"), "-g", "alexnet")
    add("settings", "procs 2**20 + 1", dict(plan, procs=2 ** 20 + 1))
    add("settings", "batch 2**31", dict(plan, batch=2 ** 31))

    # Random mutations of the plan.
    for i in range(120):
        data, what = random_mutation(rng, plan, rng.randint(1, 3))
        add("random", what, data, "--json", expect=ANY)

    # A plan from a graph file, and plans from other machines.
    mini = _dump(mini_graph())
    files = {"mini.json": mini, "minip.json": json.dumps(refs["mini_plan"]).encode()}
    cases.append(Case("strategy", "graph file", "the search on a graph file", ["-g", "mini.json", "-p", "4", "--json"],
                      OK, files, same_as="mini plan"))
    cases.append(Case("strategy", "graph file", "its plan with -g of the graph file",
                      ["--evaluate", "minip.json", "-g", "mini.json", "--json"], OK, files, same_as="mini plan"))
    cases.append(Case("strategy", "graph file", "its plan without -g (the recorded graph is no built-in)",
                      ["--evaluate", "minip.json"], BAD_VALUE, files))
    cases.append(Case("strategy", "graph file", "its plan with -g alexnet", ["--evaluate", "minip.json", "-g", "alexnet"],
                      BAD_FILE, files))
    box = dict(refs["box"])
    machine_files = {"box.json": _dump(box), "fake.json": _dump(dict(box, name="h100-sxm")),
                     "boxp.json": json.dumps(refs["box_plan"]).encode(),
                     "fakep.json": json.dumps(refs["fake_plan"]).encode(),
                     "h100p.json": json.dumps(refs["h100_plan"]).encode()}
    for what, argv, expect, same in [
        ("a plan from h100-sxm", ["--evaluate", "h100p.json", "--json"], OK, "h100 plan"),
        ("the search that wrote it", ["-g", "alexnet", "-p", "8", "-b", "8", "--machine", "h100-sxm", "--json"], OK,
         "h100 plan"),
        ("a plan from h100-sxm priced on paper", ["--evaluate", "h100p.json", "--machine", "paper"], OK, None),
        ("a plan from h100-sxm with --flops", ["--evaluate", "h100p.json", "--flops", "5"], OK, None),
        ("a plan from machine file box.json, with --machine box.json", ["--evaluate", "boxp.json", "--machine",
                                                                       "box.json", "--json"], OK, "box plan"),
        ("the search that wrote it", ["-g", "alexnet", "-p", "8", "-b", "8", "--machine", "box.json", "--json"], OK,
         "box plan"),
        ("a plan from machine file box.json, without --machine", ["--evaluate", "boxp.json", "--json"],
         frozenset({2}), None),
        ("a plan from a file machine named h100-sxm (no table), without --machine",
         ["--evaluate", "fakep.json", "--json"], frozenset({2}), None),
        ("a plan from a file machine named h100-sxm, with --machine fake.json",
         ["--evaluate", "fakep.json", "--machine", "fake.json", "--json"], OK, "fake plan"),
        ("the search that wrote it", ["-g", "alexnet", "-p", "8", "-b", "8", "--machine", "fake.json", "--json"], OK,
         "fake plan"),
        ("a paper plan with recorded flops and machine h100-sxm",
         ["--evaluate", "mixed.json"], frozenset({0, 1, 2}), None),
    ]:
        extra = {"mixed.json": json.dumps(dict(plan, machine={"name": "h100-sxm"}, procs=8)).encode()}
        cases.append(Case("strategy", "machines", what, argv, expect, dict(machine_files, **extra), same_as=same))

    # Standard input and the file system.
    for what, text in [("empty standard input", ""), ("two plans on standard input", plan_text.decode() * 2),
                       ("a sweep's JSON lines on standard input", refs["sweep_lines"]),
                       ("NaN on standard input", '{"configs": [[NaN]]}'),
                       ("nesting 100000 deep on standard input", "[" * 100000)]:
        cases.append(Case("strategy", "stdin", what, ["--evaluate", "-", "-g", "alexnet"], BAD_FILE, stdin=text))
    for what, argv, files in [
        ("a missing file", ["--evaluate", "missing.json"], {}),
        ("a directory", ["--evaluate", "dir"], {"dir": ("dir",)}),
        ("a symlink loop", ["--evaluate", "loop"], {"loop": ("symlink", "loop")}),
        ("/dev/null", ["--evaluate", "/dev/null"], {}),
        ("an empty file name", ["--evaluate", ""], {}),
    ]:
        cases.append(Case("strategy", "file system", what, argv, BAD_FILE, files))
    for what, argv in [("with --sweep", ["--sweep", "2,4"]), ("with --algo 1", ["--algo", "1"]),
                       ("with --no-blocks", ["--no-blocks"]), ("with --measure", ["--measure"])]:
        add("flags", what, plan_text, *argv, expect=BAD_VALUE)
    return cases


# -- factories -----------------------------------------------------------------------------------

FACTORY_PLAIN = {
    "raises.py": "def build(batch):\n    raise RuntimeError('boom\\nsecond line')\n",
    "exits.py": "import sys\ndef build(batch):\n    sys.exit(0)\n",
    "exits_text.py": "import sys\ndef build(batch):\n    sys.exit('bye')\n",
    "exit_on_import.py": "import sys\nsys.exit(3)\ndef build(batch):\n    pass\n",
    "syntax.py": "def build(batch):\n    return (\n",
    "import_error.py": "import no_such_package_xyz\ndef build(batch):\n    pass\n",
    "import_raises.py": "raise ValueError('at import')\n",
    "needs_torch.py": "import torch\ndef build(batch):\n    return torch.nn.Linear(4, 4), (torch.randn(batch, 4),)\n",
    "not_callable.py": "build = 5\n",
    "returns_none.py": "def build(batch):\n    return None\n",
    "interrupt.py": "def build(batch):\n    raise KeyboardInterrupt\n",
    "base_exception.py": "def build(batch):\n    raise GeneratorExit\n",
    "recursion.py": "def build(batch):\n    return build(batch)\n",
    "notes.txt": "def build(batch):\n    return None\n",
}

FACTORY_TORCH = """\
import sys
import torch

def ok(batch): return (torch.nn.Linear(4, 4), (torch.randn(batch, 4),))
def with_kwargs(batch): return (torch.nn.Linear(4, 4), (), {"input": torch.randn(batch, 4)})
def none(batch): return None
def one(batch): return (torch.nn.Linear(4, 4),)
def four(batch): return (1, 2, 3, 4)
def not_module(batch): return (object(), (torch.randn(batch, 4),))
def args_str(batch): return (torch.nn.Linear(4, 4), "x")
def kwargs_list(batch): return (torch.nn.Linear(4, 4), (torch.randn(batch, 4),), [1])
def shape_error(batch): return (torch.nn.Linear(4, 4), (torch.randn(batch, 5),))
def no_inputs(batch): return (torch.nn.Linear(4, 4), ())
def int_inputs(batch): return (torch.nn.Linear(4, 4), (torch.ones(batch, 4, dtype=torch.long),))
def scalar_input(batch): return (torch.nn.Linear(4, 4), (3,))
def generator(batch): yield 1
class _Raises(torch.nn.Module):
    def forward(self, x): raise ValueError("in forward")
def forward_raises(batch): return (_Raises(), (torch.randn(batch, 4),))
class _Sort(torch.nn.Module):
    def forward(self, x): return torch.sort(x, dim=-1).values
def unmappable(batch): return (_Sort(), (torch.randn(batch, 4),))
class _Exits(torch.nn.Module):
    def forward(self, x): sys.exit(4)
def forward_exits(batch): return (_Exits(), (torch.randn(batch, 4),))
class _Nothing(torch.nn.Module):
    def forward(self, x): return torch.ones(3, 3)
def no_batch_layer(batch): return (_Nothing(), (torch.randn(batch, 4),))
def memory_error(batch): raise MemoryError("fake")
"""


def factory_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    files = {f"fac/{name}": text.encode() for name, text in FACTORY_PLAIN.items()}
    files["fac/models.py"] = FACTORY_TORCH.encode()
    files["fac/dir.py"] = ("dir",)
    expect_exit = {"interrupt.py": frozenset({130})}
    for spec in ["torch:", "torch::", "torch:x.py:", "torch::build", "torch:fac/missing.py:build",
                 "torch:fac/dir.py:build", "torch:fac:build", "torch:fac/notes.txt:build",
                 "torch:fac/raises.py:nope", "torch:fac/raises.py:bad-name", "torch:no_such.module:build",
                 "torch:..relative:build", "torch:sys:exit", "torch:os:getcwd",
                 "torch:fac/raises.py:build:extra", "torch:fac/raises.py:__class__"] + [
                     f"torch:fac/{name}:build" for name in sorted(FACTORY_PLAIN) if name.endswith(".py")]:
        name = spec.split("/")[-1].split(":")[0]
        cases.append(Case("factory", "no torch", f"{spec} in a Python without PyTorch", ["-g", spec, "-p", "4", "-b", "8"],
                          expect_exit.get(name, BAD_VALUE), files))
    cases.append(Case("factory", "no torch", "a factory with -m", ["-g", "torch:fac/raises.py:build", "-m", "8"],
                      BAD_VALUE, files))
    cases.append(Case("factory", "no torch", "a factory with --export-graph into a missing directory",
                      ["-g", "torch:fac/raises.py:build", "--export-graph", "none/x.json"], frozenset({1, 2}), files))
    torch_skip = None if os.path.exists(TORCH_PYTHON) else f"no PyTorch environment at {TORCH_PYTHON}"
    for func in ["ok", "with_kwargs", "none", "one", "four", "not_module", "args_str", "kwargs_list", "shape_error",
                 "no_inputs", "int_inputs", "scalar_input", "generator", "forward_raises", "unmappable",
                 "forward_exits", "no_batch_layer", "memory_error"]:
        expect = OK if func in ("ok", "with_kwargs") else BAD_VALUE
        cases.append(Case("factory", "torch", f"factory models.py:{func}", ["-g", f"torch:fac/models.py:{func}", "-p",
                                                                            "4", "-b", "8"],
                          expect, files, python="torch", skip=torch_skip))
    for spec in ["torch:fac/exits.py:build", "torch:fac/exit_on_import.py:build", "torch:sys:exit",
                 "torch:fac/needs_torch.py:build", "torch:fac/base_exception.py:build"]:
        cases.append(Case("factory", "torch", f"{spec} with PyTorch", ["-g", spec, "-p", "4", "-b", "8"],
                          OK if "needs_torch" in spec else BAD_VALUE, files, python="torch", skip=torch_skip))
    cases.append(Case("factory", "torch", "a model exported and read back", ["-g", "torch:fac/models.py:ok", "-p", "4",
                                                                             "-b", "8", "--export-graph", "m.json"],
                      OK, files, python="torch", skip=torch_skip, outputs=(("m.json", "json"),)))
    cases.append(Case("factory", "torch", "pase calibrate without a GPU", ["calibrate", "--out", "gpu.json", "--quick"],
                      BAD_FILE, {}, python="torch", skip=torch_skip))
    return cases


# -- output paths -------------------------------------------------------------------------------

OUTPUT_FLAGS = {"--dot-path": "dot", "--export-graph": "json", "--export-jax": "json"}


def output_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    mini = _dump(mini_graph())
    keep = b"previous contents\n"
    for flag, check in OUTPUT_FLAGS.items():
        def add(what, target, files, expect, outputs=(), extra=()):
            files = dict({"mini.json": mini}, **files)
            cases.append(Case("output", flag, what, ["-g", "mini.json", "-p", "4", flag, target, *extra], expect, files,
                              outputs=outputs))

        add("a new file", "out.x", {}, OK, (("out.x", check),))
        add("an existing file (replaced)", "out.x", {"out.x": keep}, OK, (("out.x", check),))
        add("a directory", "d", {"d": ("dir",)}, BAD_FILE)
        add("a directory with a trailing slash", "d/", {"d": ("dir",)}, BAD_FILE)
        add("a missing directory", "no/such/out.x", {}, BAD_FILE)
        add("a path through a file", "f/out.x", {"f": keep}, BAD_FILE)
        add("an empty name", "", {}, frozenset({1, 2}))
        add("a name of spaces", "  ", {}, frozenset({1, 2}))
        add("a file name of 300 characters", "o" * 300, {}, BAD_FILE)
        add("a path with a NUL byte (in-process only)", "out\0x", {}, frozenset({1, 2}))
        add("a symlink to an existing file (the file is written)", "link.x",
            {"real.x": keep, "link.x": ("symlink", "real.x")}, OK, (("real.x", check), ("link.x", "symlink")))
        add("a dangling symlink (its target is created)", "link.x", {"link.x": ("symlink", "made.x")}, OK,
            (("made.x", check), ("link.x", "symlink")))
        add("a symlink loop", "loop.x", {"loop.x": ("symlink", "loop.x")}, BAD_FILE)
        add("a full device (a copy of /dev/full)", "full", {"full": ("device", 1, 7)}, BAD_FILE,
            (("full", "device"),))
        add("a symlink to a full device", "link", {"full": ("device", 1, 7), "link": ("symlink", "full")}, BAD_FILE,
            (("full", "device"),))
        add("a null device (a copy of /dev/null)", "null", {"null": ("device", 1, 3)}, OK, (("null", "device"),))
        add("an existing file, and a graph file that fails", "out.x", {"out.x": keep, "mini.json": b"{"}, BAD_FILE)
        add("an existing file, and -p the machine refuses", "out.x", {"out.x": keep}, BAD_VALUE,
            extra=("--machine", "h100-sxm", "-p", "12"))
        # Issue 25, item 6: an output over an input is refused, the input left as it was.
        add("the same file as the graph file (refused)", "mini.json", {}, BAD_VALUE)
        if os.geteuid() != 0:
            add("a read-only file", "ro.x", {"ro.x": ("mode", keep, 0o444)}, BAD_FILE)
            add("a file in a read-only directory", "rod/out.x", {"rod": ("dirmode", 0o555)}, BAD_FILE)
        elif _can_make_immutable():
            # Root writes read-only files; an immutable one (chattr +i) it cannot write or replace.
            add("an immutable file (read-only even for root)", "ro.x", {"ro.x": ("immutable", keep)}, BAD_FILE)
            add("a file in an immutable directory", "rod/out.x", {"rod/old": keep, "rod": ("immutable-dir",)},
                BAD_FILE)
        else:
            cases.append(Case("output", flag, "read-only files and directories", [],
                              skip="running as root, which writes anywhere, without chattr +i"))
    cases.append(Case("output", "-d", "-d writes graph.dot in the working directory", ["-g", "mini.json", "-p", "4", "-d"],
                      OK, {"mini.json": mini}, outputs=(("graph.dot", "dot"),)))
    cases.append(Case("output", "-d", "-d with graph.dot a directory", ["-g", "mini.json", "-p", "4", "-d"],
                      BAD_FILE, {"mini.json": mini, "graph.dot": ("dir",)}))
    cases.append(Case("output", "several", "--dot-path and --export-graph to one file (refused)",
                      ["-g", "mini.json", "-p", "4", "--dot-path", "same", "--export-graph", "same"], BAD_VALUE,
                      {"mini.json": mini}))
    cases.append(Case("output", "several", "--sweep with --dot-path", ["-g", "mini.json", "--sweep", "1,2", "--dot-path",
                                                                       "s.dot"], OK, {"mini.json": mini},
                      outputs=(("s.dot", "dot"),)))
    for what, target, files, expect in [
        ("a directory", "d", {"d": ("dir",)}, BAD_VALUE), ("a .json directory", "d.json", {"d.json": ("dir",)}, BAD_VALUE),
        ("a missing directory", "no/x.json", {}, BAD_VALUE), ("not .json", "x.txt", {}, BAD_VALUE),
        ("an existing file, no PyTorch", "x.json", {"x.json": keep}, BAD_FILE),
        ("a full device", "full.json", {"full.json": ("device", 1, 7)}, BAD_FILE),
        ("an empty name", "", {}, BAD_VALUE),
    ]:
        cases.append(Case("output", "calibrate --out", what, ["calibrate", "--out", target], expect, files,
                          outputs=(("full.json", "device"),) if "device" in what else ()))
    # The literal /dev/full: only once the copies above show that devices are written through
    # (a tool that replaced the target by a file would replace /dev/full itself).
    cases.append(Case("output", "--dot-path", "/dev/full itself", ["-g", "mini.json", "-p", "4", "--dot-path",
                                                                   "/dev/full"], BAD_FILE, {"mini.json": mini},
                      skip="guarded"))
    cases.append(Case("output", "--export-graph", "/dev/null itself", ["-g", "mini.json", "-p", "4", "--export-graph",
                                                                       "/dev/null"], OK, {"mini.json": mini},
                      skip="guarded"))
    cases.append(Case("output", "--dot-path", "/dev/stdout (a process)", ["-g", "mini.json", "-p", "4", "--dot-path",
                                                                          "/dev/stdout"], OK, {"mini.json": mini},
                      skip="guarded", process=True, stdout_has="digraph"))
    return cases


# -- real processes -------------------------------------------------------------------------------


def process_cases(rng: random.Random, refs: dict) -> list:
    zoo = _dump(zoo_graph())
    bad_machine = _dump({"name": "x"})
    cases = []
    for what, argv, files, expect, kw in [
        ("a truncated graph file", ["-g", "g.json"], {"g.json": zoo[:50]}, BAD_FILE, {}),
        ("a graph file with an unknown op", ["-g", "g.json"], {"g.json": zoo.replace(b'"Conv"', b'"Conv2d"')}, BAD_FILE,
         {}),
        ("a machine file missing fields", ["--machine", "m.json"], {"m.json": bad_machine}, BAD_MACHINE, {}),
        ("a strategy of invalid UTF-8 on standard input", ["--evaluate", "-"], {}, BAD_FILE, {"stdin": "\udcff"}),
        ("a factory calling sys.exit(0)", ["-g", "torch:f.py:build"], {"f.py": FACTORY_PLAIN["exits.py"].encode()},
         BAD_VALUE, {}),
        ("a factory calling sys.exit at import", ["-g", "torch:f.py:build"],
         {"f.py": FACTORY_PLAIN["exit_on_import.py"].encode()}, BAD_VALUE, {}),
        ("--dot-path to a full device", ["-g", "g.json", "--dot-path", "full"], {"g.json": zoo, "full": ("device", 1, 7)},
         BAD_FILE, {"outputs": (("full", "device"),)}),
        ("standard output to a full device", ["-g", "g.json"], {"g.json": zoo, "full": ("device", 1, 7)}, BAD_FILE,
         {"stdout_file": "full"}),
        ("a good graph file, PYTHONHASHSEED=0", ["-g", "g.json", "-p", "4", "--json"], {"g.json": zoo}, OK,
         {"env": {"PYTHONHASHSEED": "0"}, "same_as": "hashseed"}),
        ("a good graph file, PYTHONHASHSEED=12345", ["-g", "g.json", "-p", "4", "--json"], {"g.json": zoo}, OK,
         {"env": {"PYTHONHASHSEED": "12345"}, "same_as": "hashseed"}),
        ("a symlink loop as the graph", ["-g", "loop.json"], {"loop.json": ("symlink", "loop.json")}, BAD_FILE, {}),
        ("--evaluate - with standard input closed", ["--evaluate", "-"], {}, BAD_FILE, {"close_stdin": True}),
    ]:
        argv = argv if "-p" in argv else argv + ["-p", "4"]
        cases.append(Case("process", "scheduler.py", what, argv, expect, files, process=True, **kw))
    return cases


# -- Hugging Face configs, recipes and engine exports (the training-configuration turn) -----------

#: A small Llama-style config: every case below runs in well under a second.
TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 128,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
#: Today's model types (issue 32), each as small: windows, sinks, latent attention, experts.
TINY_NEW = {
    "qwen3": dict(_TINY, model_type="qwen3", head_dim=16),
    "mistral": dict(_TINY, model_type="mistral", sliding_window=8),
    "phi3": dict(_TINY, model_type="phi3", sliding_window=7),
    "nemotron": dict(_TINY, model_type="nemotron", hidden_act="relu2", partial_rotary_factor=0.5),
    "gemma2": dict(_TINY, model_type="gemma2", head_dim=16, sliding_window=8),
    "gemma3_text": dict(_TINY, model_type="gemma3_text", head_dim=16, sliding_window=8),
    "gpt_oss": dict(_TINY, model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    "deepseek_v3": dict(_TINY, model_type="deepseek_v3", q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
                        qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
                        moe_intermediate_size=32, num_nextn_predict_layers=1),
    "mpt": {"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 128,
            "vocab_size": 256, "no_bias": True, "attn_config": {"alibi": True}},
}
_LLAMA_REQUIRED = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "vocab_size")
#: Fields each model type reads (a missing required one is an invalid file).
HF_REQUIRED = {"llama": _LLAMA_REQUIRED,
               "gpt2": ("model_type", "n_embd", "n_layer", "n_head", "vocab_size", "n_positions"),
               **{t: _LLAMA_REQUIRED for t in ("qwen3", "mistral", "phi3", "nemotron", "gemma2", "gemma3_text")},
               "gpt_oss": _LLAMA_REQUIRED + ("num_local_experts", "num_experts_per_tok"),
               "deepseek_v3": _LLAMA_REQUIRED + ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                 "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
               "mpt": ("model_type", "d_model", "n_heads", "n_layers", "vocab_size")}


def hf_cases(rng: random.Random, refs: dict) -> list:
    cases = []

    def add(kind, what, data, *extra, expect=BAD_FILE, raw=None, **kw):
        body = raw if raw is not None else _dump(data)
        cases.append(Case("hf", kind, what, ["-g", "hf:c.json", "-p", "4", "-b", "8", *extra], expect,
                          {"c.json": body}, **kw))

    for name, base in (("llama", TINY_HF), ("gpt2", TINY_GPT2), *TINY_NEW.items()):
        add("good", f"a small {name} config", base, expect=OK, same_as=f"hf-{name}")
        add("good", f"the {name} config, keys reordered and indented", None, expect=OK, same_as=f"hf-{name}",
            raw=json.dumps(dict(reversed(list(base.items()))), indent=3).encode())
        add("good", f"the {name} config with unknown keys (a Hub config has many)",
            dict(base, architectures=["X"], torch_dtype="bfloat16", _name_or_path="x/y"), expect=OK,
            same_as=f"hf-{name}")
        add("good", f"the {name} config, --training", base, "--machine", "h100-sxm", "--training", expect=OK)
        for key in HF_REQUIRED[name]:
            add("missing field", f"{name}: {key} missing", {k: v for k, v in base.items() if k != key})
        for key in base:
            for value in rng.sample(PALETTE, 5):
                if value == base[key] and type(value) is type(base[key]):
                    continue
                add("wrong type", f"{name}: {key} = {_short(value, 20)}", dict(base, **{key: value}), expect=ANY)
        for key, value in (("num_key_value_heads", 3), ("num_attention_heads", 5), ("head_dim", 0),
                           ("hidden_size", 2 ** 40), ("vocab_size", 10 ** 30), ("num_hidden_layers", 10 ** 6),
                           ("intermediate_size", 2 ** 62), ("hidden_act", "GELU"), ("rms_norm_eps", float("inf")),
                           ("model_type", "Llama"), ("model_type", "mixtral"), ("model_type", None),
                           ("max_position_embeddings", 0), ("tie_word_embeddings", 1)):
            if key not in base and key != "model_type":
                continue
            add("values", f"{name}: {key} = {_short(value, 20)}", dict(base, **{key: value}), expect=ANY)
    add("values", "gpt2: -m longer than its learned positions", TINY_GPT2, "-m", "4096", expect=BAD_VALUE)
    add("values", "llama: -m 1 (one token)", TINY_HF, "-m", "1", expect=OK)
    add("values", "deepseek_v3: --mtp", TINY_NEW["deepseek_v3"], "--mtp", expect=OK)
    # The router's function (MoEConfig.router), read as transformers builds it.
    for value in (0, -2.5, "2.5", True, float("inf")):
        add("values", f"deepseek_v3: routed_scaling_factor = {_short(value, 20)}",
            dict(TINY_NEW["deepseek_v3"], routed_scaling_factor=value), expect=BAD_FILE)
    add("values", "deepseek_v2: topk_method noaux_tc (transformers' V2 has greedy and group_limited_greedy)",
        dict(TINY_NEW["deepseek_v3"], model_type="deepseek_v2", topk_method="noaux_tc"), expect=BAD_FILE)
    add("values", "deepseek_v3: norm_topk_prob false (read; exports refuse it)",
        dict(TINY_NEW["deepseek_v3"], norm_topk_prob=False), expect=OK)
    # Issue 44: --mtp where there is no multi-token prediction is refused (it was ignored).
    add("values", "llama: --mtp (no such module)", TINY_HF, "--mtp", expect=BAD_VALUE, stderr_has="has none")
    add("values", "an unknown model_type (through transformers, or one line without it)",
        dict(TINY_HF, model_type="no_such_model"), expect=ANY)
    add("values", "llama: -m far past the config's maximum (rotary takes any)", TINY_HF, "-m", "100000",
        expect=frozenset({0, 3}))
    for what, raw in (("an empty file", b""), ("truncated", _dump(TINY_HF)[:40]), ("a list", b"[1, 2]"),
                      ("null", b"null"), ("NaN for a field", _dump(TINY_HF).replace(b"1e-05", b"NaN")),
                      ("a key given twice", b'{"model_type": "llama", "model_type": "gpt2"}'),
                      ("not UTF-8", b'{"model_type": "\xff"}'), ("nested 100000 deep", b"[" * 100000)):
        add("syntax", what, None, raw=raw)
    cases.append(Case("hf", "file system", "a missing file", ["-g", "hf:none.json", "-p", "4"], BAD_FILE))
    cases.append(Case("hf", "file system", "a directory", ["-g", "hf:d", "-p", "4"], BAD_FILE, {"d": ("dir",)}))
    cases.append(Case("hf", "file system", "an empty name", ["-g", "hf:", "-p", "4"], frozenset({1, 2})))
    for i in range(60):
        data, what = random_mutation(rng, rng.choice((TINY_HF, TINY_GPT2, *TINY_NEW.values())), rng.randint(1, 3))
        add("random", what, data, expect=ANY)
    return cases


#: Recipes that must be accepted on 4 devices of h100-sxm with the tiny config (2 layers).
GOOD_RECIPES = ("dp=4", "tp=4", "dp=2,tp=2", "pp=2,dp=2", "zero=3", "recompute=full", "recompute=selective",
                "microbatch=1", "dp=2,tp=2,sp=true", "pp=2,schedule=1f1b", "cp=2,dp=2", "dp=4,zero=0,microbatch=2",
                # Issue 45: offload to the host.
                "offload=optimizer", "zero=3,offload=optimizer+params", "offload=params+optimizer", "offload=activations",
                "offload=none", "dp=4,zero=1,offload=optimizer+activations",
                # Issue 42: Megatron's --recompute-modules.
                "recompute=selective,recompute_modules=layernorm+mlp", "recompute=selective,recompute_modules=core_attn")
#: (recipe, why it is refused): a bad value is exit 2.
BAD_RECIPES = (
    ("dp=3", "degrees not dividing p"), ("dp=8", "more devices than -p"), ("tp=0", "a zero degree"),
    ("tp=-2", "a negative degree"), ("tp=1.5", "a fractional degree"), ("zero=4", "no ZeRO stage 4"),
    ("recompute=some", "an unknown policy"), ("schedule=gpipe", "an unknown schedule"), ("foo=1", "an unknown key"),
    ("dp=2,dp=2", "a key given twice"), ("dp", "no value"), ("=2", "no key"), ("dp=2,,tp=2", "an empty item"),
    ("", "an empty recipe"), ("dp=2;tp=2", "the wrong separator"), ("DP=4", "upper case"),
    ("dp=4,tp=1,pp=1,cp=1,zero=1,recompute=none,microbatch=3", "a micro-batch not dividing the per-rank batch"),
    ("pp=4", "more stages than blocks"), ("vpp=2", "interleaving without a pipeline"),
    ("sp=maybe", "a non-boolean flag"), ("dp=" + "9" * 400, "a 400-digit degree"), ("dp=\u0664", "an Arabic-Indic digit"),
    # Issue 42: the pipeline's extras and the experts' words.
    ("pipeline_extra=both", "an unknown pipeline extra"), ("pp=2,pipeline_extra=embedding", "extras not splitting evenly"),
    ("pp=1,pipeline_extra=loss", "extras without a pipeline"), ("dispatcher=flex", "flex is a type, not a backend"),
    ("ep_overlap=true,recompute=full", "the EP overlap under full recomputation"),
    ("ep_overlap=true,shared_overlap=true", "both expert overlaps"), ("shared_overlap=true,dispatcher=deepep",
                                                                      "shared overlap with a fused dispatcher"),
    # Issue 45: offload combinations refused.
    ("offload=params,zero=1", "parameter offload without ZeRO-3"), ("offload=optimizer+nvme", "optimizer twice"),
    ("offload=activations,recompute=full", "activation offload with recomputation"),
    ("offload=optimizer,pp=2", "offload on a pipeline"), ("offload=disk", "an unknown offload"),
    ("offload=optimizer+optimizer", "an offload named twice"), ("offload=nvme", "nvme on a machine without a drive"),
    ("offload=", "an empty offload"), ("offload=optimizer++params", "an empty offload word"),
    # Issue 42: recompute modules refused.
    ("recompute_modules=mlp", "modules without selective"), ("recompute=full,recompute_modules=mlp", "modules under full"),
    ("recompute=selective,recompute_modules=attention", "an unknown module"),
    ("recompute=selective,recompute_modules=shared_experts", "shared experts on a dense model"),
    ("recompute=selective,recompute_modules=moe", "a mixture of experts' module on a dense model"),
    ("recompute=selective,recompute_modules=moe_act+layernorm", "the experts' activation on a dense model"),
    ("recompute=selective,recompute_modules=mla_up_proj", "latent attention's module without latent attention"),
    ("recompute=selective,recompute_modules=mlp+mlp", "a module named twice"),
    ("recompute=selective,recompute_modules=", "no modules"),
)


def recipe_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    hf = {"c.json": _dump(TINY_HF)}

    def add(kind, what, recipe, *extra, expect=BAD_VALUE, files=hf):
        cases.append(Case("recipe", kind, what, ["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm",
                                                 "--training", "--recipe", recipe, *extra], expect, dict(files)))

    for recipe in GOOD_RECIPES:
        add("good", recipe, recipe, expect=OK)
    add("good", "--compare with a recipe", "dp=2,tp=2", "--compare", "dp=4", expect=OK)
    add("good", "--json with a recipe", "dp=2,tp=2", "--json", expect=OK)
    for recipe, why in BAD_RECIPES:
        add("bad", f"{why}: {_short(recipe, 30)}", recipe, expect=frozenset({2, 4}) if "batch" in why else BAD_VALUE)
    keys = ("dp", "tp", "pp", "cp", "zero", "recompute", "microbatch", "schedule", "vpp", "sp", "precision", "scaling",
            "fp8_gather", "pipeline_extra", "dispatcher", "ep_overlap", "shared_overlap", "offload")
    values = ("1", "2", "4", "0", "-1", "3", "true", "none", "full", "interleaved", "x", "", "fp8", "nvfp4", "search",
              "current", "blockwise", "embedding+loss", "loss", "hybridep", "allgather", "optimizer", "params+optimizer",
              "activations", "nvme")
    for _ in range(80):
        recipe = ",".join(f"{rng.choice(keys)}={rng.choice(values)}" for _ in range(rng.randint(1, 4)))
        add("random", recipe, recipe, expect=frozenset({0, 2, 4}))
    cases.append(Case("recipe", "flags", "--recipe on a graph that is not a decoder (alexnet)",
                      ["-g", "alexnet", "-p", "4", "-b", "8", "--training", "--recipe", "dp=4"], frozenset({0, 2})))
    cases.append(Case("recipe", "flags", "--recipe with --sweep",
                      ["-g", "hf:c.json", "--sweep", "2,4", "-b", "8", "--recipe", "dp=2"], frozenset({0, 2}), dict(hf)))
    cases.append(Case("recipe", "flags", "--recipe with --evaluate",
                      ["--evaluate", "p.json", "--recipe", "dp=2"], frozenset({1, 2}), {"p.json": b"{}"}))
    cases += engine_profile_cases(rng, hf)
    return cases


def _profile_file(mutate) -> bytes:
    """The shipped fsdp profile, changed by ``mutate(data)`` (which may return new data)."""
    from pase.planning.engine import engine_dir

    with open(os.path.join(engine_dir(), "fsdp.json")) as f:
        data = json.load(f)
    changed = mutate(data)
    return _dump(data if changed is None else changed)


#: (``--engine`` value, why it is refused): a bad value is exit 2, one line.
BAD_ENGINES = (
    ("nope", "an unknown engine"), ("Megatron", "upper case"), ("megatron,colour=red", "an unknown key"),
    ("torchtitan,compile=maybe", "a switch value it lacks"), ("megatron,comm_sm_share=2", "a share above 1"),
    ("megatron,launch_seconds=-1", "a negative number"), ("megatron,launch_seconds=nan", "not a number"),
    ("torchtitan,compile", "a key without a value"), ("", "an empty spec"), (",", "a comma alone"),
    ("megatron,tp_overlap=true,tp_overlap=false", "a key twice"), ("absent.json", "a missing profile file"),
    ("torchtitan,version=0.1", "a torchtitan release it does not write"), ("torchtitan,version=0.4", "a later one"),
    ("torchtitan,version=0.3.0", "a patch release, not the switch's value"), ("torchtitan,version=", "no value"),
    ("torchtitan,version=0.2,version=0.3", "the version twice"), ("megatron,version=0.2", "another engine's key"),
    ("torchtitan,version=latest", "a word"),
    ("megatron-deepspeed,optimizer=adam", "an optimizer the switch lacks"),
    ("megatron-deepspeed,attention_kernel=flash", "an attention kernel no engine states"),
    ("megatron-deepspeed,lp_grad_kept=maybe", "not true or false"),
    ("megatron,moe_block_overhead_seconds=-0.001", "a negative MoE host time"),
    ("megatron,moe_block_overhead_seconds=inf", "an infinite MoE host time"),
    ("megatron,moe_block_overhead_seconds=fast", "a word for the MoE host time"),
    ("megatron,expert_activation_sync=gelu", "an activation no network declares"),
    ("megatron,expert_activation_sync=true", "a boolean for the activation"),
    ("megatron,expert_activation_sync=", "no activation"),
)
#: (file contents, why it is refused): malformed profile files.
BAD_PROFILES = (
    (b"{", "not JSON"), (b"[]", "a list"), (b"\xff\xfe", "not UTF-8"),
    (lambda d: d.pop("facts") and None, "no facts"),
    (lambda d: d["facts"].pop("wrap_unit") and None, "a fact missing"),
    (lambda d: d["facts"]["grad_dtype"].update(source="") or None, "a fact without a source"),
    (lambda d: d["facts"]["grad_dtype"].update(value="fp8") or None, "an unknown dtype"),
    (lambda d: d["facts"]["loss_buffers"].update(value=True) or None, "a boolean for a number"),
    (lambda d: d["facts"].update(moe_block_overhead_seconds={"value": -1, "source": "x"}) or None,
     "a negative MoE host time"),
    (lambda d: d["facts"].update(expert_activation_sync={"value": "relu", "source": "x"}) or None,
     "an unknown activation that stops the host"),
    (lambda d: d["facts"].update(colour={"value": 1, "source": "x"}) or None, "an unknown fact"),
    (lambda d: d.update(name="") or None, "an empty name"),
    (lambda d: d.update(band={"step": [2, 1]}) or None, "a band low above high"),
    (lambda d: d.update(switches={"k": {"v": {"nope": 1}}}) or None, "a switch setting an unknown fact"),
)


def engine_profile_cases(rng: random.Random, hf: dict) -> list:
    """``--engine``: every shipped engine and a switch (exit 0), bad names and keys and malformed
    profile files (exit 2, one line on stderr)."""
    cases = []

    def add(kind, what, spec, expect, files=None):
        cases.append(Case("recipe", kind, what, ["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm",
                                                 "--engine", spec], expect, dict(hf, **(files or {}))))

    for spec in ("megatron", "torchtitan", "fsdp", "deepspeed", "torchtitan,compile=true", "megatron,grad_reduce=bf16",
                 "torchtitan,version=0.2", "torchtitan,version=0.3,compile=true", "nanotron", "megatron-deepspeed",
                 "megatron-deepspeed,optimizer=bf16", "megatron-deepspeed,attention_kernel=sdpa",
                 "megatron,moe_block_overhead_seconds=0", "megatron,moe_block_overhead_seconds=0.002",
                 "megatron,expert_activation_sync=none", "megatron,expert_activation_sync=swiglu",
                 "fsdp,expert_activation_sync=quick_geglu"):
        add("engine good", spec, spec, OK)
    add("engine good", "a profile file of one's own", "mine.json", OK, {"mine.json": _profile_file(lambda d: None)})
    for spec, why in BAD_ENGINES:
        add("engine bad", f"{why}: {_short(spec, 30)}", spec, BAD_VALUE)
    for content, why in BAD_PROFILES:
        data = content if isinstance(content, bytes) else _profile_file(content)
        add("engine bad", f"profile file: {why}", "bad.json", BAD_VALUE, {"bad.json": data})
    return cases


#: The engine exports and the format of what they write.
ENGINE_FLAGS = {"--export-torchtitan": "launch", "--export-megatron": "json", "--export-deepspeed": "json"}


def engine_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    hf = _dump(TINY_HF)
    keep = b"previous contents\n"
    base = ["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training"]
    for flag, check in ENGINE_FLAGS.items():
        def add(what, target, files, expect, outputs=(), extra=()):
            cases.append(Case("engine", flag, what, [*base, flag, target, *extra], expect,
                              dict({"c.json": hf}, **files), outputs=outputs))

        add("a new file", "out.x", {}, OK, (("out.x", check),))
        add("an existing file (replaced)", "out.x", {"out.x": keep}, OK, (("out.x", check),))
        # DeepSpeed's config has no tensor or pipeline parallelism: refused with the reason.
        runs = BAD_VALUE if flag == "--export-deepspeed" else OK
        add("a fixed recipe", "out.x", {}, runs, (("out.x", check),), ("--recipe", "dp=2,tp=2"))
        add("a pipeline recipe", "out.x", {}, runs, (("out.x", check),), ("--recipe", "pp=2,dp=2"))
        add("a directory", "d", {"d": ("dir",)}, BAD_FILE)
        add("a missing directory", "no/such/out.x", {}, BAD_FILE)
        add("a path through a file", "f/out.x", {"f": keep}, BAD_FILE)
        add("an empty name", "", {}, frozenset({1, 2}))
        add("the hf config itself", "c.json", {}, frozenset({1, 2}), (("c.json", "same:c.json"),))
        add("a symlink to the hf config", "l.json", {"l.json": ("symlink", "c.json")}, frozenset({1, 2}),
            (("l.json", "symlink"),))
        add("a symlink to an existing file (the file is written)", "link.x",
            {"real.x": keep, "link.x": ("symlink", "real.x")}, OK, (("real.x", check), ("link.x", "symlink")))
        add("a full device (a copy of /dev/full)", "full", {"full": ("device", 1, 7)}, BAD_FILE,
            (("full", "device"),))
        add("without --training (a plain search)", "out.x", {}, frozenset({0, 2}), (), ())
        add("and a graph file that fails", "out.x", {"out.x": keep, "c.json": b"{"}, BAD_FILE)
    cases[-2].argv = ["-g", "hf:c.json", "-p", "4", "-b", "8", cases[-2].argv[-2], "out.x"]
    cases.append(Case("engine", "several", "both exports to one file",
                      [*base, "--export-torchtitan", "same", "--export-megatron", "same"], frozenset({1, 2}),
                      {"c.json": hf}))
    cases.append(Case("engine", "several", "an export over --dot-path",
                      [*base, "--export-torchtitan", "same", "--dot-path", "same"], frozenset({1, 2}), {"c.json": hf}))
    # A plan is priced for one engine: exports for two are refused before the search.
    cases.append(Case("engine", "several", "exports for two engines (refused: one engine per plan)",
                      [*base, "--export-torchtitan", "t.json", "--export-megatron", "m.json"], BAD_VALUE,
                      {"c.json": hf}))
    cases.append(Case("engine", "several", "an export and the DOT graph",
                      [*base, "--export-torchtitan", "t.json", "--dot-path", "g.dot"],
                      OK, {"c.json": hf}, outputs=(("t.json", "launch"), ("g.dot", "dot"))))
    cases.append(Case("engine", "several", "an export for another engine than --engine (refused)",
                      [*base, "--engine", "megatron", "--export-deepspeed", "d.json"], BAD_VALUE, {"c.json": hf}))
    cases.append(Case("engine", "models", "a model that is not a decoder (alexnet)",
                      ["-g", "alexnet", "-p", "4", "-b", "8", "--training", "--export-megatron", "m.json"],
                      frozenset({0, 2})))
    # An export over a file the run reads: --recipe-from's file, a machine file's measured table.
    from pase.machines.calibrated import PRESETS

    bare = {k: v for k, v in PRESETS["h100-sxm"].items() if k != "measured"}
    small = {"gemm": [[b, m, n, k, 1e-6 * b * (1 + m * n * k / 64)] for b in (1, 8) for m in (1, 64)
                      for n in (1, 64) for k in (1, 64)],
             "memory_bound": [["add", 1024, 2e-6], ["add", 1 << 20, 5e-5]]}
    for flag in ENGINE_FLAGS:
        cases.append(Case("engine", "over an input", f"{flag} over the machine file's measured table",
                          ["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "m.json", flag, "t.json"], BAD_VALUE,
                          {"c.json": hf, "m.json": _dump(dict(bare, name="box", measured="t.json")),
                           "t.json": _dump(small)}, outputs=(("t.json", "same:t.orig"),)))
        cases[-1].files["t.orig"] = _dump(small)
        cases.append(Case("engine", "over an input", f"{flag} over the --recipe-from file",
                          [*base, "--recipe-from", "r.toml", flag, "r.toml"], BAD_VALUE,
                          {"c.json": hf, "r.toml": refs["engine_files"]["torchtitan"],
                           "r.orig": refs["engine_files"]["torchtitan"]}, outputs=(("r.toml", "same:r.orig"),)))
    return cases


def recipe_from_cases(rng: random.Random, refs: dict) -> list:
    """``--recipe-from FILE``: the exports read back, hand-written files, malformed files,
    unknown keys and random mutations of good ones."""
    cases = []
    hf = _dump(TINY_HF)
    base = ["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm"]
    files = refs["engine_files"]

    def add(kind, what, body, expect, name="r.cfg", extra=()):
        cases.append(Case("recipe-from", kind, what, [*base, "--recipe-from", name, *extra], expect,
                          {"c.json": hf, name: body} if body is not None else {"c.json": hf}))

    for engine, body in files.items():
        add("good", f"the {engine} export read back", body, OK)
        add("good", f"the {engine} export read back, --json", body, OK, extra=("--json",))
    add("good", "Megatron-LM arguments as a command line", b"torchrun --nproc-per-node 4 pretrain_gpt.py "
        b"--tensor-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 8 --use-distributed-optimizer "
        b"--overlap-grad-reduce --overlap-param-gather --seq-length 128\n", OK)
    add("good", "Megatron-LM's pipeline layout, stage by stage", b"--micro-batch-size 1 --global-batch-size 8 "
        b"--pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
        b"--pipeline-model-parallel-layout 'E,t|(t)*1,L'\n", OK)
    # Issue 42: Megatron's account-for flags and a layout with the embedding and the loss alone.
    add("good", "Megatron-LM's account-for-embedding/loss flags", b"--micro-batch-size 1 --global-batch-size 8 "
        b"--pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
        b"--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split\n", OK)
    add("good", "Megatron-LM's layout, the embedding and loss in chunks of their own", b"--micro-batch-size 1 "
        b"--global-batch-size 8 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce "
        b"--overlap-param-gather --pipeline-model-parallel-layout 'E|t|t|L'\n", OK)
    add("values", "Megatron-LM's account-for-loss flag alone (3 units on 2 stages)", b"--micro-batch-size 1 "
        b"--global-batch-size 8 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce "
        b"--overlap-param-gather --account-for-loss-in-pipeline-split\n", BAD_VALUE)
    add("values", "Megatron-LM's flex dispatcher without a backend", b"--micro-batch-size 1 --global-batch-size 8 "
        b"--moe-token-dispatcher-type flex\n", BAD_VALUE)
    add("good", "a torchtitan TOML by hand", HAND_TOML, OK)
    add("good", "a torchtitan 0.3 launch, options in tyro's own spelling", _launch_with(
        files["torchtitan"], "--parallelism.fsdp-reshard-after-forward=never --profiler.enable-profiling", drop=(
            "--parallelism.fsdp_reshard_after_forward always",)), OK)
    add("good", "a DeepSpeed config by hand", _dump({"train_batch_size": 8, "gradient_accumulation_steps": 2,
                                                     "zero_optimization": {"stage": 2, "overlap_comm": True}}), OK)
    for what, body in [("an empty file", b""), ("truncated JSON", b'{"train_batch_size": 8'), ("a JSON list", b"[1]"),
                       ("binary", bytes(range(256))), ("a NUL byte", b"[parallelism]\0\n"),
                       ("broken TOML", b"[parallelism\n"), ("deep JSON", b"{" + b'"a":{' * 5000 + b"}" * 5001),
                       ("an unbalanced quote", b"--micro-batch-size '1\n"),
                       ("enormous", b"#" * (2 << 20))]:
        add("malformed", what, body, BAD_FILE)
    add("malformed", "a launch with an unbalanced quote", b"#!/bin/bash\ntorchrun -m torchtitan.train --module 'x\n",
        BAD_FILE)
    add("malformed", "a shell script that runs no -m torchtitan.train", b"#!/bin/bash\necho torchtitan.train\n",
        BAD_FILE)
    add("file system", "a missing file", None, BAD_FILE, name="missing.toml")
    cases.append(Case("recipe-from", "file system", "a directory", [*base, "--recipe-from", "d"], BAD_FILE,
                      {"c.json": hf, "d": ("dir",)}))
    for what, body in [
        ("an unknown torchtitan section", b"[parallelisms]\ntensor_parallel_degree = 1\n"),
        ("an unknown torchtitan field", b"[parallelism]\ntensor_parallel_degre = 1\n"),
        ("HSDP", b"[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 2\n"),
        ("a float8 converter", b'[model]\nconverters = ["float8"]\n'),
        ("a schedule the tool does not price", b'[parallelism]\npipeline_parallel_degree = 2\n'
                                               b'pipeline_parallel_schedule = "ZBVZeroBubble"\n'),
        ("degrees over -p", b"[parallelism]\ndata_parallel_shard_degree = 8\n"),
        ("a degree of the wrong type", b'[parallelism]\ntensor_parallel_degree = "2"\n'),
        ("a batch other than -b", b"[training]\nglobal_batch_size = 16\nlocal_batch_size = 4\n"),
        ("an unknown Megatron-LM argument", b"--tensor-model-parallel-size 1 --frobnicate 3\n"),
        ("a Megatron-LM argument twice", b"--micro-batch-size 1 --micro-batch-size 2\n"),
        ("a Megatron-LM argument without its value", b"--micro-batch-size\n"),
        ("another model's --num-layers", b"--num-layers 80 --global-batch-size 8\n"),
        ("--mtp-num-layers on a model without the module", b"--mtp-num-layers 1 --micro-batch-size 1 "
         b"--global-batch-size 8\n"),
        ("a pipeline layout with the module in a middle chunk", b"--mtp-num-layers 1 --micro-batch-size 1 "
         b"--global-batch-size 8 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce "
         b"--overlap-param-gather --pipeline-model-parallel-layout 'Etm|tL'\n"),
    ] + [(f"a pipeline layout {layout}", b"--micro-batch-size 1 --global-batch-size 8 --pipeline-model-parallel-size 2 "
          b"--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
          b"--pipeline-model-parallel-layout '" + layout.encode() + b"'\n")
         for layout in ("Et|tL|", "Et|t", "tL|Et", "Et|tmL", "Et*3|tL", "E(t|t)*99999999L", "E(t*99999|)*9999L",
                        "Et*|tL", "E(t|tL", "E)t|tL", "Et|||tL", "E\u00e9t|tL", "Et*1e3|tL")] + [
        ("a pipeline layout with --decoder-first-pipeline-num-layers", b"--micro-batch-size 1 --global-batch-size 8 "
         b"--pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
         b"--decoder-first-pipeline-num-layers 1 --pipeline-model-parallel-layout 'Et|tL'\n"),
        ("an unknown DeepSpeed field", _dump({"train_batch_size": 8, "zero_optimization": {"stage": 1},
                                              "frobnicate": 1})),
        ("an unknown ZeRO field", _dump({"train_batch_size": 8, "zero_optimization": {"stage": 1, "frob": 1}})),
        ("DeepSpeed offload", _dump({"train_batch_size": 8, "zero_optimization": {
            "stage": 3, "offload_param": {"device": "cpu"}}})),
        ("a ZeRO stage 7", _dump({"train_batch_size": 8, "zero_optimization": {"stage": 7}})),
    ]:
        add("refused", what, body, BAD_VALUE)
    # torchtitan 0.3 launches it cannot price (issue 42): one line, exit 2, the export not written.
    for what, body in _bad_launches(files["torchtitan"]):
        add("refused 0.3 launch", what, body, BAD_VALUE, name="r.sh", extra=("--export-torchtitan", "out.sh"))
    cases.append(Case("recipe-from", "flags", "--recipe-from with --recipe",
                      [*base, "--recipe-from", "r.toml", "--recipe", "dp=4"], BAD_VALUE,
                      {"c.json": hf, "r.toml": files["torchtitan"]}))
    cases.append(Case("recipe-from", "flags", "--recipe-from on a graph file of another model",
                      ["-g", "alexnet", "-p", "4", "-b", "8", "--recipe-from", "r.toml"], frozenset({0, 2}),
                      {"r.toml": files["torchtitan"]}))
    # Random mutations of the good files: one value each replaced.
    import tomllib

    values = [-1, 0, 1, 3, 4, 1 << 40, "x", True, 2.5, [], {}]
    launch = files["torchtitan"].decode()
    options = re.findall(r"^  (--[a-z_.]+) (\S+) \\$", launch, flags=re.M)
    for _ in range(12):  # a launch option's value replaced
        flag, old = rng.choice(options)
        value = rng.choice(["-1", "0", "1", "3", "4", str(1 << 40), "x", "''", "None", "2.5"])
        body_m = launch.replace(f"  {flag} {old} \\", f"  {flag} {value} \\").encode()
        add("random", f"torchtitan 0.3: {flag} {value}", body_m, frozenset({0, 1, 2, 4}), name="r.sh")
    for engine, body in dict(files, torchtitan=HAND_TOML).items():
        doc = tomllib.loads(body.decode()) if engine == "torchtitan" else json.loads(body)
        tables = doc if engine != "megatron" else {"arguments": doc["arguments"]}
        for _ in range(12):
            mutated = copy.deepcopy(doc)
            section = rng.choice(sorted(k for k, v in tables.items() if isinstance(v, dict)))
            if not mutated[section]:
                continue
            key = rng.choice(sorted(mutated[section]))
            value = rng.choice(values)
            mutated[section][key] = value
            if engine == "torchtitan":
                text = "".join(f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vals.items()
                                                    if not isinstance(v, dict))
                               for sec, vals in mutated.items() if isinstance(vals, dict))
                body_m = text.encode()
            elif engine == "megatron":
                args = mutated["arguments"]
                line = " ".join(k if v is True else f"{k} {json.dumps(v) if not isinstance(v, str) else v}"
                                for k, v in args.items() if v is not False)
                body_m = _dump({"arguments": args, "command_line": line})
            else:
                body_m = _dump(mutated)
            add("random", f"{engine}: {section}.{key} = {_short(value, 20)}", body_m, frozenset({0, 1, 2, 4}))
    return cases


#: A torchtitan 0.2 job file for the tiny decoder, by hand.
HAND_TOML = (b"[parallelism]\ndata_parallel_shard_degree = 4\n[training]\nlocal_batch_size = 2\nseq_len = 128\n"
             b"[activation_checkpoint]\nmode = \"full\"\n")


def _launch_with(launch: bytes, extra: str = "", drop: tuple = (), swap: tuple = ()) -> bytes:
    """A 0.3 launch script with options ``extra`` put before its subcommand, the lines ``drop``
    removed and each ``(old, new)`` of ``swap`` replaced."""
    text = launch.decode()
    for line in drop:
        text = text.replace(f"  {line} \\\n", "")
    for old, new in swap:
        assert old in text, old
        text = text.replace(old, new)
    if extra:
        text = text.replace("  activation-checkpoint:", f"  {extra} \\\n  activation-checkpoint:")
    return text.encode()


def _bad_launches(launch: bytes) -> list:
    """``(what, body)``: torchtitan 0.3 launch scripts of the tiny decoder that ``--recipe-from``
    must refuse with one line (exit 2): each a change of the export's."""
    module = ("--module pase_torchtitan_model --config pase_model",)
    return [
        ("no --module", _launch_with(launch, swap=((module[0], "--config pase_model"),))),
        ("--module without its value", _launch_with(launch, swap=((module[0], "--module --config pase_model"),))),
        ("a config whose defaults pase does not know", _launch_with(launch, swap=(("--config pase_model",
                                                                                   "--config llama3_405b"),))),
        ("another model's config (llama3_8b)", _launch_with(launch, swap=((module[0], "--module llama3 --config "
                                                                                      "llama3_8b"),))),
        ("its module's MODEL another model", _launch_with(launch, swap=(("'layers': 2", "'layers': 3"),))),
        ("its module's MODEL not pase's", _launch_with(launch, swap=(("MODEL = {", "MODEL = dict({"),))),
        ("memory-budget recomputation", _launch_with(launch, swap=(("activation-checkpoint:none",
                                                                    "activation-checkpoint:memory-budget"),))),
        ("two recomputation subcommands", _launch_with(launch, "activation-checkpoint:full")),
        ("CUDA graphs on", _launch_with(launch, drop=("--training.disable_cuda_graphs",))),
        ("an override of torchtitan's components", _launch_with(launch, "--override.imports x.y")),
        ("a degree that is no integer", _launch_with(launch, swap=(("context_parallel_degree 1",
                                                                    "context_parallel_degree two"),))),
        ("an integer of eleven digits", _launch_with(launch, swap=(("data_parallel_shard_degree 4",
                                                                    "data_parallel_shard_degree 99999999999"),))),
        ("an option twice", _launch_with(launch, "--training.seq_len 128")),
        ("an unknown option", _launch_with(launch, "--parallelism.frobnicate 3")),
        ("an unknown section", _launch_with(launch, "--frobnicate.x 3")),
        ("context parallelism without load balancing", _launch_with(
            launch, "--parallelism.context_parallel_load_balancer None")),
        ("tensor parallelism without sequence parallelism", _launch_with(
            launch, "--parallelism.no-enable-sequence-parallel",
            swap=(("tensor_parallel_degree 1", "tensor_parallel_degree 2"),))),
        ("async tensor parallelism without compile", _launch_with(launch, "--compile.enable_async_tensor_parallel")),
        ("CPU offload", _launch_with(launch, "--training.enable_cpu_offload")),
        ("degrees over -p", _launch_with(launch, swap=(("data_parallel_shard_degree 4",
                                                        "data_parallel_shard_degree 8"),))),
        ("a batch other than -b", _launch_with(launch, swap=(("global_batch_size 8", "global_batch_size 16"),))),
        ("a sequence other than -m", _launch_with(launch, swap=(("seq_len 128", "seq_len 256"),))),
        ("a switch given a value", _launch_with(launch, swap=(("--training.disable_cuda_graphs \\",
                                                               "--training.disable_cuda_graphs yes \\"),))),
        ("a schedule the tool does not price", _launch_with(
            launch, "--parallelism.pipeline_parallel_schedule ZBVZeroBubble",
            swap=(("pipeline_parallel_degree 1", "pipeline_parallel_degree 2"),
                  ("data_parallel_shard_degree 4", "data_parallel_shard_degree 2"),
                  ("local_batch_size 2", "local_batch_size 4")))),
        ("a stray word after a switch", _launch_with(launch, "stray")),
    ]


#: Specification fields of a machine file (pase/machines/specs.py) and values each must refuse.
SPEC_BAD_VALUES = {
    "dtype_tflops": [{"fp4": 9}, {"fp8": 0}, {"fp8": -1}, {"fp8": "1"}, {"fp8": True}, {"fp8": 1e999}, [1], "fp8",
                     None, {"bf16": 10}],
    "nvlink_domain": [0, -8, 6, 3, 7.5, "72", True, None, 2 ** 40],
    "rail_optimized": ["yes", 1, 0, None, []],
    "sms": [0, -1, 1.5, "148", True, None, 2 ** 40],
    "clock_mhz": [{"turbo": 1}, {"boost": -5}, {"boost": "1980"}, {"sustained": 0}, [], 1980, None],
    "gemm_reference": ["b200", "paper", "", 1, None, "h100-sxm.json"],
    "sources": [{"sms": ""}, {"sms": 1}, ["x"], "text", None],
}
#: Recipes of the number format: (recipe, machine, expected statuses).
PRECISION_RECIPES = (
    ("precision=fp8", "h100-sxm", OK), ("precision=fp8,scaling=delayed", "h100-sxm", OK),
    ("precision=fp8,scaling=rowwise", "h100-sxm", OK), ("precision=fp8,scaling=blockwise,zero=3,fp8_gather=true",
                                                         "h100-sxm", OK),
    ("precision=bf16", "a100-sxm", OK), ("precision=mxfp8", "b200", OK), ("precision=nvfp4", "gb300-nvl72", OK),
    ("precision=search", "b300", OK), ("precision=search,scaling=blockwise", "mi300x", OK),
    ("precision=fp8", "a100-sxm", BAD_VALUE), ("precision=nvfp4", "h100-sxm", BAD_VALUE),
    ("precision=mxfp8", "mi300x", BAD_VALUE), ("precision=fp8", "paper", BAD_VALUE),
    ("precision=fp4", "h100-sxm", BAD_VALUE), ("precision=FP8", "h100-sxm", BAD_VALUE),
    ("precision=", "h100-sxm", BAD_VALUE), ("scaling=current", "h100-sxm", BAD_VALUE),
    ("precision=mxfp8,scaling=current", "b200", BAD_VALUE), ("precision=fp8,scaling=tensorwise", "h100-sxm", BAD_VALUE),
    ("precision=fp8,fp8_gather=maybe", "h100-sxm", BAD_VALUE), ("precision=fp8,precision=bf16", "h100-sxm", BAD_VALUE),
)


def hardware_cases(rng: random.Random, refs: dict) -> list:
    """Issue 31: every preset by name and as a copied file, the specification fields of machine
    files (good and bad), NVLink domains against device counts, number formats in recipes."""
    from pase.machines.calibrated import PRESETS, load_description

    cases = []
    hf = {"c.json": _dump(TINY_HF), "mini.json": _dump(mini_graph())}
    names = [n for n in PRESETS if n != "h100-sxm-nccl"]
    for name in names:
        cases.append(Case("hardware", "preset", f"preset {name} by name, training", [
            "-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", name, "--training", "--json"], OK, dict(hf),
            same_as=f"preset-{name}"))
        d = load_description(name)
        if "measured" in d:
            continue
        cases.append(Case("hardware", "preset", f"preset {name} copied to a file, training", [
            "-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "m.json", "--training", "--json"], OK,
            dict(hf, **{"m.json": _dump(dict(d))}), same_as=f"preset-{name}"))
    base = {k: v for k, v in load_description("gb200-nvl72").items() if k != "sources"}
    for spec_field, values in SPEC_BAD_VALUES.items():
        for value in values:
            data = dict(base, **{spec_field: value})
            if spec_field == "nvlink_domain" and value is None:
                data.pop(spec_field)
                expect = OK
            else:
                expect = BAD_MACHINE
            cases.append(Case("hardware", "spec field", f"{spec_field} = {_short(value)}", [
                "-g", "mini.json", "-p", "8", "--machine", "m.json"], expect, dict(hf, **{"m.json": _dump(data)})))
    for _ in range(30):  # random combinations of good and bad specification values
        data = dict(base)
        for spec_field in rng.sample(sorted(SPEC_BAD_VALUES), rng.randint(1, 3)):
            data[spec_field] = rng.choice(SPEC_BAD_VALUES[spec_field] + [base.get(spec_field, 1)])
        cases.append(Case("hardware", "random spec", _short(data, 60), [
            "-g", "mini.json", "-p", "8", "--machine", "m.json"], ANY, dict(hf, **{"m.json": _dump(data)})))
    for procs, expect in ((64, OK), (72, OK), (128, OK), (144, OK), (6, OK), (70, OK), (130, BAD_VALUE), (74, BAD_VALUE)):
        # --allow-replication: the small graph's layers cannot fill every count; the domain is checked.
        cases.append(Case("hardware", "domain", f"gb200-nvl72 with -p {procs}", [
            "-g", "mini.json", "-p", str(procs), "--machine", "gb200-nvl72", "--per-layer", "--allow-replication"],
            expect, dict(hf)))
    for recipe, machine, expect in PRECISION_RECIPES:
        cases.append(Case("hardware", "precision", f"{recipe} on {machine}", [
            "-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", machine, "--training", "--recipe", recipe],
            expect, dict(hf)))
    for machine, expect in (("b200", OK), ("a100-sxm", OK), ("h100-sxm", OK)):
        cases.append(Case("hardware", "precision", f"--search-precision on {machine}", [
            "-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", machine, "--search-precision"], expect, dict(hf)))
    cases.append(Case("hardware", "precision", "--search-precision against a fixed precision", [
        "-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "b200", "--search-precision", "--recipe",
        "precision=fp8"], BAD_VALUE, dict(hf)))
    for argv, expect in ((["machines"], OK), (["machines", "b200"], OK),
                         (["machines", "nope"], BAD_VALUE), (["machines", "a", "b"], BAD_VALUE),
                         (["machines", "--frobnicate"], BAD_VALUE)):
        cases.append(Case("hardware", "pase machines", " ".join(argv), argv, expect, {}))
    return cases


# -- Inputs declared in one line each ------------------------------------------------------------
#
# A new input of the command line joins the fuzzing with ONE LINE in one of the tables below
# (issue 35, item 8); ``declared_cases`` turns every line into its cases:
#
# - ``VALUES``: a flag's value (``--top N``, ``-m``, a recipe key such as ``precision=``): the good
#   values must be accepted, the bad ones refused (with the reason, when given), and the
#   ``HOSTILE`` values answered in one line either way.
# - ``INPUT_FILES``: a flag that reads a file (``--engine FILE``, ``--recipe-from FILE``, a
#   machine file, an ``hf:`` config of a new model type): a valid file accepted, and every
#   ``BROKEN_FILES`` variant (missing, a directory, empty, truncated, not JSON, NaN, a key twice,
#   not UTF-8, nested deep, a symlink loop) refused with the flag's status; and every output of
#   ``OUTPUT_PATHS`` aimed at the file refused, the file intact ("no file destroyed").
# - ``OUTPUT_PATHS``: a flag that writes a file (``--report PATH``, ``--export-deepspeed``): a new
#   file and a replaced one written completely, a directory, a missing directory and an empty
#   name refused, a symlink followed, and the machine file and the measured table it names
#   never overwritten.
# - ``REFUSALS``: a command that must be refused, with its reason on the one error line, within a
#   few seconds ("no hang before a no").
# - ``ACCEPTED``: a command that must succeed, with a text its output must show.
#
# ``{}`` in an ``argv`` is where the value or path goes. Files a line needs are in its ``files``
# (relative path -> bytes, as ``Case.files``); ``TINY_FILES`` has a decoder config, a small graph
# and a machine file with its measured table.


@dataclass(frozen=True)
class Value:
    argv: tuple
    good: tuple = ()
    bad: tuple = ()
    reason: str | None = None  # text every bad value's error line must contain
    refused: frozenset = BAD_VALUE
    files: tuple = ("c.json", "mini.json")


@dataclass(frozen=True)
class InputFile:
    argv: tuple
    valid: bytes
    invalid: frozenset = BAD_FILE  # the status of an unreadable or invalid file
    valid_status: frozenset = OK


@dataclass(frozen=True)
class OutputPath:
    argv: tuple
    check: str = "json"  # what a written file must be: json, dot, launch, toml or html
    files: tuple = ("c.json", "mini.json")


@dataclass(frozen=True)
class Refusal:
    argv: tuple
    reason: str
    expect: frozenset = BAD_VALUE
    within: float = 10.0  # seconds
    files: tuple = ("c.json", "mini.json")


@dataclass(frozen=True)
class Accepted:
    argv: tuple
    shows: str
    files: tuple = ("c.json", "mini.json")
    note: str | None = None  # text its stderr notes must contain
    lacks: str | None = None  # text its stdout must not contain


def _tiny_files() -> dict:
    machines = os.path.join(ROOT, "examples", "machines")
    files = {"c.json": _dump(TINY_HF), "mini.json": _dump(mini_graph())}
    with open(os.path.join(ROOT, "examples", "hf", "llama-3.1-8b.json"), "rb") as f:
        files["l31.json"] = f.read()  # torchtitan's 8B flavour: what a torchtitan 0.2 job file can name
    for name in sorted(os.listdir(machines)):
        with open(os.path.join(machines, name), "rb") as f:
            files[f"m/{name}"] = f.read()
    return files


#: The files lines may name: a decoder config, a small graph, a machine file and its table.
TINY_FILES = _tiny_files()
MACHINE_FILE = "m/h100-96gb-500w.json"
MEASURED_TABLE = "m/h100-96gb-500w-derived.json"
SEARCH = ("-g", "mini.json", "-p", "4")
TRAIN = ("-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm", "--training")
TRAIN_B200 = TRAIN[:-2] + ("b200", "--training")  # MXFP8 and NVFP4 run on Blackwell
#: A training sweep of the decoder config (issue 43): its counts after.
TRAIN_SWEEP = ("-g", "hf:c.json", "-b", "8", "--machine", "h100-sxm", "--sweep")
#: torchtitan 0.2's job files name one of its models: Llama 3.1 8B, on 8 devices with a fixed dp.
TITAN02 = ("-g", "hf:l31.json", "-p", "8", "-b", "8", "-m", "128", "--machine", "h100-sxm", "--engine",
           "torchtitan,version=0.2")
TITAN02_B200 = TITAN02[:9] + ("b200",) + TITAN02[10:]

#: Values every ``VALUES`` flag is given beside its own: one line and a documented status either way.
HOSTILE = ("", " ", "-1", "0", "1e999", "nan", "9" * 400, "\u0664", "x" * 5000, "--help", "1,2", "\n")

VALUES = {
    "-m, the sequence of a GPT graph": Value(("-g", "gpt2-small", "-p", "4", "-b", "4", "-m", "{}"),
                                             good=("16", "64", "1024"), bad=("0", "-2", "x", "1.5")),
    "--recipe, a micro-batch": Value(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe", "dp=8,microbatch={}"),
                                     good=("1", "2"), bad=("3", "5"), reason="does not divide the per-rank batch 2"),
    "--recipe, dp on batch 15": Value(("-g", "gpt2-small", "-p", "8", "-b", "15", "--recipe", "dp={}"),
                                      good=(), bad=("8", "2", "4"), reason="is not divisible by dp"),
    "--recipe, interleaved vpp": Value(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe",
                                        "pp=8,vpp={},schedule=interleaved"), bad=("5", "2"), reason="chunks"),
    "--recipe, FP8 scaling into Megatron-LM": Value((*TRAIN, "--recipe", "precision=fp8,zero=1,scaling={}", "--export-megatron",
                                                     "out.json"), good=("delayed", "current", "blockwise"), bad=("rowwise",)),
    # Issue 44: caps past a zettabyte overflowed to an infinite cap (exit 70, or no cap at all).
    "--memory": Value((*SEARCH, "--memory", "{}"), good=("1000", "1e9", "1e12"), bad=("1e13", "1e300"),
                      reason="at most 1e+12 GB"),
    "--table-budget": Value((*SEARCH, "--table-budget", "{}"), good=("1", "1e12"), bad=("1e13", "1e300"),
                            reason="at most 1e+12 GB"),
    "--recipe, FP8 scaling into torchtitan 0.2": Value((*TITAN02, "--recipe", "dp=8,precision=fp8,zero=3,scaling={}",
                                                        "--export-torchtitan", "out.toml"), good=("current", "rowwise"),
                                                       bad=("delayed", "blockwise"), files=("l31.json",)),
    "--engine, torchtitan's version": Value((*TRAIN, "--engine", "torchtitan,version={}", "--export-torchtitan", "out.sh"),
                                            good=("0.3",), bad=("0.1", "0.4", "0.3.0", "latest", "0.2,version=0.3", "")),
    # Issue 44.1: --search-precision (or precision=search) with --top crashed (exit 70).
    "--top with --search-precision": Value((*TRAIN, "--search-precision", "--top", "{}"), good=("1", "3", "50"),
                                           bad=("0", "51", "x"), reason="--top takes a whole number"),
    "--recipe precision= with --top": Value((*TRAIN_B200, "--recipe", "precision={}", "--top", "3"),
                                            good=("search", "bf16", "fp8", "mxfp8", "nvfp4"), bad=("fp4", "int8")),
    # Issue 44.6: --memory small enough that nothing fits says how many devices would (exit 4); 3 GB fits
    # once the optimizer is offloaded (issue 45).
    "--memory, nothing fits on 2": Value(("-g", "gpt2-small", "-p", "2", "-b", "16", "--machine", "h100-sxm",
                                          "--memory", "{}"), good=("100", "6.5", "3"), bad=("2.5", "0.5"),
                                         refused=frozenset({4}), reason="nothing fits"),
    # Issue 42: the pipeline's extras, the experts' dispatcher and overlaps, their engine facts.
    "--recipe, pipeline_extra": Value((*TRAIN, "--recipe", "pp=2,pipeline_extra={}"), good=("none", "embedding+loss"),
                                      bad=("embedding", "loss", "both", "EMBEDDING", "embedding,loss", ""),
                                      ),
    "--recipe, dispatcher": Value((*TRAIN, "--recipe", "dp=4,dispatcher={}"),
                                  good=("alltoall", "allgather", "deepep", "hybridep"), bad=("flex", "nccl", "DeepEP", "")),
    "--recipe, ep_overlap": Value((*TRAIN, "--recipe", "dp=4,ep_overlap={}"), good=("true", "false"),
                                  bad=("maybe", "2", "")),
    "--recipe, shared_overlap": Value((*TRAIN, "--recipe", "dp=4,shared_overlap={}"), good=("true", "false"),
                                      bad=("yes please", "-1")),
    "--engine, megatron's expert GEMMs": Value((*TRAIN, "--engine", "megatron,expert_gemm={}"),
                                               good=("grouped", "per_expert"), bad=("batched", "")),
    "--engine, megatron's dispatcher": Value((*TRAIN, "--engine", "megatron,moe_dispatcher={}"),
                                             good=("alltoall", "hybridep"), bad=("flex", "")),
    "--engine, torchtitan's TP overlap": Value((*TRAIN, "--engine", "torchtitan,tp_overlap_kind={}"),
                                               good=("symmetric_memory", "userbuffers"), bad=("async", "")),
    # Issue 43: scaling studies, and the time and cost to train.
    "--sweep, a training sweep": Value((*TRAIN_SWEEP, "{}"), good=("1,2,4", "4,2"), bad=("2,2", "0,2", "x", "2,,4")),
    "--tokens": Value((*TRAIN, "--tokens", "{}"), good=("15e12", "1", "1000000000"),
                      bad=("0", "0.5", "-5", "x", "inf", "1e20"), reason="expected a number of tokens such as 15e12"),
    "--device-hour-price": Value((*TRAIN, "--tokens", "1e9", "--device-hour-price", "{}"), good=("2.5", "0", "1e9"),
                                 bad=("-1", "nan", "x", "1e10"), reason="expected a price per device-hour such as 2.5"),
    "--days": Value((*TRAIN_SWEEP, "2,4", "--tokens", "1e9", "--days", "{}"), good=("60", "0.5", "1e6"),
                    bad=("0", "-1", "x", "inf", "1e7"), reason="expected a number of days such as 60"),
}

INPUT_FILES = {
    "--machine FILE": InputFile(("-g", "mini.json", "-p", "4", "--machine", "{}"),
                                _dump({k: v for k, v in json.loads(TINY_FILES[MACHINE_FILE]).items()
                                       if k != "measured"}), invalid=BAD_MACHINE),
    "-g hf:FILE": InputFile(("-g", "hf:{}", "-p", "4", "-b", "8"), _dump(TINY_HF)),
    "-g FILE.json": InputFile(("-g", "{}", "-p", "4"), _dump(mini_graph())),
    "--evaluate FILE": InputFile(("-g", "mini.json", "-p", "4", "--evaluate", "{}"),
                                 _dump({"configs": [[1] * 2 for _ in mini_graph()["layers"]]}),
                                 valid_status=frozenset({0, 1})),
}

OUTPUT_PATHS = {
    "--dot-path": OutputPath((*SEARCH, "--dot-path", "{}"), "dot"),
    "--export-graph": OutputPath((*SEARCH, "--export-graph", "{}")),
    "--export-megatron": OutputPath((*TRAIN, "--export-megatron", "{}")),
    "--export-torchtitan": OutputPath((*TRAIN, "--export-torchtitan", "{}"), "launch"),
    "--export-torchtitan, torchtitan 0.2": OutputPath((*TITAN02, "--recipe", "dp=8,zero=3", "--export-torchtitan", "{}"),
                                                      "toml", ("l31.json",)),
    "--export-deepspeed": OutputPath((*TRAIN, "--export-deepspeed", "{}")),
    "--dot-path of a training plan": OutputPath((*TRAIN, "--dot-path", "{}"), "dot"),
    "--export-megatron, an FP8 plan": OutputPath((*TRAIN, "--recipe", "precision=fp8,scaling=delayed,zero=1,fp8_gather=true", "--export-megatron", "{}")),
    "--export-megatron, an NVFP4 plan": OutputPath((*TRAIN_B200, "--recipe", "precision=nvfp4", "--export-megatron", "{}")),
    "--export-torchtitan, an FP8 plan": OutputPath((*TITAN02, "--recipe", "dp=8,precision=fp8,zero=3,fp8_gather=true", "--export-torchtitan", "{}"), "toml", ("l31.json",)),
    "--report, a precision search": OutputPath((*TRAIN, "--search-precision", "--report", "{}"), "html"),
    "--report, per-layer splits may win": OutputPath((*TRAIN, "--per-layer", "--report", "{}"), "html"),
    "--report": OutputPath((*TRAIN, "--report", "{}"), "html"),
    "--report of a training sweep": OutputPath((*TRAIN_SWEEP, "2,4", "--tokens", "1e9", "--days", "1", "--report", "{}"),
                                               "html"),
    "--export-torchtitan, an MXFP8 plan": OutputPath((*TITAN02_B200, "--recipe", "dp=8,precision=mxfp8,zero=3", "--export-torchtitan", "{}"), "toml", ("l31.json",)),
}

REFUSALS = {
    "a recipe's dp not dividing the batch": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "15", "--recipe", "dp=8"),
                                                    "batch 15 is not divisible by dp 8"),
    "a micro-batch not dividing the per-rank batch": Refusal(
        ("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe", "microbatch=3"), "micro-batch 3 does not divide"),
    "more chunks than blocks": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe",
                                        "pp=8,vpp=5,schedule=interleaved"), "pp 8 x vpp 5 = 40 chunks > 12 blocks"),
    # Issue 42: the extras count, so 12 + 2 units make 14 chunks at most, not 16 (pp 2 x vpp 8) ...
    "more chunks than blocks and extras": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe",
                                                   "pp=2,vpp=8,schedule=interleaved,pipeline_extra=embedding+loss"),
                                                  "16 chunks > 12 blocks + the embedding and the loss"),
    # ... and 14 units do not make 2 x 4 chunks of equal units (Megatron's even split).
    "blocks and extras not splitting evenly": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe",
                                                       "pp=2,vpp=4,schedule=interleaved,pipeline_extra=embedding+loss"),
                                                      "do not split evenly into pp 2 x vpp 4"),
    "the EP overlap on a 1F1B pipeline": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "16", "--recipe",
                                                  "pp=2,schedule=1f1b,ep_overlap=true"), "needs schedule=interleaved"),
    "--compare, a micro-batch": Refusal(("-g", "gpt2-small", "-p", "8", "-b", "16", "--compare", "pp=8,microbatch=3"),
                                        "--compare: no mesh applies to this graph: micro-batch 3"),
    "a mesh of 100,000 devices": Refusal(("-g", "llama3-8b", "-p", "100000", "-b", "128", "--machine", "h100-sxm",
                                          "--training"), "the largest usable count is 98,304", within=30.0),
    "a long search no layer fills (100,000)": Refusal(("-g", "gpt2-small", "-p", "100000", "-b", "128"),
                                                      "uses more than 98,304", within=5.0),
    "a long search no layer fills (100,000), --json": Refusal(
        ("-g", "gpt2-small", "-p", "100000", "-b", "128", "--json"), "8.46 GB of cost tables", within=5.0),
    "--mtp on a Llama config (no multi-token prediction)": Refusal(("-g", "hf:c.json", "-p", "4", "-b", "8", "--mtp"),
                                                                   "has none"),
    "an export onto the machine's measured table": Refusal(
        ("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", MACHINE_FILE, "--recipe", "dp=8",
         "--export-megatron", MEASURED_TABLE), "would overwrite the measured table", files=(MACHINE_FILE, MEASURED_TABLE)),
    "an FP8 plan into ds_config.json": Refusal((*TRAIN, "--recipe", "precision=fp8", "--export-deepspeed", "ds.json"), "no FP8 training section"),
    "NVFP4 into torchtitan 0.2": Refusal((*TRAIN_B200, "--engine", "torchtitan,version=0.2", "--recipe", "precision=nvfp4", "--export-torchtitan", "t.toml"), "no NVFP4 training converter"),
    "FP8 gathers with rowwise scaling into torchtitan 0.2": Refusal((*TRAIN, "--engine", "torchtitan,version=0.2", "--recipe", "precision=fp8,scaling=rowwise,fp8_gather=true", "--export-torchtitan", "t.toml"), "tensorwise scaling only"),
    "FP8 into torchtitan 0.3": Refusal((*TRAIN, "--recipe", "precision=fp8,zero=3", "--export-torchtitan", "t.sh"), "torchtitan 0.3 sets its low-precision converters"),
    "a model no flavour is, into torchtitan 0.2": Refusal((*TRAIN, "--engine", "torchtitan,version=0.2", "--recipe", "dp=4,zero=3", "--export-torchtitan", "t.toml"), "torchtitan 0.2's job file names one of its models"),
    "Mixtral into torchtitan": Refusal(("-g", "mixtral-8x7b", "-p", "16", "-b", "32", "-m", "64", "--machine", "h100-sxm", "--recipe", "dp=8,tp=2,ep=4,zero=3", "--export-torchtitan", "t.sh"), "torchtitan 0.3's mixture of experts the launch writes is its Qwen3 30B-A3B, and this model differs"),
    # Issue 44.3: --per-layer with a training flag lets per-layer splits win; an engine named keeps to meshes.
    "--per-layer with --engine": Refusal((*TRAIN, "--per-layer", "--engine", "torchtitan"),
                                         "--per-layer with a training flag"),
    "--per-layer with an export": Refusal((*TRAIN, "--per-layer", "--export-megatron", "m.json"), "choose one"),
    # Issue 44.6: nothing fits, and the error says how many devices would (priced).
    "nothing fits on 2 devices, 8 would": Refusal(("-g", "gpt2-small", "-p", "2", "-b", "16", "--machine", "h100-sxm",
                                                   "--memory", "2.5"), "8 devices fit it (priced: ",
                                                  expect=frozenset({4}), within=30.0),
    "--days without --sweep": Refusal((*TRAIN, "--tokens", "1e9", "--days", "3"), "--days marks the counts of a sweep"),
    "--device-hour-price without --tokens": Refusal((*TRAIN, "--device-hour-price", "2"), "give --tokens too"),
    "--days without --tokens": Refusal((*TRAIN_SWEEP, "2,4", "--days", "3"), "give --tokens too"),
    "--tokens on the per-layer search": Refusal((*SEARCH, "--tokens", "1e9"), "--tokens takes a training plan's tokens/s"),
    "--tokens on the paper machine": Refusal(("-g", "hf:c.json", "-p", "4", "-b", "8", "--training", "--tokens", "1e9"),
                                             "prices in flop-equivalents, not seconds"),
    "--tokens on a network without tokens": Refusal(("-g", "alexnet", "-p", "4", "--machine", "h100-sxm", "--tokens",
                                                     "1e9"), "has no tokens per sequence"),
    "an engine export of a training sweep": Refusal((*TRAIN_SWEEP, "2,4", "--export-megatron", "m.json"),
                                                    "--export-megatron is about one plan"),
    "the DOT graph of a training sweep": Refusal((*TRAIN_SWEEP, "2,4", "-d"), "-d/--dot-path is about one plan"),
    "FP8 gathers without ZeRO into Megatron-LM": Refusal((*TRAIN, "--recipe", "precision=fp8,zero=0,fp8_gather=true", "--export-megatron", "m.json"), "needs the distributed optimizer"),
}

ACCEPTED = {
    "--allow-replication": Accepted(("-g", "alexnet", "-p", "7", "--allow-replication"), "devices 7"),
    # Issue 43: counts no configuration fills, planned on at most p devices with a note.
    "a count no layer fills (7)": Accepted(("-g", "alexnet", "-p", "7"), "devices 7", note="uses more than 6 "),
    "rnnlm -p 12 (at most 10 used)": Accepted(("-g", "rnnlm", "-p", "12", "-b", "128", "--flops", "7", "--bw", "40"),
                                              "devices 12", note="uses more than 10 "),
    "rnnlm -p 48 (at most 40 used)": Accepted(("-g", "rnnlm", "-p", "48", "-b", "128", "--flops", "10", "--bw", "16"),
                                              "2.3049e+12", note="uses more than 40 "),
    "a sweep over counts no layer fills": Accepted(("-g", "rnnlm", "--sweep", "4,12,48,96"), "     96 ",
                                                   note="on 96 devices"),
    # Issue 44: huge caps in sane units; a real model on the paper's machine noted; implausible plans flagged.
    "--memory 1e9 (an exabyte)": Accepted((*SEARCH, "--memory", "1e9"), "fits the 1 EB cap"),
    "a Llama config without --machine": Accepted(("-g", "hf:c.json", "-p", "4", "-b", "8"), "machine paper",
                                                 note="priced on the paper's machine"),
    "a built-in LLM without --machine, a sweep": Accepted(("-g", "gpt2-small", "-b", "2", "-m", "16", "--sweep", "1,2"),
                                                          "PaSE sweep", note="priced on the paper's machine"),
    "a step of 28 days (-b 10^9)": Accepted(("-g", "gpt2-small", "--machine", "h100-sxm", "-p", "1", "-b", "1000000000",
                                             "--recipe", "microbatch=16,zero=0,recompute=none"), "WARNING: a step of"),
    "an MFU of 0.3 % (-p 1024 -b 1)": Accepted(("-g", "llama3-8b", "--machine", "h100-sxm", "-p", "1024", "-b", "1"),
                                               "WARNING: MFU 0.2"),
    "a compared recipe that does not fit": Accepted(("-g", "llama3-8b", "--machine", "h100-sxm", "-p", "8", "-b", "8",
                                                     "-m", "2048", "--memory", "60", "--compare", "dp=4,tp=2,zero=0"),
                                                    "(does NOT fit)", lacks="a tie"),
    "the mini graph on 3 devices, JSON": Accepted(("-g", "mini.json", "-p", "3", "--json"), '"procs": 3',
                                                  note="uses more than 2 "),
    # Issue 45: the three memory figures, named as PyTorch names them, in text and JSON, per stage.
    "memory figures in the text": Accepted(("-g", "gpt2-small", "--machine", "h100-sxm", "-p", "2", "-b", "4"),
                                           "reserved (max_memory_allocated / max_memory_reserved"),
    "memory figures in the JSON": Accepted(("-g", "gpt2-small", "--machine", "h100-sxm", "-p", "2", "-b", "4",
                                            "--json"), '"peak_memory_reserved_bytes"'),
    "per-stage memory figures (nanotron's cut)": Accepted(
        ("-g", "gpt2-small", "--machine", "h100-sxm", "-p", "4", "-b", "8", "--engine", "nanotron", "--json",
         "--recipe", "dp=2,pp=2,zero=1,microbatch=1,recompute=none,schedule=1f1b"), '"peak_memory_allocated_bytes"'),
    "the engine's logged figure named": Accepted(("-g", "gpt2-small", "--machine", "h100-sxm", "-p", "2", "-b", "4",
                                                  "--engine", "torchtitan"), "torchtitan's logs print reserved"),
    "stage times in the paper machine's unit": Accepted(("-g", "gpt2-small", "-p", "8", "-b", "15", "--training"),
                                                        "flop-equivalents per micro-batch"),
    "-m on a GPT graph": Accepted(("-g", "gpt2-small", "-p", "4", "-b", "4", "-m", "64"), "sequence length 64"),
    # Issue 43: a sweep on a real machine is a training sweep; the time and cost to train.
    "a training sweep": Accepted((*TRAIN_SWEEP, "1,2,4"), "PaSE training sweep"),
    "a training sweep, JSON": Accepted((*TRAIN_SWEEP, "2,4", "--json"), '"sweep": ['),
    "the per-layer sweep on a real machine": Accepted((*TRAIN_SWEEP, "2,4", "--per-layer"), "PaSE sweep:"),
    "the time and cost to train": Accepted((*TRAIN, "--tokens", "15e12", "--device-hour-price", "2.5"),
                                           "time to train 1.5e+13 tokens on 4 devices"),
    "a sweep's deadline": Accepted((*TRAIN_SWEEP, "1,2,4", "--tokens", "1e9", "--days", "1e6"), "the smallest: 1 devices"),
    "a Llama config's training plan on the paper machine": Accepted(("-g", "hf:c.json", "-p", "4", "-b", "8",
                                                                      "--training"), "flop-equivalents"),
    # Issue 44: the CLI's precision search with --top; a plan an engine runs by default, the per-layer
    # one beside it or, asked for, the plan; a tight plan losing to a tie with headroom; MFU's own peak.
    "--search-precision --top 3 on B200": Accepted((*TRAIN_B200, "--search-precision", "--top", "3"), "top 3:"),
    "--recipe precision=search --top 2": Accepted((*TRAIN, "--recipe", "precision=search", "--top", "2"), "top 2:"),
    "the default plan, the per-layer one beside": Accepted(("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine",
                                                            "h100-sxm"), "a per-layer plan no engine runs is",
                                                           lacks="not a mesh"),
    "--training --per-layer": Accepted(("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "h100-sxm",
                                        "--training", "--per-layer"), "per-layer splits (not a mesh)"),
    "--per-layer --top 2": Accepted(("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", "h100-sxm",
                                     "--per-layer", "--top", "2"), "top 2:"),
    "a tight fastest plan, a tie with headroom": Accepted(("-g", "gpt2-small", "-p", "4", "-b", "16", "--machine",
                                                           "h100-sxm", "--memory", "5.8", "--top", "3"),
                                                          "faster and a tie, but its memory band reaches"),
    "an FP8 plan's MFU against the FP8 peak": Accepted((*TRAIN, "--recipe", "precision=fp8"),
                                                       "of the fp8 peak, 1979 TFLOPS ("),
    "an NVFP4 plan's MFU against the NVFP4 peak, JSON": Accepted((*TRAIN_B200, "--recipe", "precision=nvfp4", "--json"),
                                                                 '"mfu_format": "nvfp4"'),
}

#: Broken variants of a valid JSON input file: (what, file spec).
BROKEN_FILES = (
    ("a missing file", None), ("a directory", ("dir",)), ("an empty file", b""), ("not JSON", b"not json"),
    ("a list", b"[1, 2]"), ("null", b"null"), ("NaN", b'{"x": NaN}'), ("a key twice", b'{"a": 1, "a": 2}'),
    ("not UTF-8", b'{"a": "\xff"}'), ("nested 100000 deep", b"[" * 100000), ("a symlink loop", ("symlink", "in.json")),
)


def _fill(argv: tuple, value: str) -> list:
    return [a.replace("{}", value) if "{}" in a else a for a in argv]


def _pick(names: tuple) -> dict:
    return {name: TINY_FILES[name] for name in names}


def declared_cases(rng: random.Random, refs: dict) -> list:
    cases = []
    for what, v in VALUES.items():
        files = _pick(v.files)
        for value in v.good:
            cases.append(Case("declared", "values", f"{what}: {_short(value, 20)}", _fill(v.argv, value), OK,
                              dict(files)))
        for value in v.bad:
            cases.append(Case("declared", "values", f"{what}: {_short(value, 20)} (refused)", _fill(v.argv, value),
                              v.refused, dict(files), stderr_has=v.reason))
        for value in HOSTILE:
            cases.append(Case("declared", "hostile values", f"{what}: {_short(value, 20)}", _fill(v.argv, value),
                              frozenset({0, 1, 2, 3, 4}), dict(files), refuse_within=CASE_TIMEOUT / 2))
    for what, f in INPUT_FILES.items():
        base = _pick(("c.json", "mini.json"))
        cases.append(Case("declared", "input files", f"{what}: a valid file", _fill(f.argv, "in.json"), f.valid_status,
                          dict(base, **{"in.json": f.valid})))
        for broken, spec in BROKEN_FILES:
            files = dict(base) if spec is None else dict(base, **{"in.json": spec})
            cases.append(Case("declared", "input files", f"{what}: {broken}", _fill(f.argv, "in.json"),
                              f.invalid | BAD_VALUE if broken == "a symlink loop" else f.invalid, files))
        for flag, out in OUTPUT_PATHS.items():
            # The output aimed at the input file: refused, the file intact (a failed run changes nothing).
            argv = _fill(f.argv, "in.json") + _fill(out.argv, "in.json")[len(_base_of(out.argv)):]
            cases.append(Case("declared", "no file destroyed", f"{flag} onto the {what} file", argv,
                              frozenset({1, 2}), dict(base, **{"in.json": f.valid}),
                              outputs=(("in.json", "same:in.json.orig"),)))
            cases[-1].files["in.json.orig"] = f.valid
    keep = b"previous contents\n"
    for flag, out in OUTPUT_PATHS.items():
        files = _pick(out.files)

        def add(what, target, extra_files, expect, outputs=(), extra=()):
            cases.append(Case("declared", "output paths", f"{flag}: {what}", _fill(out.argv, target) + list(extra),
                              expect, dict(files, **extra_files), outputs=outputs))

        add("a new file", "out.x", {}, OK, (("out.x", out.check),))
        add("an existing file (replaced)", "out.x", {"out.x": keep}, OK, (("out.x", out.check),))
        add("a directory", "d", {"d": ("dir",)}, BAD_FILE)
        add("a missing directory", "no/such/out.x", {}, BAD_FILE)
        add("an empty name", "", {}, frozenset({1, 2}))
        add("a symlink to an existing file (the file is written)", "link.x",
            {"real.x": keep, "link.x": ("symlink", "real.x")}, OK, (("real.x", out.check), ("link.x", "symlink")))
        machine = _pick((MACHINE_FILE, MEASURED_TABLE))
        if "--machine" not in out.argv:
            add("the machine file (refused)", MACHINE_FILE, machine, frozenset({1, 2}), extra=("--machine", MACHINE_FILE))
            add("the measured table the machine file names (refused)", MEASURED_TABLE, machine, frozenset({1, 2}),
                extra=("--machine", MACHINE_FILE))
            add("a symlink to that measured table (refused)", "t.json", dict(machine, **{"t.json": (
                "symlink", MEASURED_TABLE)}), frozenset({1, 2}), extra=("--machine", MACHINE_FILE))
    for what, r in REFUSALS.items():
        cases.append(Case("declared", "refusals", what, list(r.argv), r.expect, _pick(r.files), stderr_has=r.reason,
                          refuse_within=r.within))
    for what, a in ACCEPTED.items():
        cases.append(Case("declared", "accepted", what, list(a.argv), OK, _pick(a.files), stdout_has=a.shows,
                          notes_have=a.note, stdout_lacks=a.lacks))
    return cases


def _base_of(argv: tuple) -> tuple:
    """The part of an output line's command before its flag (the ``{}`` path's flag)."""
    i = next(i for i, a in enumerate(argv) if "{}" in a)
    return argv[:i - 1]


#: A runs file ``pase calibrate --from-runs`` fits (gpt2-small on 8 devices, six layouts).
GOOD_RUNS = [{"name": f"g{i}", "graph": "gpt2-small", "devices": 8, "batch": 32, "recipe": recipe, "step_seconds": step}
             for i, (recipe, step) in enumerate([("dp=8,zero=1,microbatch=4", 0.030), ("dp=8,zero=1,microbatch=1", 0.040),
                                                 ("dp=4,tp=2,zero=1,microbatch=2", 0.045),
                                                 ("dp=2,tp=4,zero=0,microbatch=4", 0.05),
                                                 ("dp=8,zero=0,microbatch=2", 0.033),
                                                 ("dp=2,tp=2,pp=2,zero=1,microbatch=1", 0.09)])]


def runs_cases(rng: random.Random, refs: dict) -> list:
    """``pase calibrate --from-runs``: a good runs file (exit 0, the fitted file written), every
    field and file broken one way (exit 2, one line, nothing written), random mutations."""
    cases = []
    good = _dump(GOOD_RUNS)

    def add(kind, what, content, expect, machine="h100-sxm", out="fit.json", name="runs.json", extra=()):
        argv = ["calibrate", "--from-runs", name, "--machine", machine, "--out", out, *extra]
        cases.append(Case("runs", kind, what, argv, expect, {name: content},
                          outputs=((out, "json"),) if expect == OK else ()))

    add("good", "six gpt2-small layouts", good, OK)
    add("good", "the same as CSV", ("name,graph,devices,batch,recipe,step_seconds\n" + "".join(
        f'{r["name"]},{r["graph"]},{r["devices"]},{r["batch"]},"{r["recipe"]}",{r["step_seconds"]}\n'
        for r in GOOD_RUNS)).encode(), OK, name="runs.csv")
    add("good", "--json", good, OK, extra=("--json",))
    broken = [
        (b"{not json", "not JSON"), (b"[]", "no runs"), (b"{}", "an object without runs"), (b"[1, 2]", "not objects"),
        (b"\xff\xfe", "not UTF-8"),
        (_dump([{**GOOD_RUNS[0], "colour": 1}] + GOOD_RUNS[1:]), "an unknown field"),
        (_dump([{k: v for k, v in GOOD_RUNS[0].items() if k != "graph"}] + GOOD_RUNS[1:]), "a missing graph"),
        (_dump([{**GOOD_RUNS[0], "devices": -8}] + GOOD_RUNS[1:]), "negative devices"),
        (_dump([{**GOOD_RUNS[0], "batch": 1e400 if False else 10 ** 400}] + GOOD_RUNS[1:]), "a huge batch"),
        (_dump([{**GOOD_RUNS[0], "step_seconds": 0}] + GOOD_RUNS[1:]), "a zero step"),
        (_dump([{**GOOD_RUNS[0], "tokens_per_second_per_device": 5.0}] + GOOD_RUNS[1:]), "both speeds"),
        (_dump([{**GOOD_RUNS[0], "memory": "smi", "peak_memory_gib": 3}] + GOOD_RUNS[1:]), "an unknown memory figure"),
        (_dump(GOOD_RUNS + [GOOD_RUNS[0]]), "a name twice"),
        (_dump([{**GOOD_RUNS[0], "recipe": "dp=3"}] + GOOD_RUNS[1:]), "a recipe no mesh meets"),
        (_dump([{**GOOD_RUNS[0], "graph": "no-such-graph"}] + GOOD_RUNS[1:]), "an unknown graph"),
        (_dump(GOOD_RUNS[:2]), "too few runs for the constants"),
        (_dump([dict(GOOD_RUNS[0], name=f"t{i}") for i in range(6)]), "six runs of one layout"),
    ]
    for content, why in broken:
        add("bad", why, content, BAD_VALUE)
    add("bad", "the paper's machine", good, BAD_VALUE, machine="paper")
    add("bad", "an unknown machine", good, BAD_VALUE, machine="tpu-v9")
    add("bad", "--out not .json", good, BAD_VALUE, out="fit.txt")
    add("bad", "--out the runs file itself", good, frozenset({1, 2}), out="runs.json")
    for _ in range(20):
        data = json.loads(json.dumps(GOOD_RUNS))
        run = rng.choice(data)
        key = rng.choice(list(run))
        run[key] = rng.choice(PALETTE)
        add("random", f"run {run.get('name')!r:.10}: {key} = {_short(run[key], 20)}", _dump(data), frozenset({0, 2}))
    return cases


CATEGORIES = {
    "graph": (graph_cases, "graph files (`-g FILE.json`)"),
    "machine": (machine_cases, "machine files (`--machine FILE.json`) and their measured tables"),
    "strategy": (strategy_cases, "strategy files (`--evaluate FILE`, `--evaluate -`)"),
    "factory": (factory_cases, "model factories (`-g torch:...`), without and with PyTorch"),
    "output": (output_cases, "output paths (`--dot-path`, `-d`, `--export-graph`, `--export-jax`, "
                             "`pase calibrate --out`)"),
    "hf": (hf_cases, "Hugging Face configs (`-g hf:FILE.json`)"),
    "recipe": (recipe_cases, "training recipes (`--training --recipe ...`)"),
    "engine": (engine_cases, "engine exports (`--export-torchtitan`, `--export-megatron`, `--export-deepspeed`)"),
    "recipe-from": (recipe_from_cases, "engine files read back (`--recipe-from FILE`)"),
    "hardware": (hardware_cases, "machine presets, specification fields, NVLink domains and number formats "
                                 "(issue 31)"),
    "process": (process_cases, "real processes (`python3 scheduler.py`): exit status, streams, hash seeds"),
    "runs": (runs_cases, "measured runs (`pase calibrate --from-runs RUNS --machine M --out FITTED.json`)"),
    "declared": (declared_cases, "inputs declared one line each (`VALUES`, `INPUT_FILES`, `OUTPUT_PATHS`, "
                                 "`REFUSALS`, `ACCEPTED`): issue 35's and those added after it"),
}


# ---------------------------------------------------------------------------------------
# Reference artifacts (computed in this process, before the cases)


def references() -> dict:
    from pase.machines.calibrated import PRESETS
    from pase.cli import main

    def run_json(argv, cwd=None):
        out, err = io.StringIO(), io.StringIO()
        old = os.getcwd()
        if cwd:
            os.chdir(cwd)
        try:
            status = main(argv, stdout=out, stderr=err)
        finally:
            os.chdir(old)
        if status != 0:
            raise RuntimeError(f"reference run {argv} failed: {err.getvalue()}")
        return out.getvalue()

    refs = {"exported": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("alexnet", "transformer", "gpt2-small", "llama3-8b", "inception3", "rnnlm"):
            path = os.path.join(tmp, f"{name}.json")
            run_json(["-g", name, "-p", "1", "-b", "8", "--export-graph", path])
            with open(path, "rb") as f:
                refs["exported"][name] = f.read()
        refs["plan"] = json.loads(run_json(["-g", "alexnet", "-p", "4", "-b", "8", "--json"]))
        refs["sweep_lines"] = run_json(["-g", "alexnet", "-b", "8", "--sweep", "2,4", "--json"])
        with open(os.path.join(tmp, "mini.json"), "wb") as f:
            f.write(_dump(mini_graph()))
        refs["mini_plan"] = json.loads(run_json(["-g", "mini.json", "-p", "4", "--json"], cwd=tmp))
        box = {k: v for k, v in PRESETS["h100-sxm"].items() if k != "measured"}
        box["name"] = "box"
        refs["box"] = box
        for key, description in (("box", box), ("fake", dict(box, name="h100-sxm"))):
            with open(os.path.join(tmp, f"{key}.json"), "wb") as f:
                f.write(_dump(description))
            # Per-layer plans (--per-layer: on a real machine the training plan is the default).
            refs[f"{key}_plan"] = json.loads(run_json(["-g", "alexnet", "-p", "8", "-b", "8", "--machine", f"{key}.json",
                                                       "--per-layer", "--json"], cwd=tmp))
        refs["h100_plan"] = json.loads(run_json(["-g", "alexnet", "-p", "8", "-b", "8", "--machine", "h100-sxm",
                                                 "--per-layer", "--json"]))
        # One export per engine of a tiny decoder, read back by the --recipe-from cases.
        with open(os.path.join(tmp, "c.json"), "wb") as f:
            f.write(_dump(TINY_HF))
        refs["engine_files"] = {}
        for engine, flag, recipe in (("torchtitan", "--export-torchtitan", "dp=4,zero=3"),
                                     ("megatron", "--export-megatron", "dp=2,tp=2,zero=1"),
                                     ("deepspeed", "--export-deepspeed", "dp=4,zero=1")):
            run_json(["-g", "hf:c.json", "-p", "4", "-b", "8", "--machine", "h100-sxm", "--recipe", recipe, flag,
                      f"{engine}.out"], cwd=tmp)
            with open(os.path.join(tmp, f"{engine}.out"), "rb") as f:
                refs["engine_files"][engine] = f.read()
    return refs


# ---------------------------------------------------------------------------------------
# Setting up a case's files, and looking at them afterwards


def _can_make_immutable() -> bool:
    """Whether ``chattr +i`` works here (root, a file system that supports it)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe")
        open(path, "w").close()
        try:
            made = subprocess.run(["chattr", "+i", path], capture_output=True, check=False).returncode == 0
        except OSError:
            return False
        if made:
            subprocess.run(["chattr", "-i", path], capture_output=True, check=False)
        return made


def make_files(directory: str, files: dict) -> None:
    os.makedirs(directory, exist_ok=True)
    for rel, spec in files.items():
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(spec, bytes):
            with open(path, "wb") as f:
                f.write(spec)
        elif spec[0] == "dir":
            os.makedirs(path, exist_ok=True)
        elif spec[0] == "symlink":
            os.symlink(spec[1], path)
        elif spec[0] == "device":
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(spec[1], spec[2]))
        elif spec[0] == "mode":
            with open(path, "wb") as f:
                f.write(spec[1])
            os.chmod(path, spec[2])
        elif spec[0] == "dirmode":
            os.makedirs(path, exist_ok=True)
            os.chmod(path, spec[1])
        elif spec[0] in ("immutable", "immutable-dir"):
            if spec[0] == "immutable":
                with open(path, "wb") as f:
                    f.write(spec[1])
            else:
                os.makedirs(path, exist_ok=True)
            subprocess.run(["chattr", "+i", path], check=True, capture_output=True)
        else:
            raise ValueError(spec)


def snapshot(directory: str) -> dict:
    """Every entry under ``directory``: its type, and a digest of regular files."""
    entries = {}
    for base, dirs, names in os.walk(directory):
        for name in sorted(dirs + names):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, directory)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = "dir"
            elif stat.S_ISCHR(st.st_mode):
                entries[rel] = f"chr:{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                entries[rel] = "file:" + h.hexdigest()[:16]
            else:
                entries[rel] = "other"
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(base, d))]
    return entries


# ---------------------------------------------------------------------------------------
# The worker: runs cases in-process, one after another, and reports each as a JSON line


class _Timeout(BaseException):
    """A case ran past its time (a BaseException, so that no ``except Exception`` takes it)."""


def _on_alarm(signum, frame):
    raise _Timeout()


def run_in_process(case: dict, timeout: int) -> dict:
    from pase.cli import main

    os.chdir(case["directory"])
    out, err = io.StringIO(), io.StringIO()
    stray = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(case["stdin"]) if case["stdin"] is not None else io.StringIO("")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stray.fileno(), 1)
    os.dup2(stray.fileno(), 2)
    result = {"index": case["index"], "status": None, "escaped": None, "timed_out": False}
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout)
    try:
        result["status"] = main(case["argv"], stdout=out, stderr=err)
    except _Timeout:
        result["timed_out"] = True
    except BaseException as error:  # noqa: BLE001  (SystemExit, KeyboardInterrupt...: all failures)
        result["escaped"] = f"{type(error).__name__}: {_short(str(error), 200)}"
    finally:
        signal.alarm(0)
        result["seconds"] = time.perf_counter() - start
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sys.stdin = old_stdin
        os.chdir(ROOT)
    stray.seek(0)
    result["stray"] = stray.read(4000).decode("utf-8", "replace")
    result["stdout"] = out.getvalue()
    result["stderr"] = err.getvalue()
    return result


def worker_main(case_file: str, result_file: str, start: int, timeout: int, limit_memory: bool) -> None:
    if os.environ.get("PASE_FUZZ_HIDE_TORCH") == "1":
        sys.modules["torch"] = None  # import torch fails, find_spec("torch") is None: a Python without it
    if limit_memory:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    with open(case_file) as f:
        cases = json.load(f)
    with open(result_file, "a") as results:
        for case in cases[start:]:
            result = run_in_process(case, timeout)
            result["after"] = snapshot(case["directory"])
            results.write(json.dumps(result) + "\n")
            results.flush()


# ---------------------------------------------------------------------------------------
# The driver


def run_workers(cases: list, python: str, work: str, timeout: int, log, tag: str = "system") -> dict:
    """Run ``cases`` in-process in worker processes; restart after a crash. ``index -> result``.

    ``tag`` "system": the cases of a Python without PyTorch (torch hidden where it is installed),
    under the worker memory limit; "torch": the PyTorch cases.
    """
    if not cases:
        return {}
    case_file = os.path.join(work, f"cases-{tag}.json")
    result_file = os.path.join(work, f"results-{tag}.jsonl")
    payload = [{"index": c.index, "argv": c.argv, "stdin": c.stdin, "directory": c.directory} for c in cases]
    with open(case_file, "w") as f:
        json.dump(payload, f)
    open(result_file, "w").close()
    results: dict = {}
    start = 0
    env = dict(os.environ, PYTHONPATH=ROOT, PASE_FUZZ_HIDE_TORCH="1" if tag == "system" else "0")
    env.pop("PASE_TRACEBACK", None)
    while start < len(cases):
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--worker", case_file, result_file, str(start), str(timeout),
             "1" if tag == "system" else "0"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
            timeout=timeout * (len(cases) - start) + 120)
        with open(result_file) as f:
            for line in f:
                record = json.loads(line)
                results[record["index"]] = record
        done = sum(1 for c in cases if c.index in results)
        if done < len(cases):
            crashed = next(c for c in cases if c.index not in results)
            results[crashed.index] = {"index": crashed.index, "status": None, "escaped": None, "timed_out": False,
                                      "crashed": f"worker exit {proc.returncode}: {_short(proc.stderr.strip(), 300)}",
                                      "stdout": "", "stderr": "", "stray": "", "seconds": 0.0,
                                      "after": snapshot(crashed.directory)}
            log(f"  worker died on case {crashed.index} ({crashed.what}); restarting")
            with open(result_file, "a") as f:
                f.write(json.dumps(results[crashed.index]) + "\n")
            start = cases.index(crashed) + 1
        else:
            break
    return results


def run_process_case(case: Case, timeout: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, **case.env)
    env.pop("PASE_TRACEBACK", None)
    stdin = case.stdin.encode("utf-8", "surrogateescape") if case.stdin is not None else b""
    stdout = open(os.path.join(case.directory, case.stdout_file), "wb") if case.stdout_file else subprocess.PIPE
    start = time.perf_counter()
    try:
        if case.close_stdin:
            proc = subprocess.run([sys.executable, os.path.join(ROOT, "scheduler.py"), *case.argv],
                                  cwd=case.directory, env=env, stdin=None, stdout=stdout, stderr=subprocess.PIPE,
                                  timeout=timeout, check=False, preexec_fn=lambda: os.close(0))
        else:
            proc = subprocess.run([sys.executable, os.path.join(ROOT, "scheduler.py"), *case.argv],
                                  cwd=case.directory, env=env, input=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                  timeout=timeout, check=False)
        status, timed_out = proc.returncode, False
        out = proc.stdout.decode("utf-8", "replace") if proc.stdout is not None else ""
        err = proc.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        status, timed_out, out, err = None, True, "", ""
    finally:
        if case.stdout_file:
            stdout.close()
    return {"index": case.index, "status": status, "escaped": None, "timed_out": timed_out, "stdout": out,
            "stderr": err, "stray": "", "seconds": time.perf_counter() - start, "after": snapshot(case.directory)}


def check(case: Case, result: dict, before: dict, timeout: int = CASE_TIMEOUT) -> list:
    """The rules a case broke (empty: it passed)."""
    problems = []
    status = result["status"]
    if result.get("crashed"):
        return [f"the worker process died ({result['crashed']})"]
    if result["timed_out"]:
        return [f"no answer within {timeout} s (a hang)"]
    if result["escaped"]:
        return [f"an exception escaped main(): {result['escaped']}"]
    err_lines = [line for line in result["stderr"].splitlines() if line.strip()]
    if "Traceback" in result["stderr"] or "Traceback" in result["stray"]:
        problems.append("a traceback")
    if status == 70 or any("internal error" in line for line in err_lines):
        problems.append("internal error (exit 70)")
    elif status not in DOCUMENTED:
        problems.append(f"undocumented exit status {status}")
    elif status not in case.expect:
        problems.append(f"exit {status}, expected {' or '.join(str(s) for s in sorted(case.expect))}")
    if result["stray"].strip():
        problems.append(f"output outside the given streams: {_short(result['stray'].strip(), 120)}")
    prog = {"calibrate": "pase calibrate", "machines": "pase machines"}.get(case.argv[0] if case.argv else "", "pase")
    if status not in (0, None) and status != 70:
        errors = [line for line in err_lines if not line.startswith(f"{prog}: note:")]
        if len(errors) != 1 or not (errors[0].startswith(f"{prog}: error: ") or errors[0] == f"{prog}: interrupted"):
            problems.append(f"stderr is not one error line: {_short(result['stderr'], 200)}")
        if result["stdout"].strip() and "--sweep" not in case.argv:
            problems.append(f"output on stdout although it failed: {_short(result['stdout'], 80)}")
        if result["after"] != before:
            problems.append(f"the failed run changed files: {_changes(before, result['after'])}")
        if case.stderr_has and case.stderr_has not in result["stderr"]:
            problems.append(f"the error line lacks its reason {case.stderr_has!r}: {_short(result['stderr'], 160)}")
        if case.refuse_within is not None and result.get("seconds", 0.0) > case.refuse_within:
            problems.append(f"refused after {result['seconds']:.1f} s, more than {case.refuse_within:g} s")
    if status == 0:
        bad = [line for line in err_lines if not line.startswith(f"{prog}: note:")]
        if bad:
            problems.append(f"stderr on success: {_short(bad[0], 120)}")
        if not result["stdout"].strip():
            problems.append("nothing on stdout")
        if case.stdout_has and case.stdout_has not in result["stdout"]:
            problems.append(f"stdout lacks {case.stdout_has!r}")
        if case.stdout_lacks and case.stdout_lacks in result["stdout"]:
            problems.append(f"stdout has {case.stdout_lacks!r}")
        if case.notes_have and case.notes_have not in result["stderr"]:
            problems.append(f"no note says {case.notes_have!r}: {_short(result['stderr'], 160)}")
        problems += _numbers(case, result["stdout"])
    problems += _check_outputs(case, result, before)
    leftovers = [p for p in result["after"] if re.search(r"(^|/)\.[^/]*\.tmp$", p)]
    if leftovers:
        problems.append(f"temporary files left behind: {leftovers}")
    return problems


def _changes(before: dict, after: dict) -> str:
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return ", ".join(f"{k} ({before.get(k, 'absent')} -> {after.get(k, 'absent')})" for k in changed[:4])


def _numbers(case: Case, stdout: str) -> list:
    if "--json" in case.argv:
        try:
            records = _json_records(stdout, "--sweep" in case.argv)
        except ValueError as error:
            return [f"--json output is not JSON: {error}"]
        for record in records:
            # A training plan reports its step; a strategy, its total cost; a fit its constants.
            if "fitted" in record:
                total = record["fitted"].get("compute_efficiency")
            else:
                total = record["training"].get("step_cost") if isinstance(record.get("training"), dict) \
                    else record.get("total_cost")
            if not isinstance(total, (int, float)) or not math.isfinite(total) or total < 0:
                return [f"total_cost is {total!r}"]
        return []
    if re.search(r"\b(nan|inf|-inf)\b", stdout, re.IGNORECASE):
        return ["nan or inf in the table"]
    return []


def _json_records(stdout: str, sweep: bool) -> list:
    """The plans of a ``--json`` output: one object; a per-layer sweep's, one per line; a training
    sweep's (one object, issue 43), each count's that has a plan."""
    if not sweep:
        return [json.loads(stdout)]
    try:
        whole = json.loads(stdout)
    except ValueError:
        return [json.loads(line) for line in stdout.splitlines() if line.strip()]
    if not isinstance(whole, dict) or not isinstance(whole.get("sweep"), list):
        return [whole]
    return [entry for entry in whole["sweep"] if entry.get("training") is not None]


def _launch_problems(rel: str, body: bytes) -> list:
    """A torchtitan 0.3 launch script written completely: a bash script whose torchrun line runs
    -m torchtitan.train, its arguments split by the shell's rules, the subcommand last."""
    import shlex

    try:
        text = body.decode()
        line = next(x for x in text.replace("\\\n", " ").splitlines()
                    if "-m torchtitan.train" in x and not x.startswith("#"))
        tokens = shlex.split(line)
    except (UnicodeDecodeError, StopIteration, ValueError) as error:
        return [f"{rel} is not a torchtitan launch script ({type(error).__name__})"]
    if not text.startswith("#!/usr/bin/env bash\n") or not tokens[-1].startswith("activation-checkpoint:"):
        return [f"{rel} is not a complete torchtitan launch script"]
    return []


def _check_outputs(case: Case, result: dict, before: dict) -> list:
    problems = []
    for rel, kind in case.outputs:
        path = os.path.join(case.directory, rel)
        entry = result["after"].get(rel)
        if kind == "device":
            if entry is None or not entry.startswith("chr:"):
                problems.append(f"{rel} was a device and is now {entry}")
            continue
        if kind == "symlink":
            if entry is None or not entry.startswith("link:"):
                problems.append(f"{rel} was a symlink and is now {entry}")
            continue
        if result["status"] != 0:
            continue
        if entry is None:
            problems.append(f"{rel} was not written")
            continue
        try:
            with open(path, "rb") as f:
                body = f.read()
        except OSError as error:
            problems.append(f"{rel} cannot be read back: {error}")
            continue
        if kind == "json":
            try:
                json.loads(body)
            except ValueError:
                problems.append(f"{rel} is not complete JSON")
        elif kind == "html":
            if not (body.startswith(b"<!DOCTYPE html>") and body.rstrip().endswith(b"</html>")):
                problems.append(f"{rel} is not a complete HTML page")
        elif kind == "launch":
            problems += _launch_problems(rel, body)
        elif kind == "html":
            if not (body.startswith(b"<!DOCTYPE html>") and body.rstrip().endswith(b"</html>")):
                problems.append(f"{rel} is not a complete HTML page")
        elif kind == "toml":
            import tomllib

            try:
                tomllib.loads(body.decode())
            except (ValueError, UnicodeDecodeError):
                problems.append(f"{rel} is not complete TOML")
        elif kind == "dot":
            import pydot

            try:
                parsed = pydot.graph_from_dot_data(body.decode())
            except Exception as error:  # noqa: BLE001  (pydot raises what its parser raises)
                parsed, problems_text = None, f"{type(error).__name__}: {error}"
            else:
                problems_text = "no graph"
            if not parsed:
                problems.append(f"{rel} is not a DOT graph pydot reads ({_short(problems_text, 80)})")
        elif kind.startswith("same:"):
            with open(os.path.join(case.directory, kind[5:]), "rb") as f:
                if f.read() != body:
                    problems.append(f"{rel} differs from {kind[5:]}")
    return problems


def check_groups(cases: list, results: dict) -> dict:
    """``index -> problem`` for the cases whose total differs from their group's."""
    groups: dict = {}
    for c in cases:
        if c.same_as and c.index in results and results[c.index]["status"] == 0:
            try:
                total = json.loads(results[c.index]["stdout"])["total_cost"]
            except (ValueError, KeyError, TypeError):
                continue
            groups.setdefault(c.same_as, []).append((c, total))
    problems = {}
    for name, members in groups.items():
        first_case, first = members[0]
        for c, total in members[1:]:
            if not math.isclose(total, first, rel_tol=1e-12, abs_tol=0.0):
                problems[c.index] = (f"total {total!r} differs from {first!r} of '{first_case.what}' "
                                     f"(group {name})")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=14, help="seed of the random choices (default 14)")
    parser.add_argument("--only", default=None, help=f"comma-separated categories: {', '.join(CATEGORIES)}")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="results directory")
    parser.add_argument("--timeout", type=int, default=CASE_TIMEOUT, help="seconds per case before it is a hang")
    parser.add_argument("--keep", action="store_true", help="keep the case directories (printed)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(CATEGORIES)
    unknown = only - set(CATEGORIES)
    if unknown:
        parser.error(f"unknown categories: {', '.join(sorted(unknown))}")

    def log(text):
        print(text, file=sys.stderr, flush=True)

    started = time.perf_counter()
    log("computing the reference plans and graph files...")
    refs = references()
    cases = []
    for name, (generate, _) in CATEGORIES.items():
        if name in only:
            cases += generate(random.Random(f"{args.seed}:{name}"), refs)
    work = tempfile.mkdtemp(prefix="pase-fuzz-")
    for i, case in enumerate(cases):
        case.index = i
        case.directory = os.path.join(work, f"case{i:04d}")
        if case.skip is None:
            make_files(case.directory, case.files)
    before = {c.index: snapshot(c.directory) for c in cases if c.skip is None}
    log(f"{len(cases)} cases in {work}")

    results: dict = {}
    in_process = [c for c in cases if c.skip is None and not c.process]
    for python in ("system", "torch"):
        batch = [c for c in in_process if c.python == python]
        interpreter = sys.executable if python == "system" else TORCH_PYTHON
        log(f"running {len(batch)} in-process cases ({python} Python)...")
        results.update(run_workers(batch, interpreter, work, args.timeout, log, tag=python))
    processes = [c for c in cases if c.skip is None and c.process]
    log(f"running {len(processes)} process cases...")
    for c in processes:
        results[c.index] = run_process_case(c, max(60, args.timeout))
    problems = {c.index: check(c, results[c.index], before[c.index], args.timeout) for c in cases if c.index in results}
    for index, problem in check_groups(cases, results).items():
        problems[index].append(problem)
    hashed = [c for c in processes if c.same_as == "hashseed"]
    if len(hashed) == 2:
        a, b = (_without_seconds(results[c.index]["stdout"]) for c in hashed)
        if a != b:
            problems[hashed[1].index].append("output differs between PYTHONHASHSEED values")

    # The real /dev/full, /dev/null and /dev/stdout, once the copies of devices and the
    # symlinks showed that they are written through (a tool that renamed a file onto its
    # output would replace the system's device or link itself).
    guarded = [c for c in cases if c.skip == "guarded"]
    copies = [c for c in cases if c.category == "output" and ("device" in c.what or "symlink" in c.what)]
    safe = bool(copies) and all(c.index in problems and not problems[c.index] for c in copies)
    system = {"/dev/full": "chr", "/dev/null": "chr", "/dev/stdout": "link"}
    kinds = {path: _kind(path) for path in system}
    for c in guarded:
        if safe and all(kinds[path] == kind for path, kind in system.items()):
            c.skip = None
            make_files(c.directory, c.files)
            before[c.index] = snapshot(c.directory)
            res = (run_process_case(c, max(60, args.timeout)) if c.process
                   else run_workers([c], sys.executable, work, args.timeout, log, tag="system")[c.index])
            results[c.index] = res
            problems[c.index] = check(c, res, before[c.index], args.timeout)
            for path, kind in system.items():
                if _kind(path) != kind:
                    problems[c.index].append(f"{path} is no longer a {kind}")
        else:
            c.skip = "the copies of devices and symlinks were not written through, so the system's are not risked"

    elapsed = time.perf_counter() - started
    report = render(cases, results, problems, args, elapsed)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fuzz_inputs.md")
    with open(path, "w") as f:
        f.write(report)
    failed = [c for c in cases if problems.get(c.index)]
    log(f"{len(results)} cases run in {elapsed:.0f} s, {len(failed)} failed; report: {path}")
    for c in failed:
        log(f"  FAIL [{c.category}/{c.kind}] {c.what}: {'; '.join(problems[c.index])}")
    if args.keep:
        log(f"case directories kept in {work}")
    else:
        for c in cases:
            for rel, spec in c.files.items():
                if isinstance(spec, tuple) and spec[0] in ("immutable", "immutable-dir"):
                    subprocess.run(["chattr", "-i", os.path.join(c.directory, rel)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def _kind(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    return "link" if stat.S_ISLNK(mode) else "chr" if stat.S_ISCHR(mode) else "other"


def _without_seconds(stdout: str) -> str:
    try:
        data = json.loads(stdout)
    except ValueError:
        return stdout
    data.get("search", {}).pop("seconds", None)
    return json.dumps(data, sort_keys=True)


#: What this driver found on ``main`` at daa9ad8, before the fixes of branch ``fuzz`` (seed 14,
#: 10 s per case): 249 of 1602 cases failed. One line per defect: the inputs, what happened,
#: the module fixed; each has a test in ``tests/test_fuzz_regressions.py``.
FOUND = [
    ("output", "--dot-path/--export-graph/--export-jax on a device (a copy of /dev/full or /dev/null)",
     "the device node was replaced by a regular file holding the output, exit 0", "fileio"),
    ("output", "the same on a symlink / a dangling symlink / a symlink loop",
     "the link was replaced by a new file, the file it named kept its old contents; a loop gave exit 0", "fileio"),
    ("output", "a NUL byte in an output path or --evaluate path (in-process)", "internal error (exit 70)", "fileio"),
    ("strategy", "--evaluate - with standard input closed (pase --evaluate - <&-)", "internal error (exit 70)",
     "fileio"),
    ("graph", "a misspelt or unknown field ('params' for 'param', 'arg' for 'args', any extra key)",
     "silently ignored, exit 0: a weight counted as an activation, a layer built with default arguments",
     "graph_json"),
    ("graph", "a dimension or count of 2**53 to 10**400 (input shape, FC units, Embedding vocab)",
     "a hang: every divisor enumerated, sqrt(size) steps (a batch of 2**53 took 28 s in the data-parallel "
     "baseline alone)", "configs, baselines, graph_json"),
    ("graph", "an input of more than 2**200 elements (rank 30, dims 2**40)",
     "internal error (OverflowError) and numpy warnings on stderr", "graph_json"),
    ("graph", "an Unstack along an axis of 10**8, 2**40, 10**30",
     "a hang (10**8 tensors), out of memory (exit 3), internal error (exit 70)", "layers"),
    ("graph", "FC or Embedding letters false, 0 or []", "taken as 'no letters given', exit 0", "layers"),
    ("machine", "memory_gb 1e300, a rate of 5e-324, devices_per_node 10**30, any number of 400 digits",
     "internal error (overflow to infinity, OverflowError), numpy warnings on stderr", "calibrated"),
    ("machine", "a measured table with a size or time of 10**400", "internal error (exit 70)", "measured"),
    ("machine", "a measured table of 40 rows on the diagonal (a 40**4 grid of holes), or 200000 made-up op names",
     "a hang (the grid's holes filled pass by pass); a misspelt op joined the ops that price the others", "measured"),
    ("strategy", "the plan of a graph file (-g FILE.json --json), evaluated with -g FILE.json",
     "refused: \"invalid 'graph'\" (plans of graph files and imported models could not be evaluated)", "cli"),
    ("strategy", "a plan priced on a machine file, evaluated without --machine",
     "priced on the paper machine, or on the preset when the file reused its name, exit 0, no word", "cli"),
    ("strategy", "a split of 10**400", "internal error (exit 70)", "planner"),
    ("factory", "a factory calling sys.exit() at import or in the function, torch:sys:exit, GeneratorExit, "
     "sys.exit() in the model's forward", "SystemExit escaped main(): the process ended with the factory's status "
     "(0 and no output for sys.exit(0))", "torch_import"),
    ("factory", "a model torch.export cannot trace (a shape mismatch)",
     "torch logged a 20-line traceback on stderr before the error line", "torch_import"),
    ("factory", "a factory path naming a directory", "'file ... does not exist'", "torch_import"),
    # The training-configuration turn (issue 25's last point): categories hf, recipe, engine.
    ("hf", "an hf config with num_hidden_layers 1000000", "no answer within 30 s (building 17 million layers)",
     "graphs.decoder (MAX_LAYERS)"),
    ("hf", "an hf config with a missing or malformed field", "exit 2, where an invalid graph file is exit 1",
     "sources.hf"),
    ("recipe", "--recipe vpp=2 or schedule=1f1b without pp", "exit 0 with a plan of no pipeline (the keys ignored)",
     "planning.training_search, training_plan"),
    ("recipe", "--recipe pp=2 (no dp or tp)", "the per-layer search could win with a plan of no pipeline",
     "planning.training_plan"),
    ("recipe", "--recipe dp=\u0664 (an Arabic-Indic digit)", "exit 0: read as dp=4", "planning.mesh"),
    ("engine", "--export-torchtitan / --export-megatron to a full device", "exit 2, where a write failure is exit 1",
     "cli.training"),
    ("declared", "an output path (--export-megatron, --dot-path, --export-graph) onto the measured table a "
                 "machine file names, or a symlink to it", "exit 0: the table overwritten, the next run failed ('missing field gemm')",
     "core.fileio (recording_reads), cli.common"),
    ("declared", "--recipe dp=8 on batch 15, microbatch=3 on a per-rank batch of 2, pp=8,vpp=5 on 12 blocks, "
                 "--compare pp=8,microbatch=3", "exit 2, 'no mesh applies to this graph: None'",
     "planning.mesh_refusals"),
    ("declared", "llama3-8b -p 100000 -b 128 --training", "'the sequence of size 2048 does not divide 10 ways'",
     "planning.mesh_refusals"),
    ("declared", "gpt2-small -p 100000 -b 128; alexnet -p 7", "a search of 28 min (out of memory here after 30 s); "
                 "a plan with idle devices, no word", "planning.occupancy, cli.common (--allow-replication)"),
    ("declared", "gpt2-small -p 8 -b 15 --training (paper machine)", "stage times of FLOP-equivalents labelled 's'",
     "outputs.training"),
    ("declared", "-m on gpt2-*/gpt3-*", "exit 2: the GPT graphs took no -m", "graphs (gpt, GRAPHS)"),
    # Issues 43 and 44 (the command line's part).
    ("declared", "rnnlm -p 12 / -p 48 -b 128 (at most 10 / 40 devices used), alexnet -p 7",
     "refused, exit 2 ('search -p 10 instead'): the paper's semantics answer them (at most p devices)",
     "cli.common (check_occupancy, answer_notes), planning.occupancy"),
    ("declared", "--memory 1e300, --table-budget 1e300", "internal error (exit 70; the cap overflowed to infinity); "
                 "on a training plan, no cap at all", "cli.argtypes (gigabytes)"),
    ("declared", "--memory 1e9", "'of 1e+03 PB' (and 999.7 GB as '1e+03 GB')", "core.units"),
    ("declared", "-g hf:LLAMA.json without --machine", "planned on the paper's 10 TFLOPS machine, exit 0, no word",
     "cli.common (paper_machine_note)"),
    ("declared", "--mtp on a Llama config", "exit 0, the flag ignored", "cli.common (load_network)"),
    ("declared", "-b 1000000000; -p 1024 -b 1 (real machine)", "a step of 28 days, an MFU of 0.3 %, no word",
     "outputs.training (plan_warnings)"),
    ("declared", "--compare of a recipe that needs more than the cap", "'a tie' (JSON: tie true, fit null)",
     "outputs.training (is_tie, training_dict)"),
    ("engine", "--export-megatron (or --training) of a Llama-type model on the paper machine",
     "internal error (exit 70): RMSNorm's unfused time asked the paper machine for a memory-bound time "
     "without its FLOPs", "costing.training"),
]


def render(cases: list, results: dict, problems: dict, args, elapsed: float) -> str:
    from common import machine_info, machine_lines, markdown_table

    info = machine_info()
    lines = ["# Fuzzing the file inputs and output paths", "",
             "Generated by `benchmarks/fuzz_inputs.py` (seed "
             f"{args.seed}{', categories ' + args.only if args.only else ''}). Every case is one command through "
             "`pase.cli.main` in a worker process (or, in the process category, `python3 scheduler.py`), checked "
             "against the rules of the command line: a documented exit status, the one the case calls for (1: an "
             "unreadable or invalid file; 2: a bad command line or value), exactly one `pase: error:` line and "
             "nothing on stdout when it fails, no traceback, no internal error (70), no hang (more than "
             f"{args.timeout} s), no output outside the given streams, finite numbers and equal totals for inputs "
             "that mean the same, and output files written completely or not at all.", ""]
    lines += machine_lines(info)
    run = [c for c in cases if c.index in results]
    failed = [c for c in run if problems.get(c.index)]
    skipped = [c for c in cases if c.index not in results]
    lines += [f"- {len(run)} cases run in {elapsed:.0f} s (timings on a shared 2-core machine are noisy), "
              f"{len(failed)} failed, {len(skipped)} skipped", ""]
    lines += ["## Counts", ""]
    rows = []
    for name, (_, title) in CATEGORIES.items():
        mine = [c for c in cases if c.category == name]
        if not mine:
            continue
        ran = [c for c in mine if c.index in results]
        rows.append([title, len(ran), len(ran) - sum(1 for c in ran if problems.get(c.index)),
                     sum(1 for c in ran if problems.get(c.index)), len(mine) - len(ran)])
    rows.append(["**all**", len(run), len(run) - len(failed), len(failed), len(skipped)])
    lines += markdown_table(["category", "cases", "passed", "failed", "skipped"], rows, "lrrrr")
    lines += ["", "## What was tried", ""]
    for name, (_, title) in CATEGORIES.items():
        mine = [c for c in cases if c.category == name]
        if not mine:
            continue
        lines.append(f"### {title}")
        lines.append("")
        kinds: dict = {}
        for c in mine:
            kinds.setdefault(c.kind, []).append(c)
        for kind, members in kinds.items():
            statuses: dict = {}
            for c in members:
                if c.index in results:
                    s = results[c.index]["status"]
                    statuses[s] = statuses.get(s, 0) + 1
            shown = ", ".join(f"exit {s}: {n}" for s, n in sorted(statuses.items(), key=lambda x: str(x[0])))
            examples = "; ".join(dict.fromkeys(c.what for c in members))
            lines.append(f"- **{kind}** ({len(members)} cases; {shown or 'not run'}): {_short(examples, 600)}")
        lines.append("")
    lines += ["## Failures", ""]
    if not failed:
        lines.append("None: every case passed every rule.")
    for c in failed:
        lines.append(f"- [{c.category}/{c.kind}] {c.what}: `{c.command()}`")
        for p in problems[c.index]:
            lines.append(f"  - {p}")
    lines += ["", "## Defects this driver found before the fixes", "",
              "On `main` at daa9ad8 (seed 14, 10 s per case) 75 of 1602 cases failed: 12 wrong exit statuses, "
              "21 outputs destroyed or not written, 16 hangs, 15 internal errors, 10 exceptions escaping `main()`, "
              "1 traceback on stderr (a bad machine file's exit 2, which issue 11 asks for, is not counted); "
              "other seeds found the rest of the "
              "defects below (the random mutations). Each is fixed on branch `fuzz`, with a test in "
              "`tests/test_fuzz_regressions.py` that fails without the fix.", ""]
    lines += markdown_table(["inputs", "category", "what happened", "fixed in"],
                            [[what, cat, happened, f"`{where}`"] for cat, what, happened, where in FOUND], "llll")
    lines += ["", "The `declared` category (issue 35) on revision 855edf6, before its fixes: 25 of 179 cases failed "
              "(the last six rows above; tests in `tests/test_defects_35.py`)."]
    lines += ["", "## Skipped", ""]
    if not skipped:
        lines.append("None.")
    for c in skipped:
        lines.append(f"- [{c.category}/{c.kind}] {c.what}: {c.skip}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1")
        sys.exit(0)
    sys.path.insert(0, HERE)
    sys.exit(main())
