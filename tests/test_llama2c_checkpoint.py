"""llama2.c checkpoints (v0 legacy, v1 fp32, v2 Q8_0) read by mpllm.formats.llama2c:
written here as llama2.c's export.py lays them out, read back, and every
malformed file refused with its own message. The real stories260K-shaped
checkpoint in ../shared/llama2c/ (read there, never copied) is read when present.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from llama2c_models import STORIES260K_BIN, random_checkpoint
from mpllm.formats import llama2c
from mpllm.formats.llama2c import CheckpointError, Llama2cCheckpoint, Llama2cConfig


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_each_version_reads_back(version, shared):
    ck = random_checkpoint(shared)
    back = llama2c.read_checkpoint(llama2c.checkpoint_bytes(ck, version, group_size=16))
    assert back.version == version and back.config == ck.config
    assert (back.classifier is None) == shared
    tol = 0 if version < 2 else 0.2 * 5 / 127  # Q8_0: half a step of the largest group
    for name in llama2c.LAYER_MATRICES:
        assert back.layers[name].shape == ck.layers[name].shape
        assert np.abs(back.layers[name] - ck.layers[name]).max() <= tol, name
    for a, b in ((back.tok_embeddings, ck.tok_embeddings), (back.output, ck.output)):
        assert np.abs(a - b).max() <= tol
    # norms stay fp32 in every version
    assert np.array_equal(back.attention_norm, ck.attention_norm)
    assert np.array_equal(back.norm, ck.norm)
    assert back.group_size == (16 if version == 2 else 0)


def test_v2_values_are_codes_times_their_group_scale():
    ck = random_checkpoint()
    data = llama2c.checkpoint_bytes(ck, 2, group_size=16)
    back = llama2c.read_checkpoint(data)
    at = 256 + 4 * (2 * 32 + 2 * 32 + 32)  # after the norms: tok_embeddings' codes
    codes = np.frombuffer(data, np.int8, 96 * 32, at).astype(np.float32)
    scales = np.frombuffer(data, "<f4", 96 * 32 // 16, at + 96 * 32)
    assert np.array_equal(back.tok_embeddings.reshape(-1), (codes.reshape(-1, 16) * scales[:, None]).reshape(-1))


def _v1(ck: Llama2cCheckpoint) -> bytearray:
    return bytearray(llama2c.checkpoint_bytes(ck, 1))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:20], "too short for a llama2.c header"),
    (lambda b: b[:100], "too short for its 256-byte header"),
    (lambda b: b[:4] + struct.pack("<i", 3) + b[8:], "version 3"),
    (lambda b: b[:-1], "truncated in the classifier|truncated in layer 1 w3"),
    (lambda b: b + b"\0" * 4, "4 bytes after the last tensor"),
    (lambda b: b[:8] + struct.pack("<i", 30) + b[12:], "n_heads 4 does not split dim 30 into heads"),
    (lambda b: b[:24] + struct.pack("<i", 3) + b[28:], "n_kv_heads 3 does not divide n_heads 4"),
    (lambda b: b[:8] + struct.pack("<i", -32) + b[12:], "dim -32 is out of range: the engine holds 1..8192"),
    (lambda b: b[:36] + b"\x07" + b[37:], "shared_classifier flag 7"),
    (lambda b: b[:256] + struct.pack("<f", float("nan")) + b[260:], "attention_norm holds NaN"),
])
def test_bad_checkpoints_get_their_own_message(damage, message):
    with pytest.raises(CheckpointError, match=message):
        llama2c.read_checkpoint(bytes(damage(_v1(random_checkpoint(shared=False)))))


def test_v0_vocab_sign_and_sizes():
    ck = random_checkpoint(shared=False)
    data = llama2c.checkpoint_bytes(ck, 0)
    assert struct.unpack_from("<7i", data)[5] == -96  # negative: an unshared classifier
    with pytest.raises(CheckpointError, match="bytes after the last tensor"):
        llama2c.read_checkpoint(data + bytes(8))
    with pytest.raises(CheckpointError, match="truncated in the classifier"):
        llama2c.read_checkpoint(data[:-8])
    assert llama2c.is_checkpoint(data) and not llama2c.is_checkpoint(b"PLE\0" + bytes(100))


def test_v2_group_size_is_checked():
    data = bytearray(llama2c.checkpoint_bytes(random_checkpoint(), 2, group_size=16))
    data[37:41] = struct.pack("<i", 0)
    with pytest.raises(CheckpointError, match="group_size 0 is out of range"):
        llama2c.read_checkpoint(bytes(data))
    data[37:41] = struct.pack("<i", 7)  # 7 does not divide the tensors
    with pytest.raises(CheckpointError, match="not a multiple of the group size 7"):
        llama2c.read_checkpoint(bytes(data))


def test_v2_writer_refuses_a_group_that_splits_a_tensor():
    """checkpoint_bytes(ck, 2, g) with a g that does not divide a tensor says so
    (before: numpy's "cannot reshape array of size 3072 into shape (40)")."""
    with pytest.raises(ValueError, match=r"group_size 40 does not divide a tensor of 3072 "
                                         r"values \(96 x 32\)"):
        llama2c.checkpoint_bytes(random_checkpoint(), 2, group_size=40)
    with pytest.raises(ValueError, match="group_size 0: must be >= 1"):
        llama2c.checkpoint_bytes(random_checkpoint(), 2, group_size=0)


def test_stories260k_reads():
    if not STORIES260K_BIN.is_file():
        pytest.skip(f"stories260K.bin is not at {STORIES260K_BIN}")
    data = STORIES260K_BIN.read_bytes()
    assert hashlib.sha256(data).hexdigest().startswith("9414d5a2")
    ck = llama2c.read_checkpoint(data, str(STORIES260K_BIN))
    assert ck.version == 0 and ck.config == Llama2cConfig(64, 172, 5, 8, 4, 512, 512, True)
    assert ck.layers["wk"].shape == (5, 32, 64)  # 4 kv heads of 8
    # written back as v0, every tensor but the RoPE tables (recomputed) is the same bytes
    again = llama2c.checkpoint_bytes(ck, 0)
    rope = 512 * 4 * 2 * 4  # two [seq_len, head_size/2] f32 tables
    assert len(again) == len(data) and again[:-rope] == data[:-rope]
