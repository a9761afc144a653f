"""tools/bench.py end to end: the host board, the gate CLI, and a real serial
link (MicroPython unix on a pty, driven through mpremote's transport)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import engine_ext
import pytest
from serial_peer import SerialPeer

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tools" / "bench.py"
MODULES = ROOT / "firmware" / "modules"
REPLAY = ROOT / "tests" / "helpers" / "replay"


@pytest.fixture(scope="module", autouse=True)
def built_llm() -> None:
    engine_ext.load()  # the CLI imports the in-place build (engine_ext.PYTHONPATH)


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tools"), engine_ext.PYTHONPATH,
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env=env)


def test_gate_pass_on_the_host_board(release_model) -> None:
    r = bench("--board", "host", "--gate", "--image", str(release_model.image))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "PASS"
    hashes = [ln.split()[-1] for ln in lines if ln.startswith("  ")]
    assert len(hashes) == 2 and hashes[0] == hashes[1] and len(hashes[0]) == 16


def test_gate_fail_exits_1(release_model) -> None:
    # the hash of a different computation: the engine's must not match it
    r = bench("--board", "host", "--gate", "--image", str(release_model.image),
              "--expect", "0123456789abcdef")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "FAIL"


def test_board_gate_needs_the_image_the_board_runs() -> None:
    r = bench("--port", "/dev/null", "--gate")
    assert r.returncode == 2 and "needs --image" in r.stderr


def test_host_gate_defaults_to_the_demo_model() -> None:
    r = bench("--board", "host", "--gate")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "PASS"


def test_host_bench_writes_json_and_plot(small_model, tmp_path) -> None:
    out = tmp_path / "host.json"
    r = bench("--board", "host", "--image", str(small_model.image), "--tokens", "24",
              "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "build_info: mpllm" in r.stdout and "round trip" in r.stdout
    data = json.loads(out.read_text())
    (res,) = data["results"]
    assert len(res["runs"]) == 6  # 3 prompts x (greedy, sampled)
    for run in res["runs"]:
        assert run["tokens"] == 24
        assert run["engine_ms_per_token"] > 0 and run["roundtrip_tok_s"] > 0
        assert set(run["stage_ms_per_token"]) == {"embed", "attn", "ffn", "ple", "head",
                                                  "sample"}
    greedy = [x for x in res["runs"] if x["mode"] == "greedy"]
    sampled = [x for x in res["runs"] if x["mode"] == "sampled"]
    assert len(greedy) == len(sampled) == 3
    assert any(row[1] == "bulk" for row in res["memory"])
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # the certified head's share of rows and the traffic per decoded token
    fracs = [x["head_rows_fraction"] for x in res["runs"]]
    assert all(0 < f <= 1 for f in fracs)
    assert res["head_rows_fraction"] == pytest.approx(sum(fracs) / len(fracs))
    assert set(res["bytes_per_token"]) == {"flash", "fast", "bulk"}
    assert res["bytes_per_token"]["bulk"] > 0 and res["bytes_per_token"]["flash"] > 0
    assert "head rows scored per token" in r.stdout and "bytes read per token" in r.stdout


def test_model_s3_prints_our_prediction(release_model, tmp_path) -> None:
    r = bench("--model-s3", "--image", str(release_model.image), "--plot",
              str(tmp_path / "s3.png"), "--json", str(tmp_path / "s3.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mpllm (ours)" in r.stdout and "counters: measured" in r.stdout
    assert "ours, predicted ms/token per stage" in r.stdout
    data = json.loads((tmp_path / "s3.json").read_text())
    assert data["measured"]["pie_per_call"]["head"] > 0
    assert (tmp_path / "s3.png").read_bytes()[:4] == b"\x89PNG"


def test_mpremote_exec_against_the_serial_peer() -> None:
    with SerialPeer([MODULES]) as peer:
        # mpremote soft-resets first (the peer restarts MicroPython, as a board would)
        code = ("import llm, sys; d = llm.Utf8Decoder(); "
                "print(sys.implementation.name, d.feed(b'\\xc3') + d.feed(b'\\xa9'))")
        r = subprocess.run([sys.executable, "-m", "mpremote", "connect", peer.port, "exec",
                            code], capture_output=True, text=True, check=False, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip() == "micropython \u00e9"
        assert peer.soft_resets == 1
        # an exception on the device comes back as mpremote's error
        r = subprocess.run([sys.executable, "-m", "mpremote", "connect", peer.port, "resume",
                            "exec", "raise ValueError('from the peer')"], capture_output=True,
                           text=True, timeout=60, check=False)
        assert r.returncode != 0 and "from the peer" in r.stdout + r.stderr


RECORD = """
import sys
sys.path[:0] = [{modules!r}, {ext!r}, {tools!r}, {replay!r}]
import record
record.install({out!r})
from mpllm.board import bench, bench_runs
bench.run_host({image!r}, [bench_runs.RunSpec("Once upon a time", 0.0, 0, 0)], {n}, progress=False)
record.save()
"""


def test_bench_port_against_the_serial_peer(small_model, tmp_path) -> None:
    """bench.py --port over a real pty: MicroPython unix running llm.py with
    the replay double of `_llm` (tests/helpers/replay), replaying what the real
    engine answered to the very same bench snippet (recorded by
    tests/helpers/replay/record.py)."""
    rec_dir = tmp_path / "recording"
    code = RECORD.format(modules=str(MODULES), ext=str(engine_ext.EXT_DIR),
                         tools=str(ROOT / "tools"), replay=str(REPLAY), out=str(rec_dir),
                         image=str(small_model.image), n=20)
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    out = tmp_path / "port.json"
    from mpllm.board import bench as bench_mod

    def on_board(code: str) -> str:
        chunks: list[bytes] = []
        err = bench_mod.run_port_snippet(peer.port, code, consumer=chunks.append)
        assert not err, err
        return b"".join(chunks).decode()

    with SerialPeer([REPLAY, MODULES], env={"MPLLM_REPLAY": str(rec_dir)}) as peer:
        # the user's session has the model open, in plain mode
        assert "OPEN" in on_board("import llm\nllm.load(plain=True)\nprint('OPEN')")
        r = bench("--port", peer.port, "--greedy-only", "--prompt", "Once upon a time",
                  "--tokens", "20", "--json", str(out), "--quiet", timeout=300)
        # ... and still has it, in the same mode, after the bench
        after = on_board("import llm\nprint('STILL', llm.default_session.model is not None and "
                         "llm.default_session.model.plain())")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "STILL True" in after, (after, peer.soft_resets)
    assert "engine" in r.stdout and "round trip" in r.stdout
    data = json.loads(out.read_text())
    (res,) = data["results"]
    (run,) = res["runs"]
    assert run["mode"] == "greedy" and run["tokens"] == 20 and run["roundtrip_tok_s"] > 0
    # the tokens that crossed the serial link are the real engine's
    recorded = json.loads((rec_dir / "replay.json").read_text())["runs"][0]["tokens"]
    host = subprocess.run([sys.executable, str(BENCH), "--board", "host", "--image",
                           str(small_model.image), "--greedy-only", "--prompt",
                           "Once upon a time", "--tokens", "20", "--json",
                           str(tmp_path / "h.json"), "--quiet", "--no-plot"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": engine_ext.PYTHONPATH})
    assert host.returncode == 0, host.stderr
    (hrun,) = json.loads((tmp_path / "h.json").read_text())["results"][0]["runs"]
    assert run["text"] == hrun["text"] and len(recorded) == 20


def test_compare_plain_checks_tokens_and_prints_the_ratio(small_model, tmp_path) -> None:
    r = bench("--board", "host", "--image", str(small_model.image), "--tokens", "12",
              "--compare-plain", "--json", str(tmp_path / "c.json"), "--quiet", "--no-plot")
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "than plain" in x)
    assert "same tokens in 6/6 runs" in line
    boards = [x["board"] for x in json.loads((tmp_path / "c.json").read_text())["results"]]
    assert boards == [f"host:{small_model.image.name}", f"host:{small_model.image.name} (plain)"]


def test_compare_plain_flags_a_changed_story() -> None:
    from mpllm.board.bench_runs import BenchResult, RunResult, compare_plain

    def result(text: str) -> BenchResult:
        stages = dict.fromkeys(("embed", "attn", "ffn", "ple", "head", "sample"), 0.2)
        run = RunResult("p", "greedy", 1, 5, text, 1.0, stages, 1.0, 1.0, 1.0, 1.0, 1.0)
        return BenchResult("host", "info", {}, [], [run])

    assert compare_plain(result("a story"), result("a story"))[1]
    line, ok = compare_plain(result("a story"), result("a storm"))
    assert not ok and "same tokens in 0/1 runs" in line


def test_the_cost_models_plot_goes_beside_its_json(tmp_path) -> None:
    from mpllm.board import bench_cli

    args = bench_cli.build_parser().parse_args(["--model-s3", "--json", str(tmp_path / "s3.json")])
    assert bench_cli._plot_path(args) == tmp_path / "s3.png"  # not into the working folder
    args = bench_cli.build_parser().parse_args(["--model-s3"])
    assert bench_cli._plot_path(args) == Path("costmodel-s3.png")


@pytest.mark.parametrize("device", ["/dev/null", "/dev/stdout"])
def test_json_to_a_device_is_written_in_place_and_no_plot_goes_beside_it(
        device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--json /dev/null: devices are written in place, so there is no
    "/dev/null.png" beside it to refuse (before: the run was refused)."""
    from mpllm.atomic import check_output
    from mpllm.board import bench_cli

    for argv in (["--model-s3", "--json", device], ["--board", "host", "--json", device]):
        args = bench_cli.build_parser().parse_args(argv)
        assert bench_cli._outputs(args) == [Path(device)]
        for path in bench_cli._outputs(args):
            check_output(path)
        assert not bench_cli._plotting(args)
    assert f"plot skipped: --json {device} is written in place" in capsys.readouterr().err
    # --plot still names one
    args = bench_cli.build_parser().parse_args(["--model-s3", "--json", device, "--plot", "p.png"])
    assert bench_cli._plot_path(args) == Path("p.png")


