"""The gate (mpllm.board.gate): FNV-1a 64, its MicroPython twin, host reference == engine."""

from __future__ import annotations

import json
import os
import subprocess

import engine_ext
import numpy as np
import pytest
from conftest import GOLDEN
from mpllm.board import gate
from serial_peer import find_micropython


@pytest.mark.parametrize(("data", "want"), [
    (b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)])
def test_fnv1a64_published_vectors(data: bytes, want: int) -> None:
    assert gate.fnv1a64(data) == want


@pytest.mark.parametrize("name", ["small", "medium"])
def test_fnv1a64_matches_golden_logits_hash(name: str) -> None:
    meta = json.loads((GOLDEN / name / "meta.json").read_text())
    data = (GOLDEN / name / "logits.f32").read_bytes()
    assert f"{gate.fnv1a64(data):016x}" == meta["logits_fnv1a64_hex"]


FNV_PROGRAM = """
import binascii
import llm_bench
data = binascii.unhexlify({data_hex!r})
print(llm_bench.FNV_KERNEL, sorted(llm_bench.FNV_KERNELS))
for name, (new, update, hexdigits) in sorted(llm_bench.FNV_KERNELS.items()):
    state = new()
    update(state, data[:7])
    update(state, data[7:])
    print(name, hexdigits(state))
"""


def test_micropython_fnv_equals_host(tmp_path) -> None:
    """The board's FNV-1a 64 (llm_bench.py: the viper kernel on 32-bit halves
    and the plain one) equals the host's, under MicroPython."""
    data = np.random.default_rng(7).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    data += b"\xff" * 64 + b"\x00" * 64  # carries through every limb
    prog = tmp_path / "fnv.py"
    prog.write_text(FNV_PROGRAM.format(data_hex=data.hex()))
    env = dict(os.environ, MICROPYPATH=f"{engine_ext.MODULES}:.frozen")
    out = subprocess.run([find_micropython(), str(prog)], capture_output=True, text=True,
                         check=False, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "viper ['plain', 'viper']"
    want = f"{gate.fnv1a64(data):016x}"
    assert lines[1:] == [f"plain {want}", f"viper {want}"]


@pytest.fixture(scope="module")
def release_gates(release_model) -> tuple[gate.GateResult, gate.GateResult]:
    mod = engine_ext.load()
    img = os.fspath(release_model.image)
    return gate.reference_gate(img), gate.engine_gate(img, mod)


def test_host_reference_and_engine_agree(release_gates) -> None:
    ref, eng = release_gates
    ok, text = gate.compare(ref, eng)
    assert ok, text
    assert text.endswith("PASS")
    assert len(ref.ids) == gate.N_TOKENS and ref.ids == eng.ids
    assert ref.prompt_ids == eng.prompt_ids and len(ref.prompt_ids) >= 1


def test_a_changed_logit_bit_fails(release_model) -> None:
    from mpllm.reference.forward import Reference

    ref = Reference.from_image(os.fspath(release_model.image))
    ids, rows = ref.generate([433 % ref.config.vocab_out], gate.N_LOGIT_ROWS)
    good = [r.astype("<f4").tobytes() for r in rows]
    bad = list(good)
    flipped = bytearray(bad[19])
    flipped[4 * 1234] ^= 1  # one ulp of one logit in the last hashed row
    bad[19] = bytes(flipped)
    h_good = gate.fnv1a64(gate.gate_bytes(good, "text"))
    h_bad = gate.fnv1a64(gate.gate_bytes(bad, "text"))
    assert h_good != h_bad
    a = gate.GateResult(f"{h_good:016x}", [1], ids * 10, "a")
    b = gate.GateResult(f"{h_bad:016x}", [1], ids * 10, "b")
    ok, text = gate.compare(a, b)
    assert not ok and text.endswith("FAIL") and "logits bytes differ" in text


def test_parse_gate_line_errors() -> None:
    with pytest.raises(ValueError, match="no MPLLM-GATE line"):
        gate.parse_gate_line("Traceback: boom", "board")
    line = "MPLLM-GATE 0123456789abcdef 2 " + " ".join(["5"] * (2 + gate.N_TOKENS))
    r = gate.parse_gate_line("noise\r\n" + line + "\r\n", "board")
    assert r.hash == "0123456789abcdef" and r.prompt_ids == [5, 5]
    with pytest.raises(ValueError, match="ids, expected"):
        gate.parse_gate_line("MPLLM-GATE 0123456789abcdef 2 1 2 3", "board")
    # a short context decodes fewer (never fewer than the hashed logits rows)
    for n, ok in ((gate.N_LOGIT_ROWS, True), (gate.N_LOGIT_ROWS - 1, False),
                  (gate.N_TOKENS + 1, False)):
        line = "MPLLM-GATE 0123456789abcdef 2 " + " ".join(["5"] * (2 + n))
        if ok:
            assert len(gate.parse_gate_line(line, "board").ids) == n
        else:
            with pytest.raises(ValueError, match="ids, expected"):
                gate.parse_gate_line(line, "board")
    with pytest.raises(ValueError, match="20 logits rows"):
        gate.gate_bytes([b""] * 3, "")


def test_a_short_context_gates_what_it_holds(tiny_model, capsys) -> None:  # type: ignore[no-untyped-def]
    """A model opened with fewer positions than the gate decodes (a board
    without PSRAM opens stories260K at 91) decodes what its context holds;
    the host hashes the same count and the hashes agree."""
    import llm
    import llm_bench

    engine_ext.load()
    image = os.fspath(tiny_model.image)
    session = llm.Session()
    session.load(image, context=40)
    llm_bench.gate(gate.PROMPT, gate.N_TOKENS, gate.N_LOGIT_ROWS, session=session)
    got = gate.parse_gate_line(capsys.readouterr().out, "engine at context 40")
    assert len(got.prompt_ids) + len(got.ids) - 1 == 40
    ref = gate.reference_gate(image, n_tokens=len(got.ids))
    ok, text = gate.compare(ref, got)
    assert ok, text
    assert f"greedy text of {len(got.ids)} tokens" in text and "context holds" in text
    session.load(image, context=len(got.prompt_ids) + gate.N_LOGIT_ROWS - 2)
    with pytest.raises(ValueError, match="the gate needs"):
        llm_bench.gate(gate.PROMPT, gate.N_TOKENS, gate.N_LOGIT_ROWS, session=session)
    with pytest.raises(ValueError, match="decodes 20..200 tokens"):
        gate.reference_gate(image, n_tokens=gate.N_LOGIT_ROWS - 1)


def test_expect_refuses_a_short_board_gate(tiny_model, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """--expect holds a hash of the gate's 200 tokens: a board whose context
    held fewer is told to compare with the host instead, not given a FAIL
    that blames the logits."""
    from mpllm.board import bench_cli

    short = gate.GateResult("0123456789abcdef", [1, 2], list(range(87)), "board")
    monkeypatch.setattr(bench_cli, "port_gate", lambda *a, **k: short)
    rc = bench_cli.main(["--port", "socket://localhost:1", "--gate", "--image",
                         os.fspath(tiny_model.image),
                         "--expect", "0123456789abcdef"])
    assert rc == 2
    assert "held 87: leave --expect out" in capsys.readouterr().err
