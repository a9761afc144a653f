"""The switches for what only a board can price (llm.h: llm_set_preload; the
K-as-dots switch, set_k_dots, has its own tests in test_kv_dots.py): with
each on or off the engine gives the same tokens and logits bits, and the
host port's preload hook is called when the switch is on and never when off.

Also `bench.py --ab` (tools/mpllm/board/bench_cli.py, firmware/modules/
llm_bench.py ab()): its JSON's keys, its refusal of a switch that changed a
story, and the cost model's refit of the fill/compute overlap from that JSON
(costmodel/ab.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import engine_ext
import pytest
import story_matrix

_llm = engine_ext.load()


def _story(image: str, prompt: list[int], sampler: tuple[float, int, int], n: int, *,
           preload: bool, plain: bool = False) -> tuple[list[int], list[str], dict]:
    """n tokens one step at a time, the sha256 of every evaluation's logits, the stats."""
    with _llm.Model(image, plain=plain) as m:
        m.set_preload(preload)
        m.sampler(*sampler)
        seq = m.config()["seq_len"]
        tokens = [m.prefill(prompt)]
        rows = [hashlib.sha256(m.logits()).hexdigest()]
        while len(tokens) < n and m.pos() < seq:
            tokens.append(m.step(tokens[-1]))
            rows.append(hashlib.sha256(m.logits()).hexdigest())
        return tokens, rows, m.stats()


@pytest.mark.parametrize("name", ["demo", "release"])
def test_preload_changes_no_bit(request: pytest.FixtureRequest, engine_image,  # type: ignore[no-untyped-def]
                                name: str) -> None:
    """Greedy and sampled stories with preload on are plain mode's and preload
    off's, token for token and logits row for logits row; the hook is called
    (for the KV rows, the next matrices and the head's next tiles) only while
    the switch is on, and never in plain mode."""
    image = str(request.getfixturevalue("demo_image") if name == "demo"
                else engine_image(name))
    with _llm.Model(image) as m:
        vocab = m.config()["vocab_out"]
    n = 24 if name == "release" else 48
    samplers = story_matrix.SAMPLERS if name == "demo" else story_matrix.SAMPLERS[:2]
    for prompt in story_matrix.prompts(vocab, 3):
        for sampler in samplers:
            ref = _story(image, prompt, sampler, n, preload=False, plain=True)
            off = _story(image, prompt, sampler, n, preload=False)
            on = _story(image, prompt, sampler, n, preload=True)
            assert on[:2] == off[:2] == ref[:2], (prompt, sampler)
            assert off[2]["preloads"] == 0 and off[2]["preload_bytes"] == 0
            assert on[2]["preloads"] > 0 and on[2]["preload_bytes"] > 0
            assert ref[2]["preloads"] == 0  # plain mode: every speed-up off
    # the preload byte counts: every hint at most LLM_PRELOAD_MAX_BYTES
    _t, _r, st = _story(image, [1, 2, 3], (0.0, 0, 0), 8, preload=True)
    assert st["preload_bytes"] <= 8192 * st["preloads"]


def test_preload_switch_at_runtime(demo_image) -> None:  # type: ignore[no-untyped-def]
    """set_preload/preload through the binding: off by default, on and off again
    mid-story with the same story as never on; a bad argument is refused."""
    image = str(demo_image)
    ref, ref_rows, _ = _story(image, [5, 6], (0.8, 40, 3), 40, preload=False)
    with _llm.Model(image) as m:
        assert m.preload() is False
        m.sampler(0.8, 40, 3)
        tokens = [m.prefill([5, 6])]
        rows = [hashlib.sha256(m.logits()).hexdigest()]
        counts = []
        for i in range(1, 40):
            m.set_preload(i % 10 < 5)
            assert m.preload() is (i % 10 < 5)
            before = m.stats()["preloads"]
            tokens.append(m.step(tokens[-1]))
            rows.append(hashlib.sha256(m.logits()).hexdigest())
            counts.append((i % 10 < 5, m.stats()["preloads"] - before))
        assert tokens == ref and rows == ref_rows
        assert all((n > 0) == on for on, n in counts), counts
        with pytest.raises(TypeError):
            m.set_preload()  # type: ignore[call-arg]