def test_model_s3_prices_a_llama2c_image_by_its_shape(llama2c_image, capsys) -> None:
    """--model-s3 --image of a llama2.c model gives that shape's figures (as
    --shape), not the release model's prediction (before: "not release-shaped,
    using the analytic counts", then minutes measuring the esp32-ai demo, and no
    figure of the image given); a shape the cost model does not price is said
    in one line, exit 2."""
    from mpllm.board import bench_cli

    assert bench_cli.main(["--model-s3", "--image", str(llama2c_image("untied")),
                           "--no-plot"]) == 0
    cap = capsys.readouterr()
    assert "a llama2.c model of the stories260k shape" in cap.err
    assert cap.out.startswith("ESP32-S3 cost model, llama2.c stories260k")
    assert "N8 (no PSRAM)" in cap.out and "demo model" not in cap.out + cap.err
    # llama2.c's longest context: a seq_len of 1024 is no priced shape
    assert bench_cli.main(["--model-s3", "--image", str(llama2c_image("long")),
                           "--no-plot"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.splitlines()) == 1
    assert "seq_len 1024) of a shape the S3 cost model does not price" in cap.err


def test_a_bad_image_is_one_line_without_matplotlib(tmp_path, monkeypatch, capsys) -> None:
    """Without matplotlib, a missing --image is still the one line (before: "plot
    skipped: matplotlib is not installed" came first), and --shape, which plots
    nothing, says nothing of plots."""
    from mpllm.board import bench_cli

    def no_matplotlib() -> bool:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)",
              file=sys.stderr)
        return False

    monkeypatch.setattr(bench_cli, "_have_matplotlib", no_matplotlib)
    assert bench_cli.main(["--board", "host", "--image", str(tmp_path / "nope.img")]) == 2
    assert capsys.readouterr().err == f"bench.py: --image {tmp_path / 'nope.img'}: file not found\n"
    assert bench_cli.main(["--model-s3", "--shape", "stories260k"]) == 0
    assert "plot" not in capsys.readouterr().err
