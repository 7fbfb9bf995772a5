"""The README and the documents under ``docs/`` stay true: their example outputs are
regenerated and compared (timings masked), and every flag, exit status and command they
promise exists.

Each example is a ``<!-- example: pase ... -->`` line above a ``text`` block; it runs in a
temporary directory that sees the repository's ``examples/`` (so the files it writes land
there). ``PYTHONPATH=. python3 tests/test_readme.py`` rewrites every example's output."""

from __future__ import annotations

import functools
import glob
import importlib.util
import io
import os
import re
import shlex
import tempfile

import pytest

from pase import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The two commands the README promises to work on a fresh machine from a fresh clone.
MAIN_COMMAND = "python3 -m pip install . && python3 scheduler.py -g transformer -p 64"
TEST_COMMAND = "python3 -m pip install -r requirements-test.txt && python3 -m pytest -q"
#: The files whose examples are run: the README, then every document.
DOCUMENTS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
EXAMPLE = re.compile(r"<!-- example: (.+?) -->\n```text\n(.*?)```", flags=re.S)


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


README = read("README.md")
CLI_DOC = read(os.path.join("docs", "cli.md"))
ALL_DOCS = "\n".join(read(name) for name in DOCUMENTS)

EXAMPLES = EXAMPLE.findall(README)
ALL_EXAMPLES = [(name, command, block) for name in DOCUMENTS for command, block in EXAMPLE.findall(read(name))]


def mask_timings(text):
    """Replace what depends on the machine's speed: search seconds and ns per entry."""
    text = re.sub(r"\d+\.\d+ s \(\d+\.\d+ ns per entry\)", "<seconds>", text)
    text = re.sub(r'"seconds": [0-9.e+-]+', '"seconds": <seconds>', text)
    text = re.sub(r"configurations in \d+\.\d+ s", "configurations in <seconds>", text)
    # The last column of a sweep row is the search time.
    text = re.sub(r"^(\s+\d+\s.*\S)\s+\d+\.\d{4}$", r"\1 <seconds>", text, flags=re.M)
    return text


def needs(command: str) -> str | None:
    """The optional package an example needs and this Python lacks, else None."""
    if "torch:" in command:
        for package in ("torch", "transformers"):
            if importlib.util.find_spec(package) is None:
                return package
    return None


@functools.lru_cache(maxsize=None)
def run_example(command: str) -> tuple:
    """``(status, stdout, stderr)`` of an example, run in a scratch directory where
    ``examples/`` is the repository's; an example shown in several documents runs once (the
    output is the same: it depends on the command alone)."""
    argv = shlex.split(command)
    assert argv[0] == "pase"
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.symlink(os.path.join(ROOT, "examples"), os.path.join(scratch, "examples"))
        os.chdir(scratch)
        try:
            status = cli.main(argv[1:], stdout=out, stderr=err)
        finally:
            os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def test_readme_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("name,command,block", ALL_EXAMPLES, ids=[f"{n}: {c}" for n, c, _ in ALL_EXAMPLES])
def test_example_is_what_the_program_prints(name, command, block):
    missing = needs(command)
    if missing:
        pytest.skip(f"{missing} is not installed")
    shown_command, _, shown_output = block.partition("\n")
    assert shown_command == f"$ {command}"
    status, out, err = run_example(command)
    assert status == 0, err
    assert mask_timings(out) == mask_timings(shown_output)


def test_mask_timings_keeps_everything_else():
    row = "     32    1.0428e+12          1.5674e+12    1.503x   3.22 GB  4.51 GB  -                         0.4238"
    assert mask_timings(row) == "     32    1.0428e+12          1.5674e+12    1.503x   3.22 GB  4.51 GB  - <seconds>"
    assert mask_timings("35,722 table entries, 0.0006 s (17.7 ns per entry)") == "35,722 table entries, <seconds>"
    assert mask_timings("optimal total cost  5.3136e+10") == "optimal total cost  5.3136e+10"


def test_cli_doc_documents_every_flag():
    parser = cli.build_parser(io.StringIO(), io.StringIO())
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            assert re.search(rf"`[^`]*{re.escape(flag)}\b", CLI_DOC), flag
    assert "--no-progress" in CLI_DOC


def test_readme_is_short_and_links_its_documents():
    assert README.count("\n") <= 250
    for target in re.findall(r"\]\((docs/[a-z-]+\.md)\)", README):
        assert os.path.exists(os.path.join(ROOT, target)), target
    for picture in re.findall(r"\]\((benchmarks/results/[^)]+\.png)\)", README):
        assert os.path.exists(os.path.join(ROOT, picture)), picture


def test_cli_doc_documents_every_exit_status():
    section = CLI_DOC[CLI_DOC.index("## Exit status"):]
    table = re.findall(r"^\| (\d+) \|", section, flags=re.M)
    assert sorted(int(code) for code in table) == sorted(cli.EXIT_CODES)


def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    assert f"```sh\n{MAIN_COMMAND}\n```" in README
    assert f"```sh\n{TEST_COMMAND}\n```" in README
    ci = read(os.path.join(".ci", "run"))
    assert TEST_COMMAND in ci.splitlines()


def test_docs_name_every_graph_of_the_registry():
    import graphs

    for name in graphs.GRAPHS:
        assert f"`{name}`" in ALL_DOCS, name


def regenerate(text: str) -> str:
    """Text with every example block replaced by what the program prints now."""

    def replace(match):
        command = match.group(1)
        if needs(command):
            raise SystemExit(f"{command}: needs {needs(command)}, which is not installed")
        status, out, err = run_example(command)
        if status != 0:
            raise SystemExit(f"{command}: exit status {status}: {err}")
        return f"<!-- example: {command} -->\n```text\n$ {command}\n{out}```"

    return EXAMPLE.sub(replace, text)


if __name__ == "__main__":
    # PYTHONPATH=. python3 tests/test_readme.py: rewrite the examples' outputs in README.md and docs/.
    for name in DOCUMENTS:
        text = read(name)
        if not EXAMPLE.search(text):
            continue
        new = regenerate(text)  # every example run before the file is opened: a failure leaves it whole
        with open(os.path.join(ROOT, name), "w", encoding="utf-8") as f:
            f.write(new)
        print(f"rewrote the {len(EXAMPLE.findall(text))} examples of {name}")