# ---- bench.py --ab -----------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tools" / "bench.py"


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tools"), engine_ext.PYTHONPATH,
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          check=False, timeout=timeout, env=env)


def _check_ab_json(data: dict, switches: tuple[str, ...]) -> None:
    """The documented keys (costmodel.AB_KEYS, AB_SWITCH_KEYS) and their sense."""
    from mpllm import costmodel as cm

    assert set(data) == set(cm.AB_KEYS)
    assert data["kind"] == "mpllm-ab" and data["version"] == 1
    stages = {*cm.STAGES, "total"}
    assert set(data["switches"]) == set(switches)
    for sw in data["switches"].values():
        assert set(sw) == set(cm.AB_SWITCH_KEYS)
        assert sw["status"] == "measured" and sw["same_output"] is True
        assert set(sw["off"]) == set(sw["on"]) == set(sw["ratio"]) == stages
        assert sw["ratio"]["total"] == pytest.approx(sw["on"]["total"] / sw["off"]["total"])
        assert sw["overlap"]["off"] == data["overlap"]["value"]
    assert set(data["baseline"]) == {"greedy", "sampled"}
    for base in data["baseline"].values():
        assert set(base) == {"stage_ms", "positions", "rows_fraction", "runs"}
        assert 0.0 < base["rows_fraction"] <= 1.0
    assert set(data["overlap"]) == {"value", "physical", "stages", "was"}
    # interleaved: per switch, each round off then on, every run in each
    order = [(m["switch"], m["round"], m["on"]) for m in data["measurements"]]
    n_runs = len(data["runs"])
    want = [(s, r, on) for s in switches for r in range(data["rounds"])
            for on in (False, True) for _ in range(n_runs)]
    assert order == want


