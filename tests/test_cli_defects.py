"""Defects found by driving the tool as a new user would (one test per item, each written to
fail on the code before its fix). They go through the command line, in-process where they
can and as a process where the point is the process itself (exit status, closed streams,
signals, file-size limits)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULER = os.path.join(ROOT, "scheduler.py")


def process(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PASE_TRACEBACK", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=kwargs.pop("cwd", ROOT),
                          env=env, check=False, **kwargs)


# 1. A failed write leaves the previous file intact --------------------------------------

def test_failed_dot_write_keeps_the_old_file(tmp_path):
    keep = tmp_path / "keep.dot"
    keep.write_text("digraph G { a -> b; }\n")

    def small_files():  # like `ulimit -f 8`: at most 8 blocks of 512 bytes per file
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 512, resource.RLIM_INFINITY))

    proc = process(SCHEDULER, "-g", "gpt2-small", "-p", "8", "-b", "2", "--dot-path", str(keep),
                   preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "DOT graph" in proc.stderr
    assert keep.read_text() == "digraph G { a -> b; }\n"
    assert sorted(os.listdir(tmp_path)) == ["keep.dot"]  # no temporary file left behind


# 2. Sweeps give one JSON record per device count ----------------------------------------

def test_sweep_json_has_a_record_for_every_device_count():
    # p = 1 runs; p = 4 is refused (breadth-first on InceptionV3 is far too large).
    status, out, err = run("-a", 1, "-g", "inception3", "--sweep", "1,4", "--json")
    assert status == 3
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["procs"], r["status"]) for r in records] == [(1, "ok"), (4, "too_large")]
    assert records[1]["table_entries"] > 1e12 and records[1]["needed_bytes"] > records[1]["budget_bytes"]


def test_sweep_json_says_when_nothing_fits():
    # gpt2-small, batch 8: on 1 device at least ~3.5 GB are needed, on 8 devices far less.
    status, out, err = run("-g", "gpt2-small", "-b", "8", "--sweep", "1,8", "--memory", "2", "--json")
    assert status == 4
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["procs"] for r in records] == [1, 8]
    assert records[0]["status"] == "nothing_fits" and records[0]["least_bytes"] > 2e9
    assert records[1]["status"] == "ok" and records[1]["memory"]["fits"]


# 3. --evaluate takes every recorded setting ----------------------------------------------

def test_evaluate_takes_the_recorded_memory_settings(tmp_path):
    status, out, _ = run("-g", "rnnlm", "-p", "8", "-b", "16", "--param-bytes", "2", "--json")
    assert status == 0
    path = tmp_path / "plan.json"
    path.write_text(out)
    recorded = json.loads(out)["memory"]["per_device_bytes"]
    status, out, err = run("--evaluate", path, "--json")
    assert status == 0 and err == ""
    assert json.loads(out)["memory"]["per_device_bytes"] == recorded
    status, out, err = run("--evaluate", path, "--json", "--param-bytes", "16")
    assert json.loads(out)["memory"]["per_device_bytes"] > recorded
    assert "--param-bytes 16.0 overrides the file's param bytes 2.0" in err


@pytest.mark.parametrize("graph,recipe", [
    ("mixtral-8x7b", "dp=8,tp=2,ep=4,zero=1,recompute=selective,recompute_modules=moe_act+layernorm,microbatch=1"),
    ("llama3-8b", "dp=16,tp=1,zero=3,recompute=none,microbatch=1,offload=optimizer+params"),
])
def test_evaluate_reads_back_words_joined_by_plus(tmp_path, graph, recipe):
    # A plan's recipe with recompute modules or offload kinds (words joined by +) was written
    # back as a Python tuple ("('moe_act', 'layernorm')") and refused by --evaluate.
    status, out, err = run("-g", graph, "-p", "16", "-b", "32", "-m", "1024", "--machine", "h100-sxm", "--recipe",
                           recipe, "--json")
    assert status == 0, err
    path = tmp_path / "plan.json"
    path.write_text(out)
    first = json.loads(out)["training"]
    status, out, err = run("--evaluate", path, "--json")
    assert status == 0, err
    again = json.loads(out)["training"]
    assert again["recipe"] == first["recipe"] and again["step_seconds"] == first["step_seconds"]


# 4. Dependent sets wider than NumPy's 32 axes ----------------------------------------------

def test_breadth_first_on_one_device_is_not_an_internal_error():
    status, out, err = run("-a", 1, "-g", "transformer", "-p", 1, "-b", 8, "--json")
    assert status == 0, err
    bf = json.loads(out)["total_cost"]
    assert bf == pytest.approx(json.loads(run("-g", "transformer", "-p", 1, "-b", 8, "--json")[1])["total_cost"])


# 5. Output errors are I/O errors, not bugs ------------------------------------------------

def test_closed_stdout_is_an_io_error():
    proc = process(SCHEDULER, "-g", "alexnet", "-p", "4", preexec_fn=lambda: os.close(1))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "internal error" not in proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_full_device_is_an_io_error(json_flag):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, SCHEDULER, "-g", "alexnet", "-p", "4", *json_flag], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, check=False,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "No space left" in proc.stderr and "internal" not in proc.stderr


# 6. Hostile JSON is invalid input ---------------------------------------------------------

@pytest.mark.parametrize("text", ["[" * 100000, '{"configs": [[' + "9" * 5000 + "]]}", '{"configs": [[NaN]]}'],
                         ids=["deep", "long-integer", "nan"])
def test_hostile_strategy_files_are_invalid_input(tmp_path, text):
    path = tmp_path / "hostile.json"
    path.write_text(text)
    status, out, err = run("--evaluate", path, "-g", "alexnet", "-p", 4)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "internal" not in err


# 7. Ctrl-C while the program loads ---------------------------------------------------------

def test_interrupt_during_imports_is_clean():
    # Interrupt the first import of numpy, which happens while the CLI loads.
    code = (
        "import builtins, runpy, sys\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *a, **k):\n"
        "    if name == 'numpy':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = interrupted\n"
        f"sys.argv = [{SCHEDULER!r}, '-g', 'alexnet']\n"
        f"runpy.run_path({SCHEDULER!r}, run_name='__main__')\n"
    )
    proc = process("-c", code)
    assert proc.returncode == 130
    assert proc.stderr == "pase: interrupted\n"


# 8. Flags that misled or were silently ignored --------------------------------------------

def test_evaluate_with_another_graph_does_not_blame_a_flag_never_given(tmp_path):
    status, out, _ = run("-g", "transformer", "-m", "64", "-p", "4", "-b", "8", "--json")
    path = tmp_path / "transformer.json"
    path.write_text(out)
    status, out, err = run("--evaluate", path, "-g", "alexnet")
    assert status != 0 and out == ""
    assert "-m" not in err and err.count("\n") == 2  # the note on -g, and the error
    assert "overrides the file's graph transformer" in err


@pytest.mark.parametrize("flag", [["-a", "1"], ["--table-budget", "1"]])
def test_evaluate_refuses_search_flags(tmp_path, flag):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"configs": [[1] * 4] * 4}))
    status, out, err = run("--evaluate", path, "-g", "rnnlm", *flag)
    assert status == 2 and out == "" and "--evaluate" in err


def test_evaluate_reads_standard_input():
    status, out, _ = run("-g", "rnnlm", "-p", "8", "--json")
    status, again, err = run("--evaluate", "-", "--json", stdin=out)
    assert status == 0, err
    assert json.loads(again)["total_cost"] == pytest.approx(json.loads(out)["total_cost"], rel=1e-12)


def test_device_count_has_an_upper_bound():
    status, out, err = run("-p", "99999999999999999999999")
    assert status == 2 and "largest supported" in err


@pytest.mark.parametrize("module", ["pase", "pase.cli"])
def test_python_dash_m_runs_the_cli(module):
    proc = process("-m", module, "-g", "alexnet", "-p", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["graph"] == "alexnet"


# 9. What users misread ---------------------------------------------------------------------

def test_replicas_are_shown():
    status, out, _ = run("-g", "alexnet", "-p", "32")
    assert "b16 (x2 replicated)" in out  # pool5 splits its batch 16 ways on 32 devices
    data = json.loads(run("-g", "alexnet", "-p", "32", "--json")[1])
    pool5 = next(layer for layer in data["layers"] if layer["name"] == "pool5")
    assert pool5["replicas"] == 2


def test_long_searches_are_announced(monkeypatch):
    import pase.cli.progress

    monkeypatch.setattr(pase.cli.progress, "SECONDS_PER_ENTRY", 0.1)  # as if every entry took 0.1 s
    status, out, err = run("-g", "rnnlm", "-p", "8")
    assert status == 0
    assert err.startswith("pase: note: rnnlm on 8 devices: the search fills") and "table entries" in err


# 10. Set-up ----------------------------------------------------------------------------------

def test_pyproject_and_setup_agree():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    start = readme.index("## Quick start")
    quick = readme[start:readme.index("\n## ", start + 1)]
    assert quick.index("venv") < quick.index("pip install")  # the environment comes first
    assert "pip install -e ." in readme
