"""The PyTorch twin (mpllm.reference.torch_model) against the numpy reference, and the exporter.

The twin runs fp32 activations over the dequantized int4 weights; the reference
(the device numerics) quantizes every matvec input to int8. That is the only
modelled difference, which the first test isolates: with the reference's
activation quantization replaced by the identity, the two agree to float32
rounding (summation order). With it, they agree to within the int8 error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from mpllm.formats.esp32ai import encode_model_bin, read_model_bin
from mpllm.formats.model import Config, QMatrix, Weights
from mpllm.formats.rope import rope_table
from mpllm.reference import numerics as numerics_mod
from mpllm.reference.forward import Reference
from mpllm.reference.torch_model import (
    TINY_SCALE,
    PLEModel,
    TorchTwin,
    fake_quant,
    quantize_matrix,
    to_weights,
)
from mpllm.training.generate import make_weights

torch.set_num_threads(1)

# Random generated models (mpllm.training.generate): small but with every structural
# feature (several layers and heads, vocab_out < vocab_in, an untied head with
# odd widths that are not multiples of 32).
SMALL = Config(vocab_in=400, vocab_out=360, dim=64, n_layers=3, n_heads=4, ffn=44, ple_dim=64,
               seq_len=64, group=128)
UNTIED = Config(vocab_in=300, vocab_out=270, dim=32, n_layers=2, n_heads=2, ffn=23, ple_dim=33,
                seq_len=48, group=128, tied_head=False)
# llama2.c's stories260K shape: no PLE, 4 kv heads for 8 query heads, rmsnorm eps 1e-5
LLAMA2C = Config(vocab_in=512, vocab_out=512, dim=64, n_layers=5, n_heads=8, ffn=172,
                 ple_dim=0, seq_len=512, group=64, tied_head=False, family="llama2c",
                 n_kv_heads=4, norm_eps=1e-5)
TOKENS = [5, 17, 300, 2, 2, 119, 0, 64, 250, 31, 7, 77]

# Tolerances, as a fraction of the largest |logit| of the run:
#  * fp32 vs fp32 (int8 quantization switched off): only summation order and
#    libm differ (torch vs numpy expf/erf), a few float32 ulps per op.
FP32_TOL = 2e-5
#  * fp32 twin vs the int8-activation reference: each matvec input is rounded
#    to a step of max|x|/127 (about 1 % of its rms per matvec), and the error
#    compounds through ~8 matvecs per layer and the head. Measured 2.2-4.7 %
#    (max |diff| / max |logit|) over 12 random models of these two shapes, so
#    10 % leaves margin and is still far below what a misread formula does
#    (test_twin_detects_a_wrong_formula: interleaved RoPE moves logits > 50 %).
INT8_TOL = 0.10


def _reference_logits(weights: Weights, tokens: list[int]) -> np.ndarray:
    ref = Reference(weights, rope_table(weights.config))
    return np.stack([ref.forward(t) for t in tokens])


def _no_act_quant(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    return np.asarray(x, np.float32), np.float32(1.0)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("cfg", [SMALL, UNTIED, LLAMA2C], ids=["tied", "untied", "llama2c"])
def test_twin_equals_reference_without_int8(cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_weights(cfg, seed=7)
    toks = [t % cfg.vocab_in for t in TOKENS]
    monkeypatch.setattr(numerics_mod, "quantize_act", _no_act_quant)
    ref = _reference_logits(w, toks)
    twin = TorchTwin.from_weights(w).logits(toks)
    assert twin.shape == ref.shape == (len(toks), cfg.vocab_out)
    assert _rel_err(twin, ref) < FP32_TOL


@pytest.mark.parametrize("cfg", [SMALL, UNTIED, LLAMA2C], ids=["tied", "untied", "llama2c"])
def test_twin_close_to_int8_reference(cfg: Config) -> None:
    w = make_weights(cfg, seed=11)
    toks = [t % cfg.vocab_in for t in TOKENS]
    ref = _reference_logits(w, toks)
    twin = TorchTwin.from_weights(w).logits(toks)
    err = _rel_err(twin, ref)
    assert err < INT8_TOL
    # int8 rounding does move the logits (otherwise the reference would not be
    # quantizing and the tolerance above would be meaningless).
    assert err > FP32_TOL
    # Greedy picks agree wherever the reference's best beats its runner-up by
    # more than twice the worst observed deviation.
    dev = float(np.max(np.abs(twin - ref)))
    for r, t in zip(ref, twin):
        top2 = np.sort(r)[-2:]
        if top2[1] - top2[0] > 2 * dev:
            assert int(np.argmax(t)) == int(np.argmax(r))


def test_twin_detects_a_wrong_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: interleaved-pair RoPE (a common misreading of
    split-half) or tanh-GELU push the twin far outside the tolerance."""
    from mpllm.reference import torch_model

    w = make_weights(SMALL, seed=7)
    monkeypatch.setattr(numerics_mod, "quantize_act", _no_act_quant)
    ref = _reference_logits(w, TOKENS)

    def interleaved(self: PLEModel, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)

    with monkeypatch.context() as m:
        m.setattr(PLEModel, "_rope", interleaved)
        assert _rel_err(TorchTwin.from_weights(w).logits(TOKENS), ref) > 5 * INT8_TOL
    with monkeypatch.context() as m:
        m.setattr(torch_model, "_gelu_erf",
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
        assert _rel_err(TorchTwin.from_weights(w).logits(TOKENS), ref) > FP32_TOL


def test_twin_incremental_equals_full() -> None:
    """Row i of logits(tokens) only depends on tokens[:i+1] (causal mask, RoPE by position)."""
    twin = TorchTwin.from_weights(make_weights(SMALL, seed=3))
    full = twin.logits(TOKENS)
    for i in (0, 4, len(TOKENS) - 1):
        np.testing.assert_allclose(twin.logits(TOKENS[:i + 1])[-1], full[i], rtol=0, atol=1e-5)


def test_twin_rejects_bad_input() -> None:
    twin = TorchTwin.from_weights(make_weights(UNTIED, seed=1))
    with pytest.raises(ValueError, match="outside"):
        twin.logits([1, UNTIED.vocab_in])
    with pytest.raises(ValueError, match="empty"):
        twin.logits([])
    with pytest.raises(ValueError, match="exceeds the context"):
        twin.logits([1] * (UNTIED.seq_len + 1))


# --------------------------------------------------------------------------- #
# quantization / export


def _upstream_rule(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exporter's rule written out independently, one row (one group) at a time."""
    qs, ss = [], []
    for row in w.astype(np.float32):
        s = np.float16(np.max(np.abs(row)) / np.float32(7.0))
        s32 = np.float32(s)
        qs.append(np.clip(np.rint(row / s32), -7, 7).astype(np.int8))
        ss.append(s)
    return np.stack(qs), np.array(ss, np.float16)[:, None]


def test_quantize_matches_rule_and_bounds() -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((50, 96)) * rng.uniform(0.01, 3.0, (50, 1))).astype(np.float32)
    m = quantize_matrix(w, 128)
    q, s = _upstream_rule(w)
    assert m.q.dtype == np.int8 and m.scales.dtype == np.float16 and m.group == 128
    assert m.q.tobytes() == q.tobytes()
    assert m.scales.tobytes() == s.tobytes()
    assert m.q.min() >= -7 and m.q.max() <= 7
    # every group reaches +-7 (its max maps there), so nothing of the range is wasted
    assert np.all(np.abs(m.q).max(axis=1) == 7)
    err = np.abs(m.dequantize() - w)
    assert np.all(err <= m.scales.astype(np.float32) * 0.5 * (1 + 2.0**-10))


def test_quantize_is_idempotent_and_grouped() -> None:
    rng = np.random.default_rng(6)
    w = rng.standard_normal((8, 300)).astype(np.float32)  # 3 groups, the last one partial
    m = quantize_matrix(w, 128)
    assert m.scales.shape == (8, 3)
    for k in range(3):
        blk = w[:, k * 128:(k + 1) * 128]
        want = (np.abs(blk).max(axis=1) / np.float32(7)).astype(np.float16)
        assert m.scales[:, k].tobytes() == want.tobytes()
    again = quantize_matrix(m.dequantize(), 128)
    assert again.q.tobytes() == m.q.tobytes()
    assert again.scales.tobytes() == m.scales.tobytes()


def test_all_zero_group_gets_a_tiny_positive_scale() -> None:
    w = np.zeros((3, 200), np.float32)
    w[1, :128] = np.linspace(-1, 1, 128)
    w[2, 5] = 1e-9  # max/7 underflows fp16 to zero
    m = quantize_matrix(w, 128)
    s = m.scales.astype(np.float32)
    assert np.all(np.isfinite(s)) and np.all(s > 0)
    assert s[0, 0] == s[0, 1] == s[1, 1] == s[2, 0] == np.float32(TINY_SCALE)
    assert not m.q[0].any() and not m.q[2].any()
    np.testing.assert_array_equal(m.dequantize()[0], 0.0)
    # H1's writer/reader accept it: no NaN/Inf scale reaches model.bin
    wts = make_weights(UNTIED, seed=2)
    wts.layers[0].up = quantize_matrix(np.zeros((UNTIED.ffn, UNTIED.dim), np.float32), 128)
    back = read_model_bin(encode_model_bin(wts))
    assert back.layers[0].up.scales.tobytes() == wts.layers[0].up.scales.tobytes()


def test_quantize_rejects_bad_matrices() -> None:
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_matrix(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="too large"):
        quantize_matrix(np.array([[1e6, 1.0]], np.float32))
    with pytest.raises(ValueError, match="2-D"):
        quantize_matrix(np.ones(4, np.float32))


def test_fake_quant_forward_is_export_and_gradient_passes() -> None:
    w = torch.randn(20, 96, requires_grad=True)
    fq = fake_quant(w, 128)
    m = quantize_matrix(w.detach(), 128)
    assert fq.detach().numpy().tobytes() == m.dequantize().tobytes()
    fq.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


@pytest.mark.parametrize("tied", [True, False])
def test_export_round_trip(tied: bool) -> None:
    cfg = dataclasses.replace(SMALL, tied_head=tied, vocab_out=SMALL.vocab_in if tied else 360)
    torch.manual_seed(0)
    model = PLEModel(cfg, fake_quant=True)
    model.reset_parameters(seed=1)
    with torch.no_grad():  # norms away from 1 so a swapped/skipped norm would show
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    vout = 360 if tied else None  # tied: export scores fewer rows than the module has
    w = to_weights(model, vocab_out=vout)
    assert w.config.vocab_out == 360 and w.config.vocab_in == cfg.vocab_in
    assert (w.head is None) == tied
    for lw, layer in zip(w.layers, model.layers):
        assert lw.attn_norm.dtype == np.float32
        assert lw.ple_norm.tobytes() == layer.ple_norm.detach().numpy().tobytes()
        assert isinstance(lw.qkv, QMatrix) and lw.qkv.q.shape == (3 * cfg.dim, cfg.dim)
    # through H1's model.bin writer and reader: byte-identical tensors
    back = read_model_bin(encode_model_bin(w))
    assert back.config == w.config
    for a, b in ((w.tok_emb, back.tok_emb), (w.ple_table, back.ple_table),
                 (w.layers[-1].down, back.layers[-1].down)):
        assert a.q.tobytes() == b.q.tobytes() and a.scales.tobytes() == b.scales.tobytes()
    # the fake-quantized module computes what the exported weights compute
    x = torch.tensor([TOKENS[:10]])
    with torch.no_grad():
        want = model(x)[0].numpy()[:, :360]
    got = TorchTwin.from_weights(back).logits(TOKENS[:10])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_to_weights_rejects_bad_vocab() -> None:
    model = PLEModel(SMALL)
    with pytest.raises(ValueError, match="vocab_out"):
        to_weights(model, vocab_out=SMALL.vocab_in + 1)
    with pytest.raises(ValueError, match="untied"):
        to_weights(PLEModel(UNTIED), vocab_out=100)


def test_export_round_trip_llama2c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A llama2c-family module exports to Weights without PLE and with qkv rows for
    4 kv heads; through an image and back, the twin computes what the module does."""
    from mpllm.formats.image import read_image, write_image

    torch.manual_seed(0)
    model = PLEModel(LLAMA2C, fake_quant=True)
    model.reset_parameters(seed=2)
    assert not hasattr(model, "ple_table") and not hasattr(model.layers[0], "ple_gate")
    w = to_weights(model)
    assert w.config == LLAMA2C and w.ple_table is None and w.layers[0].ple_norm is None
    assert w.layers[0].qkv.q.shape == (LLAMA2C.dim + 2 * LLAMA2C.kv_dim, LLAMA2C.dim)
    from llama2c_models import synthetic_vocab
    from mpllm.formats import llama2c
    from mpllm.formats.tokenizer import tokenizer_section

    tables = llama2c.tokenizer_tables(*synthetic_vocab(LLAMA2C.vocab_out))
    write_image(tmp_path / "m.img", w, tokenizer_section=tokenizer_section(tables),
                rope=rope_table(LLAMA2C), source_sha256=bytes(32), eot_id=tables.eot_id)
    back = read_image(tmp_path / "m.img").weights
    x = torch.tensor([TOKENS[:10]])
    with torch.no_grad():
        want = model(x)[0].numpy()
    got = TorchTwin.from_weights(back).logits(TOKENS[:10])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