def test_ab_on_the_host_board(demo_image, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """bench.py --board host --ab: both switches, two rounds, greedy and sampled;
    the JSON has the documented keys, every switch kept every run's ids and
    logits hash; its refit moves the overlap to what the JSON's stages say."""
    out = tmp_path / "ab.json"
    r = _bench("--board", "host", "--ab", "--image", str(demo_image), "--tokens", "16",
               "--prompt", "Once upon a time", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preload    on/off" in r.stdout and "k_dots     on/off" in r.stdout
    assert "fill/compute overlap fitted from the stages" in r.stdout
    data = json.loads(out.read_text())
    _check_ab_json(data, ("preload", "k_dots"))
    assert all(m["preloads"] > 0 for m in data["measurements"]
               if m["switch"] == "preload" and m["on"])
    assert all(m["preloads"] == 0 for m in data["measurements"] if not m["on"])
    _check_refit(data, tmp_path)


def _check_refit(data: dict, tmp_path: Path) -> None:
    """The refit takes the overlap the JSON's own stage times imply: as written
    (a host's stages are no S3's: outside [0, 1], priced clamped), and with its
    baseline rewritten to what an S3 at overlap 0.9 would time."""
    from mpllm import costmodel as cm

    f0 = cm.fit()
    f1, detail = cm.refit(data)
    assert detail["value"] == pytest.approx(data["overlap"]["value"], rel=1e-12)
    assert f1.overlap == min(1.0, max(0.0, detail["value"]))
    assert dataclasses.replace(f1, overlap=f0.overlap) == f0  # nothing else moved

    # a board whose stages take what the model prices at overlap 0.9 (its own
    # work: the JSON's shape, positions and head rows) refits to 0.9
    board = json.loads(json.dumps(data))
    shape = cm.Shape.from_config(data["config"])
    at = dataclasses.replace(f0, overlap=0.9)
    for mode, base in board["baseline"].items():
        b = dataclasses.replace(cm.BUILDS[cm.AB_BUILDS[mode]], rows_fraction=base["rows_fraction"])
        work = cm.build_work(b, shape, base["positions"])
        for st in cm.STAGES:
            base["stage_ms"][st] = 1e3 * cm.stage_seconds(work[st], at)
    f2, d2 = cm.refit(board)
    assert f2.overlap == pytest.approx(0.9, abs=1e-9) and d2["physical"]
    summary = cm.refit_summary(board)
    for mode, p in summary["release_ms"].items():  # more hidden than 0.62: faster
        assert p["after_ms"] < p["before_ms"], mode
        assert p["after_ms"] == pytest.approx(
            cm.predict(cm.BUILDS[cm.AB_BUILDS[mode]], f2)["total"])
    path = tmp_path / "board.json"
    path.write_text(json.dumps(board))
    r = _bench("--model-s3", "--refit", str(path), "--json", str(tmp_path / "refit.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-> 0.900 fitted from its stages" in r.stdout, r.stdout
    assert json.loads((tmp_path / "refit.json").read_text())["overlap"]["used"] == \
        pytest.approx(0.9)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"kind": "mpllm-bench"}))
    r = _bench("--model-s3", "--refit", str(wrong))
    assert r.returncode == 1 and "not a bench.py --ab report" in r.stderr, r.stderr
    r = _bench("--refit", str(path))
    assert r.returncode == 2 and "give --model-s3 too" in r.stderr


def test_ab_refuses_a_switch_that_changed_a_story(demo_image) -> None:  # type: ignore[no-untyped-def]
    """A run whose ids or logits hash differ with the switch on is an error
    naming the switch, the run and the state (the report is never written)."""
    from mpllm.board import bench_ab, bench_runs

    runs = bench_runs.default_runs(("Once upon a time",))
    rep_args = (runs, 12, ("preload",), 1)
    good = bench_ab.run_ab_host(demo_image, *rep_args[:2], switches=rep_args[2],
                                rounds=rep_args[3])
    parsed = {"info": {k: good[k] for k in ("build_info", "config", "memory")},
              "measurements": good["measurements"], "skipped": {}}
    parsed["info"]["mode"] = "exact"
    again = bench_ab.ab_report(parsed, runs, 12, 1, bench_ab.AB_ROWS, "host")
    assert again["switches"] == good["switches"]
    for field, what in (("hash", "logits hash"), ("ids", "ids")):
        bad = json.loads(json.dumps(parsed))
        m = next(x for x in bad["measurements"] if x["on"] and x["run"] == 1)
        m[field] = "0" * 16 if field == "hash" else m["ids"][:-1] + [m["ids"][-1] + 1]
        with pytest.raises(ValueError, match=rf"switch preload changed the output of run 1 "
                                             rf"\('Once upon a time', sampled\): its {what} "
                                             r"with the switch on in round 0 differs"):
            bench_ab.ab_report(bad, runs, 12, 1, bench_ab.AB_ROWS, "host")


def test_ab_through_the_serial_peer(micropython, demo_image, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """bench.py --port PEER --ab: MicroPython's unix port with the real `_llm`
    (the shared binding, the host port's preload hook) behind a pseudo-terminal;
    the same ids and hashes as the host board, and a JSON the model refits from."""
    from serial_peer import SerialPeer

    out = tmp_path / "port.json"
    with SerialPeer([ROOT / "firmware" / "modules"], micropython=str(micropython)) as peer:
        r = _bench("--port", peer.port, "--port-image", str(demo_image), "--ab", "--tokens",
                   "12", "--prompt", "Once upon a time", "--ab-rounds", "1", "--json",
                   str(out), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    _check_ab_json(data, ("preload", "k_dots"))
    host = _bench("--board", "host", "--ab", "--image", str(demo_image), "--tokens", "12",
                  "--prompt", "Once upon a time", "--ab-rounds", "1", "--json",
                  str(tmp_path / "host.json"))
    assert host.returncode == 0, host.stdout + host.stderr
    on_host = json.loads((tmp_path / "host.json").read_text())["measurements"]
    assert [(m["ids"], m["hash"]) for m in data["measurements"]] == \
        [(m["ids"], m["hash"]) for m in on_host]
    _check_refit(data, tmp_path)
