"""The golden corpus: command lines whose stdout, stderr, exit status and written files are
recorded under ``tests/data/golden/`` and must stay byte-identical (timings masked).

It pins the tool's behaviour while the code moves around. To record the corpus again after
a change that is meant to alter the output: ``python3 tests/test_golden.py --update``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

sys.path[:0] = [os.path.dirname(__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from cli_runner import run  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden")

#: A strategy file for the --evaluate cases: one data-parallel configuration per AlexNet layer.
_DIMS = [7, 4, 7, 4, 7, 7, 7, 4, 4, 2, 3, 3, 3, 2]
DATA_PARALLEL_P4 = json.dumps({"configs": [[4] + [1] * (n - 1) for n in _DIMS]})

#: name -> (argv, input files {name: text}, files the run writes that are recorded).
CASES = {
    # The table and the JSON of every built-in graph at a small device count.
    "alexnet-p4": (["-g", "alexnet", "-p", "4"], {}, []),
    "alexnet-p4-json": (["-g", "alexnet", "-p", "4", "--json"], {}, []),
    "resnet101-p4": (["-g", "resnet101", "-p", "4"], {}, []),
    "resnet101-p4-json": (["-g", "resnet101", "-p", "4", "--json"], {}, []),
    "inception3-p4": (["-g", "inception3", "-p", "4"], {}, []),
    "inception3-p2-json": (["-g", "inception3", "-p", "2", "--json"], {}, []),
    "rnnlm-p8": (["-g", "rnnlm", "-p", "8"], {}, []),
    "rnnlm-p8-m1024-json": (["-g", "rnnlm", "-p", "8", "-m", "1024", "--json"], {}, []),
    # Counts no configuration fills (at most 10 and 40 used): planned, with a note (issue 43).
    "rnnlm-p12": (["-g", "rnnlm", "-p", "12", "-b", "128", "--flops", "10", "--bw", "16"], {}, []),
    "rnnlm-p48": (["-g", "rnnlm", "-p", "48", "-b", "128", "--flops", "10", "--bw", "16"], {}, []),
    "transformer-p4": (["-g", "transformer", "-p", "4"], {}, []),
    "transformer-p4-json": (["-g", "transformer", "-p", "4", "--json", "-m", "256"], {}, []),
    "gpt2-small-p4": (["-g", "gpt2-small", "-p", "4", "-b", "8"], {}, []),
    "gpt2-small-p4-json": (["-g", "gpt2-small", "-p", "4", "-b", "8", "--json"], {}, []),
    "llama3-8b-p4": (["-g", "llama3-8b", "-p", "4", "-b", "4", "-m", "512"], {}, []),
    "breadth-first": (["-g", "alexnet", "-p", "8", "-a", "1"], {}, []),
    "no-blocks": (["-g", "transformer", "-p", "2", "--no-blocks", "-m", "128"], {}, []),
    # Sweeps, machines and the memory cap.
    "sweep": (["-g", "alexnet", "--sweep", "1,2,4,8"], {}, []),
    "sweep-json": (["-g", "rnnlm", "--sweep", "2,4", "--json"], {}, []),
    "memory": (["-g", "alexnet", "-p", "4", "--memory", "0.32"], {}, []),
    "memory-json": (["-g", "alexnet", "-p", "4", "--memory", "0.32", "--json"], {}, []),
    "memory-nothing-fits": (["-g", "rnnlm", "-p", "2", "--memory", "0.001"], {}, []),
    "sweep-nothing-fits": (["-g", "rnnlm", "--sweep", "2,4", "--memory", "0.001"], {}, []),
    "machine-h100": (["-g", "alexnet", "-p", "8", "--machine", "h100-sxm"], {}, []),
    "machine-h100-json": (["-g", "transformer", "-p", "8", "--machine", "h100-sxm", "--json", "-m", "256"], {}, []),
    # On a real machine --per-layer keeps the paper's per-layer sweep; without it, a training sweep (issue 43).
    "machine-h100-sweep": (["-g", "alexnet", "--sweep", "2,8", "--machine", "h100-sxm", "--per-layer"], {}, []),
    "training-sweep": (["-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "1,2,4,8"], {}, []),
    "training-sweep-json": (["-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,8", "--json"], {},
                            []),
    "training-sweep-budget": (["-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "1,2,4", "--memory",
                               "4", "--tokens", "1e9", "--device-hour-price", "2.5", "--days", "0.02"], {}, []),
    "training-sweep-refused-json": (["-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,4",
                                     "--recipe", "dp=4", "--tokens", "1e9", "--json"], {}, []),
    "flops-bw": (["-g", "alexnet", "-p", "4", "--flops", "20", "--bw", "100"], {}, []),
    "param-act-bytes": (["-g", "alexnet", "-p", "4", "--param-bytes", "4", "--act-bytes", "4", "--json"], {}, []),
    "table-budget-too-large": (["-g", "inception3", "-p", "8", "-a", "1", "--table-budget", "0.0001"], {}, []),
    "search-too-large": (["-g", "inception3", "-p", "8", "-a", "1", "--table-budget", "0.002"], {}, []),
    "sweep-too-large": (["-g", "inception3", "--sweep", "1,8", "-a", "1", "--table-budget", "0.002"], {}, []),
    # Written files: DOT, graph file, JAX shardings; the graph file read back.
    "dot": (["-g", "alexnet", "-p", "2", "--dot-path", "out.dot"], {}, ["out.dot"]),
    "dump-graph": (["-g", "rnnlm", "-p", "2", "-d"], {}, ["graph.dot"]),
    "export-graph": (["-g", "alexnet", "-p", "2", "--export-graph", "net.json"], {}, ["net.json"]),
    "export-jax": (["-g", "transformer", "-p", "4", "-m", "128", "--export-jax", "shard.json"], {}, ["shard.json"]),
    "graph-file": (["-g", "net.json", "-p", "2", "--json"], {"net.json": "@export-graph/net.json"}, []),
    # --evaluate round trips.
    "evaluate": (["--evaluate", "strategy.json", "-g", "alexnet", "-p", "4"], {"strategy.json": DATA_PARALLEL_P4}, []),
    "evaluate-json-roundtrip": (["--evaluate", "plan.json", "-p", "8"], {"plan.json": "@alexnet-p4-json/stdout"}, []),
    "evaluate-machine": (["--evaluate", "plan.json", "--machine", "h100-sxm"], {"plan.json": "@alexnet-p4-json/stdout"}, []),
    "evaluate-bad-config": (["--evaluate", "s.json", "-g", "alexnet", "-p", "4"],
                            {"s.json": '{"configs": [[3, 1, 1, 1, 1, 1, 1]]}'}, []),
    "evaluate-not-json": (["--evaluate", "s.json"], {"s.json": "{not json"}, []),
    "evaluate-missing": (["--evaluate", "absent.json"], {}, []),
    # Help, version and usage errors.
    "help": (["--help"], {}, []),
    "version": (["--version"], {}, []),
    "calibrate-help": (["calibrate", "--help"], {}, []),
    "unknown-flag": (["--frobnicate"], {}, []),
    "unknown-graph": (["-g", "vgg"], {}, []),
    "bad-procs": (["-p", "0"], {}, []),
    "huge-procs": (["-p", "99999999"], {}, []),
    "bad-sweep": (["--sweep", "4,4"], {}, []),
    "sweep-and-procs": (["--sweep", "2,4", "-p", "4"], {}, []),
    "model-on-alexnet": (["-g", "alexnet", "-m", "64"], {}, []),
    "unknown-machine": (["--machine", "tpu"], {}, []),
    "machine-file-missing": (["--machine", "nope.json"], {}, []),
    "loss-on-builtin": (["-g", "alexnet", "--loss", "none"], {}, []),
    "measure-and-memory": (["--measure", "--memory", "1"], {}, []),
    "evaluate-and-algo": (["--evaluate", "x.json", "-a", "1"], {"x.json": DATA_PARALLEL_P4}, []),
    "verify-sweep": (["--sweep", "2,4", "--verify", "jax"], {}, []),
    "export-jax-sweep": (["--sweep", "2,4", "--export-jax", "x.json"], {}, []),
    "graph-file-missing": (["-g", "missing.json"], {}, []),
    "graph-file-batch": (["-g", "net.json", "-b", "64"], {"net.json": "@export-graph/net.json"}, []),
    "torch-missing-module": (["-g", "torch:no_such_module_xyz:f", "-p", "2"], {}, []),
    "calibrate-unknown-flag": (["calibrate", "--frobnicate"], {}, []),
    "dot-path-empty": (["--dot-path", " "], {}, []),
    "unwritable-output": (["-g", "alexnet", "-p", "2", "--export-graph", "no/such/dir/net.json"], {}, []),
    # Offload (issue 45): the search's fallback where nothing fits, a recipe's on gh200, the
    # refusal that names it, a combination refused.
    "offload-fallback": (["-g", "gpt2-small", "-b", "16", "-p", "1", "--machine", "h100-sxm", "--memory", "4"], {},
                         []),
    "offload-recipe-json": (["-g", "gpt2-small", "-b", "8", "-p", "2", "--machine", "gh200", "--recipe",
                             "dp=2,tp=1,zero=3,offload=optimizer+params", "--json"], {}, []),
    "offload-none-refused": (["-g", "gpt2-small", "-b", "16", "-p", "1", "--machine", "h100-sxm", "--memory", "4",
                              "--recipe", "offload=none"], {}, []),
    "offload-params-zero1": (["-g", "gpt2-small", "-p", "2", "--machine", "h100-sxm", "--recipe",
                              "offload=params,zero=1"], {}, []),
}

#: Run-to-run variation: search times and their rates.
_MASKS = [
    (re.compile(r'"seconds": [-0-9.e+]+'), '"seconds": <t>'),
    (re.compile(r'"(mean|stdev|min|max)_seconds": [-0-9.e+]+'), r'"\1_seconds": <t>'),
    (re.compile(r"[0-9.]+(e[-+]?[0-9]+)? s \([0-9.]+ [nµum]?s per entry\)"), "<t> s (<t> per entry)"),
    (re.compile(r"(?m)^( +[0-9]+ .* )[0-9]+\.[0-9]{4}$"), r"\1<t>"),  # a sweep row's search seconds
    (re.compile(r"configurations in [0-9.]+ s"), "configurations in <t> s"),  # a training plan's search
]


def _mask(text: str, workdir: str) -> str:
    for folder in {os.path.realpath(workdir), workdir}:  # the temporary working directory
        text = text.replace(folder, "<cwd>")
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def _input_text(text: str) -> str:
    if text.startswith("@"):  # another case's recorded output
        with open(os.path.join(GOLDEN, text[1:]), encoding="utf-8") as f:
            return f.read().replace("<t>", "0")
    return text


def replay(name: str, workdir: str) -> dict:
    """``{"stdout", "stderr", "status", files...}`` of case ``name`` run in ``workdir``."""
    argv, inputs, written = CASES[name]
    for path, text in inputs.items():
        with open(os.path.join(workdir, path), "w", encoding="utf-8") as f:
            f.write(_input_text(text))
    status, out, err = run(*argv, cwd=workdir)
    result = {"stdout": _mask(out, workdir), "stderr": _mask(err, workdir), "status": f"{int(status)}\n"}
    for path in written:
        with open(os.path.join(workdir, path), encoding="utf-8") as f:
            result[path] = _mask(f.read(), workdir)
    return result


def _recorded(name: str) -> dict:
    folder = os.path.join(GOLDEN, name)
    result = {}
    for entry in sorted(os.listdir(folder)):
        with open(os.path.join(folder, entry), encoding="utf-8") as f:
            result[entry] = f.read()
    return result


@pytest.mark.parametrize("name", list(CASES))
def test_golden(name, tmp_path):
    if name.startswith("torch-") and importlib.util.find_spec("torch") is None:
        pytest.skip("the torch: source's messages need PyTorch (pip install '.[torch]')")
    assert replay(name, str(tmp_path)) == _recorded(name)


def _update() -> None:
    import tempfile

    for name in CASES:  # in order: later cases read earlier ones' outputs
        with tempfile.TemporaryDirectory() as workdir:
            result = replay(name, workdir)
        folder = os.path.join(GOLDEN, name)
        os.makedirs(folder, exist_ok=True)
        for entry in os.listdir(folder):
            os.remove(os.path.join(folder, entry))
        for entry, text in result.items():
            with open(os.path.join(folder, entry), "w", encoding="utf-8") as f:
                f.write(text)
        print(f"{name}: status {result['status'].strip()}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python3 tests/test_golden.py --update")
    _update()
