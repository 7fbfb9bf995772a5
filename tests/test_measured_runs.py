"""Reading a user's measured runs (``pase/planning/measured_runs.py``): JSON and CSV, every field
checked, each bad file one line."""

from __future__ import annotations

import json

import pytest

from pase.planning.measured_runs import MeasuredRun, read_runs

GOOD = {"name": "a", "graph": "hf:benchmarks/configs/nanotron-1b.json", "devices": 8, "batch": 256,
        "sequence": 4096, "recipe": "dp=8,tp=1,pp=1,zero=1,microbatch=1,recompute=none",
        "tokens_per_second_per_device": 16000.0, "peak_memory_gib": 40.5, "memory": "reserved"}


def _write(tmp_path, data, name="runs.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_a_json_list_and_the_step_it_means(tmp_path):
    runs = read_runs(_write(tmp_path, [GOOD, dict(GOOD, name="b", tokens_per_second_per_device=None,
                                                   step_seconds=9.5, peak_memory_gib=None, memory=None)]))
    assert [r.name for r in runs] == ["a", "b"]
    # 256 sequences x 4096 tokens / (16000 tokens/s x 8 devices) = 8.192 s.
    assert runs[0].measured_step() == pytest.approx(8.192, rel=1e-12)
    assert runs[1].measured_step() == 9.5 and runs[1].memory is None
    assert isinstance(runs[0], MeasuredRun) and runs[0].devices == 8 and runs[0].memory == "reserved"


def test_runs_under_a_key_and_names_by_place(tmp_path):
    bare = {k: v for k, v in GOOD.items() if k != "name"}
    runs = read_runs(_write(tmp_path, {"runs": [bare, bare]}))
    assert [r.name for r in runs] == ["run 1", "run 2"]


def test_a_csv_file(tmp_path):
    text = ("name,graph,devices,batch,sequence,recipe,step_seconds,peak_memory_gib,memory\n"
            "x,gpt2-small,8,16,,\"dp=8,zero=1\",0.5,,\n"
            "y,gpt2-small,16,32,1024,\"dp=16,zero=1\",0.75,12.5,allocated\n")
    runs = read_runs(_write(tmp_path, text, "runs.csv"))
    assert runs[0].sequence is None and runs[0].recipe == "dp=8,zero=1" and runs[0].step_seconds == 0.5
    assert runs[1].peak_memory_gib == 12.5 and runs[1].memory == "allocated" and runs[1].devices == 16
    # Without a sequence the step from tokens/s is not known here (the graph's own sequence is).
    assert runs[0].measured_step() == 0.5


@pytest.mark.parametrize("data, message", [
    ([], "no runs"),
    ({"rows": []}, "expected a JSON list of runs"),
    ([3], "each run must be an object"),
    ([dict(GOOD, colour="red")], "unknown field 'colour'"),
    ([{k: v for k, v in GOOD.items() if k != "recipe"}], "missing field 'recipe'"),
    ([dict(GOOD, devices=0)], "devices must be a positive integer"),
    ([dict(GOOD, devices=8.5)], "devices must be a positive integer"),
    ([dict(GOOD, devices=True)], "devices must be a positive integer"),
    ([dict(GOOD, batch="many")], "batch must be a positive integer, got 'many'"),
    ([dict(GOOD, batch=10 ** 400)], "batch must be at most"),
    ([dict(GOOD, tokens_per_second_per_device=-1)], "tokens_per_second_per_device must be a positive"),
    ([dict(GOOD, step_seconds=2.0)], "exactly one of tokens_per_second_per_device and step_seconds"),
    ([dict(GOOD, tokens_per_second_per_device=None)], "(neither is given)"),
    ([dict(GOOD, memory="nvidia-smi")], "memory must be one of reserved, allocated"),
    ([dict(GOOD, peak_memory_gib=None)], "peak_memory_gib is not given"),
    ([dict(GOOD, graph="")], "missing field 'graph'"),
    ([GOOD, GOOD], "run 2: name 'a' is also run 1's"),
])
def test_bad_runs_are_one_line(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(ValueError) as e:
        read_runs(path)
    text = str(e.value)
    assert message in text and "\n" not in text and path in text


def test_bad_files_are_one_line(tmp_path):
    for text, name, message in [("{not json", "r.json", "runs file"),
                                ("", "r.csv", "empty CSV file"),
                                ("graph,devices\nx,1,2\n", "r.csv", "more values than the header's 2 fields"),
                                ("\xff\xfe", "r.csv", None)]:
        path = tmp_path / name
        if message is None:
            path.write_bytes(b"\xff\xfe\x00")
            message = "is not UTF-8 text"
        else:
            path.write_text(text)
        with pytest.raises(ValueError) as e:
            read_runs(str(path))
        assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="cannot read runs file"):
        read_runs(str(tmp_path / "absent.csv"))
