"""The command line's JAX flags: --export-jax (pure Python) and --verify (a JAX run)."""

from __future__ import annotations

import json

import pytest

from pase.cli import ExitStatus
from cli_runner import run


def test_export_jax_writes_the_plans_shardings(tmp_path):
    path = tmp_path / "plan.json"
    status, out, err = run("-g", "alexnet", "-b", "8", "-p", "8", "--json", "--export-jax", path)
    assert status == 0, err
    exported = json.loads(path.read_text())
    searched = json.loads(out)
    assert exported["procs"] == 8 and len(exported["layers"]) == len(searched["layers"])
    # Every layer's mesh axes cover exactly the splits of its configuration.
    sizes = dict(zip(exported["mesh"]["axis_names"], exported["mesh"]["axis_sizes"]))
    for layer, row in zip(exported["layers"], searched["layers"]):
        assert layer["config"] == row["config"]
        for split, axes in zip(layer["config"], layer["axes"]):
            product = 1
            for axis in axes:
                product *= sizes[axis]
            assert product == split


def test_export_jax_refuses_a_sweep_and_unwritable_paths(tmp_path):
    status, out, err = run("-g", "alexnet", "--sweep", "4,8", "--export-jax", tmp_path / "x.json")
    assert status == ExitStatus.USAGE and out == ""
    status, out, err = run("-g", "alexnet", "--export-jax", tmp_path / "missing" / "x.json")
    assert status == 1 and out == "" and err.count("\n") == 1


def test_verify_without_jax_says_how_to_install(monkeypatch):
    import pase.outputs.jax.verify as jv
    from pase.outputs.jax.common import JaxMissing

    def missing(*args, **kwargs):
        raise JaxMissing("jax is not installed: pip install '.[jax]'")

    monkeypatch.setattr(jv, "verify", missing)
    status, out, err = run("-g", "alexnet", "-b", "8", "-p", "8", "--verify", "jax")
    assert status == ExitStatus.USAGE and out == ""
    assert err == "pase: error: jax is not installed: pip install '.[jax]'\n"


def test_verify_runs_the_plan():
    pytest.importorskip("jax")
    # rnnlm at width 8 and batch 4: the configurations of width 32 and batch 8 (the embedding's
    # and the output layer's vocabulary split 4 ways, the LSTM's layers 2), at half the logits
    # (4 x 256 x 10^5) and a sixteenth of the LSTM's weights.
    status, out, err = run("-g", "rnnlm", "-m", "8", "-b", "4", "-p", "4", "--json", "--verify", "jax")
    assert status == 0, err
    verified = json.loads(out)["verify"]
    assert verified["ok"] and verified["max_error"] <= 1e-4 and verified["procs"] == 4
