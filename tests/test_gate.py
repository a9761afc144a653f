"""The gate (mpllm.gate): FNV-1a 64, its MicroPython twin, host reference == engine."""

from __future__ import annotations

import json
import os
import subprocess

import engine_ext
import numpy as np
import pytest
from conftest import GOLDEN
from mpllm import gate
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


def _snippet_hash_program(data_hex: str, force_plain: bool) -> str:
    head = gate.gate_snippet("").split("\ndef _gate(")[0]
    head = head.replace("import _llm\n", "").replace("import llm\n", "")
    if force_plain:  # the fallback branch, as on a port without the native emitter
        head = head.replace("import micropython\n", "import no_such_module_here\n")
    return head + (
        "\nimport binascii\n"
        f"_data = binascii.unhexlify({data_hex!r})\n"
        "_fnv_update(_state, _data[:7])\n_fnv_update(_state, _data[7:])\n"
        "print('viper' if _FNV_HEX else 'plain', _fnv_hex(_state))\n")


@pytest.mark.parametrize("force_plain", [False, True])
def test_micropython_fnv_equals_host(tmp_path, force_plain: bool) -> None:
    data = np.random.default_rng(7).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    data += b"\xff" * 64 + b"\x00" * 64  # carries through every limb
    prog = tmp_path / "fnv.py"
    prog.write_text(_snippet_hash_program(data.hex(), force_plain))
    out = subprocess.run([find_micropython(), str(prog)], capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    kind, h = out.stdout.split()
    assert kind == ("plain" if force_plain else "viper")
    assert h == f"{gate.fnv1a64(data):016x}"


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
    from mpllm.reference import Reference

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
    with pytest.raises(ValueError, match="20 logits rows"):
        gate.gate_bytes([b""] * 3, "")
