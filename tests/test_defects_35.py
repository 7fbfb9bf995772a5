"""Issue 35: nothing destroyed, nothing silent, every refusal with its reason. One test (or
a few) per item, each written to fail on the code before its fix."""

from __future__ import annotations

import os
import shutil

import pytest

from cli_runner import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINES = os.path.join(ROOT, "examples", "machines")


# 1. An input destroyed through a file it names -------------------------------------------

@pytest.fixture
def machine_dir(tmp_path):
    """A copy of the shipped machine file and the measured table it names."""
    for name in os.listdir(MACHINES):
        shutil.copy(os.path.join(MACHINES, name), tmp_path / name)
    return tmp_path


def _tables(directory) -> dict:
    return {name: (directory / name).read_bytes() for name in os.listdir(directory)}


@pytest.mark.parametrize("output", [
    ["--recipe", "dp=8", "--export-megatron"],  # the command
    ["--training", "--export-torchtitan"],
    ["--training", "--dot-path"],
    ["--dot-path"],  # the per-layer search
    ["--export-graph"],
])
def test_an_output_onto_the_machine_files_measured_table_is_refused(machine_dir, output):
    before = _tables(machine_dir)
    status, out, err = run("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", machine_dir / "h100-96gb-500w.json",
                           *output, machine_dir / "h100-96gb-500w-derived.json")
    assert status == 2, err
    assert "would overwrite" in err and "measured table" in err and err.count("\n") == 1, err
    assert out == "" and _tables(machine_dir) == before


def test_a_symlink_to_the_measured_table_is_the_table(machine_dir):
    link = machine_dir / "link.json"
    link.symlink_to(machine_dir / "h100-96gb-500w-derived.json")
    before = _tables(machine_dir)
    status, _, err = run("-g", "gpt2-small", "-p", "8", "-b", "16", "--machine", machine_dir / "h100-96gb-500w.json",
                         "--recipe", "dp=8", "--export-megatron", link)
    assert status == 2 and "measured table" in err, err
    assert _tables(machine_dir) == before


def test_write_atomic_refuses_a_file_read_in_the_same_run(tmp_path):
    # The backstop of the same mechanism: an output that no check listed still cannot land
    # on a file read while the run's reads are recorded.
    from pase.core.fileio import InputError, read_json, recording_reads, write_atomic

    source = tmp_path / "in.json"
    source.write_text('{"a": 1}\n')
    with recording_reads() as reads:
        read_json(str(source), "test input")
        with pytest.raises(InputError, match="test input"):
            write_atomic(str(tmp_path / "." / "in.json"), "{}", "report")
    assert [what for what, _ in reads.items()] == ["test input"]
    assert source.read_text() == '{"a": 1}\n'
    write_atomic(str(source), "{}\n", "report")  # outside the run: an ordinary write
    assert source.read_text() == "{}\n"
