"""The README stays true: its example outputs are regenerated and compared (timings masked),
and every flag, exit status and command it promises exists."""

from __future__ import annotations

import io
import os
import re
import shlex

import pytest

from pase import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The two commands the README promises to work on a fresh machine from a fresh clone.
MAIN_COMMAND = "python3 -m pip install . && python3 scheduler.py -g transformer -p 64"
TEST_COMMAND = "python3 -m pip install -r requirements-test.txt && python3 -m pytest -q"


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


README = read("README.md")

EXAMPLES = re.findall(r"<!-- example: (.+?) -->\n```text\n(.*?)```", README, flags=re.S)


def mask_timings(text):
    """Replace what depends on the machine's speed: search seconds and ns per entry."""
    text = re.sub(r"\d+\.\d+ s \(\d+\.\d+ ns per entry\)", "<seconds>", text)
    text = re.sub(r'"seconds": [0-9.e+-]+', '"seconds": <seconds>', text)
    text = re.sub(r"configurations in \d+\.\d+ s", "configurations in <seconds>", text)
    # The last column of a sweep row is the search time.
    text = re.sub(r"^(\s+\d+\s.*\S)\s+\d+\.\d{4}$", r"\1 <seconds>", text, flags=re.M)
    return text


def test_readme_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("command,block", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_is_what_the_program_prints(command, block):
    argv = shlex.split(command)
    assert argv[0] == "pase"
    shown_command, _, shown_output = block.partition("\n")
    assert shown_command == f"$ {command}"
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(argv[1:], stdout=out, stderr=err) == 0, err.getvalue()
    assert mask_timings(out.getvalue()) == mask_timings(shown_output)


def test_mask_timings_keeps_everything_else():
    row = "     32    1.0428e+12          1.5674e+12    1.503x   3.22 GB  4.51 GB  -                         0.4238"
    assert mask_timings(row) == "     32    1.0428e+12          1.5674e+12    1.503x   3.22 GB  4.51 GB  - <seconds>"
    assert mask_timings("35,722 table entries, 0.0006 s (17.7 ns per entry)") == "35,722 table entries, <seconds>"
    assert mask_timings("optimal total cost  5.3136e+10") == "optimal total cost  5.3136e+10"


def test_readme_documents_every_flag():
    parser = cli.build_parser(io.StringIO(), io.StringIO())
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            assert re.search(rf"`[^`]*{re.escape(flag)}\b", README), flag
    assert "--no-progress" in README


def test_readme_documents_every_exit_status():
    section = README[README.index("### Exit status"):]
    table = re.findall(r"^\| (\d+) \|", section, flags=re.M)
    assert sorted(int(code) for code in table) == sorted(cli.EXIT_CODES)


def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    assert f"```sh\n{MAIN_COMMAND}\n```" in README
    assert f"```sh\n{TEST_COMMAND}\n```" in README
    ci = read(os.path.join(".ci", "run"))
    assert TEST_COMMAND in ci.splitlines()


def test_readme_names_every_graph_of_the_registry():
    import graphs

    for name in graphs.GRAPHS:
        assert f"`{name}`" in README, name


def test_readme_library_example_runs():
    library = README[README.index("## Using it as a library"):]
    code = re.search(r"```python\n(.*?)```", library, flags=re.S).group(1)
    printed = io.StringIO()
    namespace = {"print": lambda *a: printed.write(" ".join(map(str, a)) + "\n")}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["best"].total_cost > 0 and printed.getvalue()


def regenerate(text: str) -> str:
    """README text with every example block replaced by what the program prints now."""

    def replace(match):
        command = match.group(1)
        out, err = io.StringIO(), io.StringIO()
        status = cli.main(shlex.split(command)[1:], stdout=out, stderr=err)
        if status != 0:
            raise SystemExit(f"{command}: exit status {status}: {err.getvalue()}")
        return f"<!-- example: {command} -->\n```text\n$ {command}\n{out.getvalue()}```"

    return re.sub(r"<!-- example: (.+?) -->\n```text\n(.*?)```", replace, text, flags=re.S)


if __name__ == "__main__":
    # PYTHONPATH=. python tests/test_readme.py: rewrite the README's example outputs.
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        updated = regenerate(f.read())
    with open(path, "w", encoding="utf-8") as f:
        f.write(updated)
    print(f"rewrote the {len(EXAMPLES)} examples of {path}")
