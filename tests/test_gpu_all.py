"""benchmarks/gpu_all.py, the one script run on a lent GPU, without a GPU: a stage that
fails, runs over its limit (a worker it started included) or does not start is
reported and the next stages still run, with each stage's output in its log and its
target lines in the summary; every stage's command line is accepted by its script's
own parser (validations included), the compiled stage names variants that
benchmarks/compiled.py has, and each test file of the CUDA stage has CUDA tests."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_all():
    spec = importlib.util.spec_from_file_location("tp_gpu_all", ROOT / "benchmarks" / "gpu_all.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


#: a stage that starts a worker in its process group, prints, and then hangs
HANGS = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(str(worker.pid))
print("before the limit")
time.sleep(300)
"""


def test_a_failing_stage_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    g = _gpu_all()
    py, pid_file = sys.executable, tmp_path / "worker.pid"
    fake = [
        g.Stage("first", "first", [py, "-c", "print('MET: first target')"], 30),
        g.Stage("fails", "fails", [py, "-c", "print('partial'); raise SystemExit(3)"], 30),
        g.Stage("hangs", "hangs", [py, "-c", HANGS, str(pid_file)], 4),
        g.Stage("absent", "absent", [str(tmp_path / "no-such-program")], 30),
        g.Stage("last", "last", [py, "-c", "print('NOT MET: last target')"], 30),
    ]
    monkeypatch.setattr(g, "stages", lambda dry: fake)
    started = time.perf_counter()
    assert g.main(["--cpu-dry-run", "--out", str(tmp_path / "out")]) == 1
    assert time.perf_counter() - started < 4 + g.DRAIN_S + 20
    worker = int(pid_file.read_text())
    deadline = time.perf_counter() + 10
    while _alive(worker) and time.perf_counter() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the stage's worker outlived its limit"
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert text in capsys.readouterr().out
    status = dict(re.findall(r"^(\w+) +(ok|exit \d+|ran over|did not start) ", text, re.M))
    assert status == {
        "first": "ok",
        "fails": "exit 3",
        "hangs": "ran over",
        "absent": "did not start",
        "last": "ok",
    }
    assert "    MET: first target" in text and "    NOT MET: last target" in text
    logs = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.log")}
    assert "MET: first target" in logs["1-first.log"]
    assert "partial" in logs["2-fails.log"]
    assert "before the limit" in logs["3-hangs.log"]  # unbuffered: printed before the kill


#: in one process: each script's parser on each stage's arguments; the compiled stage's
#: variant names against the variants compiled.py builds (tiny models, on the CPU)
PARSE = """
import argparse, json, runpy, sys
from pathlib import Path

class Parsed(Exception):
    pass

plain = argparse.ArgumentParser.parse_args

def grab(self, args=None, namespace=None):
    raise Parsed(plain(self, args, namespace))

out, modules = {}, {}
for key, path, args in json.loads(sys.argv[1]):
    if path not in modules:
        sys.path.insert(0, str(Path(path).parent))
        modules[path] = runpy.run_path(path, run_name="tp_stage_check")
    mod = modules[path]
    try:
        if "parse_args" in mod:
            ns = mod["parse_args"](args)
        else:
            argparse.ArgumentParser.parse_args = grab
            try:
                mod["main"](args)
                raise AssertionError("main ran without parsing its arguments")
            except Parsed as p:
                ns = p.args[0]
            finally:
                argparse.ArgumentParser.parse_args = plain
    except SystemExit as e:
        out[key] = {"error": f"exit {e.code}"}
        continue
    out[key] = {"only": getattr(ns, "only", None)}
    if Path(path).name == "compiled.py":
        small = argparse.Namespace(**{**vars(ns), "layers": 1, "width": 16, "heads": 2})
        small.seq, small.device = 8, "cpu"
        init = mod["GPT"](1, 16, 2, 8).state_dict()
        out[key]["variants"] = [v.name for v in mod["variants"](small, init)]
print(json.dumps(out))
"""


def test_every_stage_command_parses_in_its_script():
    g = _gpu_all()
    jobs, pytest_stages = [], []
    for dry in (False, True):
        for s in g.stages(dry):
            if s.cmd[1:3] == ["-m", "pytest"]:
                pytest_stages.append(s)
                continue
            script = ROOT / s.cmd[1]
            assert s.cmd[0] == sys.executable and script.is_file(), s.cmd
            jobs.append((f"{s.key}/{'dry' if dry else 'gpu'}", str(script), s.cmd[2:]))
    assert {k.split("/")[0] for k, *_ in jobs} >= {"gpt2_memory", "compiled", "activations"}
    done = subprocess.run(
        [sys.executable, "-c", PARSE, json.dumps(jobs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    for key, *_ in jobs:
        assert "error" not in parsed[key], (key, done.stderr[-3000:])
    for key in ("compiled/gpu", "compiled/dry"):
        only = set(parsed[key]["only"])
        assert {"compile", "tp compiled"} <= only <= set(parsed[key]["variants"]), key
    for s in pytest_stages:
        files = [a for a in s.cmd if a.startswith("tests/")]
        assert files == g.TESTS
        for f in files:
            assert re.search(r"def test_\w*cuda", (ROOT / f).read_text()), f


def test_the_gpu_plan_fits_its_total_and_measures_compiled_training_on_cuda():
    g = _gpu_all()
    plan = g.stages(dry=False)
    assert sum(s.limit for s in plan) <= g.TOTAL_S
    assert len({s.key for s in plan}) == len(plan)
    compiled = next(s for s in plan if s.key == "compiled")
    assert compiled.cmd[compiled.cmd.index("--device") + 1] == "cuda"
    assert compiled.limit <= 120
    dry = {s.key for s in g.stages(dry=True)}
    assert dry == {s.key for s in plan}


@pytest.mark.slow
def test_the_dry_run_measures_compiled_training(tmp_path):
    """The compiled stage, tiny, on the CPU (about 100 s on a loaded 2-core machine):
    its table's two compiled rows and the three target lines reach the summary."""
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_all.py", "--cpu-dry-run", "--only", "compiled"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    text = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^compiled training +ok ", text, re.M)
    assert re.search(r"^    \| compile \|", text, re.M)
    assert re.search(r"^    \| tp compiled \|", text, re.M)
    assert len(re.findall(r"^    (NOT )?MET: ", text, re.M)) == 3
