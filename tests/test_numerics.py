"""The engine's float32 math and sampler: C (native/engine/mathf.c, sampler.c)
versus the numpy mirror (mpllm.reference.numerics, mpllm.reference.sampler), bit for bit, plus
accuracy bounds against float64 and the kernels.h quantization contract."""

from __future__ import annotations

import math
import platform
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cbuild import CTESTS, ENGINE, build, have, run
from conftest import missing_tool
from mpllm.formats.model import QMatrix
from mpllm.reference import numerics as N
from mpllm.reference.sampler import MAX_TOP_K, Pcg32, Sampler, gumbel_from_u32, uniform_from_u32

F32 = np.float32


@pytest.fixture(scope="module")
def cbin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # under ASan/UBSan: the sampler's fixed top-k buffer and the bit casts are checked too
    out = tmp_path_factory.mktemp("h3c")
    return {
        "mathf": build("mathf_dump", [ENGINE / "mathf.c", CTESTS / "mathf_dump.c"], out,
                       sanitize=True),
        "sampler": build("sampler_dump", [ENGINE / "mathf.c", ENGINE / "sampler.c",
                                          CTESTS / "sampler_dump.c"], out, sanitize=True),
    }


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.0, 89.0, 88.72283935546875,
     88.7228470, 88.0, -87.3, -88.7, -100.0, -103.97, -104.0, -104.1, 4.0, -4.0,
     3.9999998, 3.916, 1.0000001, 0.99999994, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38,
     3.4028235e38, -3.4028235e38, 5.9604645e-08, 1.0 - 5.9604645e-08, 1e-30, -1e-30,
     0.70710677, 0.70710683, 1.4142135, 1.4142137, 1e30, 16.635532],
    dtype=np.float32)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(20240601)
    parts = [
        rng.integers(0, 2**32, 700_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        rng.uniform(-110, 0, 150_000).astype(np.float32),       # softmax arguments
        (rng.standard_normal(100_000) * 8).astype(np.float32),  # silu / gelu arguments
        rng.uniform(0, 1, 100_000).astype(np.float32),          # logf of a uniform
        rng.uniform(-5, 5, 100_000).astype(np.float32),         # erf's polynomial pieces
        SPECIALS,
    ]
    with np.errstate(over="ignore"):
        parts += [np.nextafter(SPECIALS, np.float32(np.inf)),
                  np.nextafter(SPECIALS, np.float32(-np.inf))]
    return np.concatenate(parts).astype(np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equal, counting any NaN as equal to any NaN (payloads are free)."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def test_mathf_c_equals_python_bit_for_bit(cbin: dict[str, Path], tmp_path: Path) -> None:
    x = _inputs()
    assert x.size >= 1_000_000
    (tmp_path / "in.f32").write_bytes(x.tobytes())
    r = run(cbin["mathf"], "eval", str(tmp_path / "in.f32"), str(tmp_path / "out.f32"))
    assert r.returncode == 0, r.stderr
    c = np.fromfile(tmp_path / "out.f32", dtype=np.float32).reshape(-1, 3)
    assert c.shape[0] == x.size
    for col, fn in enumerate((N.expf, N.logf, N.erff)):
        p = fn(x)
        assert p.dtype == np.float32
        same = _same_bits(c[:, col], p)
        bad = np.flatnonzero(~same)
        assert bad.size == 0, (
            f"{fn.__name__}: {bad.size} mismatches, first x={x[bad[:5]]!r} "
            f"C={c[bad[:5], col]!r} py={p[bad[:5]]!r}")


def test_mathf_ulp_sweep_in_c(cbin: dict[str, Path]) -> None:
    """Every 4099th float32 bit pattern (and its neighbour), ~2.1M inputs, vs float64 libm."""
    r = run(cbin["mathf"], "ulp", "4099")
    assert r.returncode == 0, r.stderr
    got = {line.split()[0]: float(line.split()[1]) for line in r.stdout.splitlines()}
    assert got["bad"] == 0, r.stdout  # NaN where NaN is due, and nowhere else
    assert got["expf"] <= 1.0, r.stdout
    assert got["logf"] <= 1.0, r.stdout
    assert got["erff"] <= 2.0, r.stdout


def _ulp_err(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a = np.abs(ref)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    ulp = np.exp2(np.maximum(e - 23, -149))
    return np.abs(y.astype(np.float64) - ref) / ulp


def test_python_math_accuracy_on_model_ranges() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(-87, 88, 200_000).astype(np.float32)
    assert _ulp_err(N.expf(x), np.exp(x.astype(np.float64))).max() <= 1.0
    u = rng.uniform(0, 1, 200_000).astype(np.float32)
    u = u[u > 0]
    assert _ulp_err(N.logf(u), np.log(u.astype(np.float64))).max() <= 1.0
    z = rng.uniform(-6, 6, 50_000).astype(np.float32)
    ref = np.array([math.erf(float(v)) for v in z])
    assert _ulp_err(N.erff(z), ref).max() <= 2.0


def test_special_values() -> None:
    inf = F32(np.inf)
    assert N.expf(np.float32(-np.inf)) == 0 and N.expf(inf) == inf
    assert np.isnan(N.expf(F32(np.nan)))
    assert N.expf(F32(0.0)) == 1.0 and N.expf(F32(-0.0)) == 1.0
    assert N.expf(F32(89.0)) == inf and N.expf(F32(88.73)) == inf
    # largest float32 below ln(FLT_MAX) = 88.7228391: finite; the next one overflows
    assert np.isfinite(N.expf(F32(88.72283172607422)))
    assert N.expf(F32(88.72283935546875)) == inf
    assert N.expf(F32(-104.5)) == 0
    assert 0 < N.expf(F32(-103.0)) < 1e-44  # subnormal result, not flushed
    assert N.logf(F32(0.0)) == -inf and N.logf(F32(-0.0)) == -inf
    assert np.isnan(N.logf(F32(-1.0))) and np.isnan(N.logf(F32(-np.inf)))
    assert N.logf(inf) == inf and N.logf(F32(1.0)).view(np.uint32) == 0
    assert abs(N.logf(F32(1e-45)) - np.log(1.401298464324817e-45)) < 1e-5
    assert N.erff(inf) == 1.0 and N.erff(F32(-np.inf)) == -1.0
    assert N.erff(F32(4.0)) == 1.0 and N.erff(F32(-3.95)) == -1.0
    assert N.erff(F32(-0.0)).view(np.uint32) == 0x80000000
    assert np.isnan(N.erff(F32(np.nan)))
    # silu/gelu saturate cleanly instead of producing NaN
    assert N.silu(np.array([-200.0, 200.0], np.float32)).tolist() == [-0.0, 200.0]
    assert N.gelu(np.array([-10.0, 10.0], np.float32)).tolist() == [-0.0, 10.0]


# ---- kernels.h contract -------------------------------------------------------------------


def _quantize_scalar(x: list[float]) -> tuple[list[int], np.float32]:
    xmax = F32(1e-8)
    for v in x:
        a = abs(F32(v))
        xmax = max(xmax, a)
    inv = F32(127.0) / xmax
    q = []
    for v in x:
        t = float(F32(v) * inv)
        r = round(t)  # Python rounds half to even, like lrintf
        q.append(max(-127, min(127, r)))
    return q, F32(xmax / F32(127.0))


def test_quantize_act_contract() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 5, 96, 128, 768):
        x = (rng.standard_normal(n) * rng.uniform(1e-3, 50)).astype(np.float32)
        q, s = N.quantize_act(x)
        q2, s2 = _quantize_scalar(x.tolist())
        assert q.dtype == np.int8 and q.tolist() == q2
        assert s.dtype == np.float32 and s.tobytes() == s2.tobytes()
    # exact halves go to even: xmax 127 -> inv 1, so q = rint(x)
    x = np.array([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5], np.float32)
    assert N.quantize_act(x)[0].tolist() == [127, 0, 2, 2, 0, -2, 126]
    # all zeros: xmax floor 1e-8
    q, s = N.quantize_act(np.zeros(4, np.float32))
    assert q.tolist() == [0, 0, 0, 0] and s == F32(F32(1e-8) / F32(127.0))
    with pytest.raises(ValueError, match="NaN or Inf"):
        N.quantize_act(np.array([1.0, np.nan], np.float32))


def test_matvec_contract_multi_group() -> None:
    rng = np.random.default_rng(4)
    rows, cols, group = 37, 300, 128  # 3 groups, the last one partial
    q = rng.integers(-8, 8, (rows, cols)).astype(np.int8)
    scales = rng.uniform(-0.1, 0.1, (rows, 3)).astype(np.float16)
    w = QMatrix(q, scales, group)
    x = rng.standard_normal(cols).astype(np.float32)
    y = N.matvec(w, x)
    xq, xs = N.quantize_act(x)
    for r in range(rows):
        acc = F32(0.0)
        for g in range(3):
            lo, hi = g * group, min(cols, (g + 1) * group)
            dot = int(np.dot(q[r, lo:hi].astype(np.int64), xq[lo:hi].astype(np.int64)))
            acc = F32(acc + F32(F32(dot) * F32(scales[r, g])))
        assert y[r].tobytes() == F32(acc * xs).tobytes()
    # and it is a close approximation of the real product
    exact = w.dequantize().astype(np.float64) @ x.astype(np.float64)
    assert np.abs(y - exact).max() < 0.02 * np.abs(exact).max()


def test_sum_seq_is_sequential_not_pairwise() -> None:
    x = np.array([1.0, 1e8, -1e8] + [0.25] * 16 + [3.0], np.float32)
    s = F32(0.0)
    for v in x:
        s = F32(s + v)
    assert N.sum_seq(x).tobytes() == s.tobytes()
    rng = np.random.default_rng(5)
    m = (rng.standard_normal((7, 300)) * 100).astype(np.float32)
    seq = np.zeros(7, np.float32)
    for j in range(300):
        seq = seq + m[:, j]
    assert N.sum_seq(m, axis=1).tobytes() == seq.tobytes()
    assert N.sum_seq(m.T, axis=0).tobytes() == seq.tobytes()
    # the C loop starts from +0.f: a sum of negative zeros is +0
    assert N.sum_seq(np.array([-0.0, -0.0], np.float32)).view(np.uint32) == 0


def test_rmsnorm_order() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal(96).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 96).astype(np.float32)
    ss = F32(0.0)
    for v in x:
        ss = F32(ss + F32(v * v))
    inv = F32(F32(1.0) / np.sqrt(F32(ss / F32(96)) + F32(1e-6)))
    want = np.array([F32(F32(w[i] * x[i]) * inv) for i in range(96)], np.float32)
    assert N.rmsnorm(x, w).tobytes() == want.tobytes()


def test_fp16_helpers() -> None:
    bits = np.arange(0, 65536, dtype=np.uint32).astype(np.uint16)
    f = N.fp16_to_f32(bits)
    assert f.dtype == np.float32
    finite = np.isfinite(f)
    assert N.f32_to_fp16(f[finite]).view(np.uint16).tolist() == bits[finite].tolist()
    assert N.f32_to_fp16(np.array([1e6], np.float32))[0] == np.inf
    with pytest.raises(TypeError):
        N.fp16_to_f32(np.zeros(2, np.int32))


# ---- sampler ------------------------------------------------------------------------------


def test_rng_c_equals_python(cbin: dict[str, Path]) -> None:
    for seed in (1, 42, 2**63 + 12345, 2**64 - 1):
        r = run(cbin["sampler"], "rng", str(seed), "3000")
        assert r.returncode == 0, r.stderr
        rows = [[int(t, 16) for t in line.split()] for line in r.stdout.splitlines()]
        c = np.array(rows, dtype=np.uint64).astype(np.uint32)
        p = Pcg32(seed)
        scalar = [p.next_u32() for _ in range(1000)]
        vec = Pcg32(seed).next_u32_array(3000)
        assert scalar == vec[:1000].tolist()
        assert vec.tolist() == c[:, 0].tolist()
        assert uniform_from_u32(vec).view(np.uint32).tolist() == c[:, 1].tolist()
        assert gumbel_from_u32(vec).view(np.uint32).tolist() == c[:, 2].tolist()
    u = uniform_from_u32(np.array([0, 0xFFFFFFFF], np.uint32))
    assert u.tolist() == [2.0**-24, 1 - 2.0**-24]
    assert np.isfinite(gumbel_from_u32(np.array([0, 0xFFFFFFFF], np.uint32))).all()


def _c_picks(cbin: dict[str, Path], tmp_path: Path, logits: np.ndarray, t: float, k: int,
             seed: int) -> list[int] | str:
    f = tmp_path / "logits.f32"
    f.write_bytes(np.ascontiguousarray(logits, np.float32).tobytes())
    r = run(cbin["sampler"], "pick", str(f), str(logits.shape[0]), str(logits.shape[1]),
            float(F32(t)).hex(), str(k), str(seed))
    if r.returncode == 1 and r.stdout.startswith("error"):
        return r.stdout.strip()
    assert r.returncode == 0, r.stderr
    return [int(v) for v in r.stdout.split()]


def _py_picks(logits: np.ndarray, t: float, k: int, seed: int) -> list[int]:
    s = Sampler(t, k, seed)
    return [s.pick(row) for row in logits]


def _tied_logits(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    # few distinct values: many exact ties, inside and at the edge of the top-k
    return rng.integers(-4, 4, (rows, n)).astype(np.float32) * F32(0.5)


def test_sampler_c_equals_python(cbin: dict[str, Path], tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    cases = 0
    for n in (1, 7, 300, 2000):
        smooth = (rng.standard_normal((8, n)) * 3).astype(np.float32)
        tied = _tied_logits(rng, 8, n)
        combos = [(t, k, seed) for t in (0.0, 0.05, 0.8, 1.0, 3.0)
                  for k in (0, 1, 5, 40, 256, n, n + 3)
                  for seed in (0, 1, 987654321, 2**64 - 1)]
        spec = tmp_path / "cases.txt"
        spec.write_text("".join(f"{float(F32(t)).hex()} {k} {s}\n" for t, k, s in combos))
        for logits in (smooth, tied):
            f = tmp_path / "logits.f32"
            f.write_bytes(logits.tobytes())
            r = run(cbin["sampler"], "batch", str(f), "8", str(n), str(spec))
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            assert len(lines) == len(combos)
            for (t, k, seed), line in zip(combos, lines, strict=True):
                assert [int(v) for v in line.split()] == _py_picks(logits, t, k, seed), \
                    (n, t, k, seed)
                cases += 1
    assert cases > 1000


def test_sampler_seed0_is_greedy_and_ties_go_low(cbin: dict[str, Path], tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    logits = _tied_logits(rng, 20, 500)
    greedy = [int(np.flatnonzero(row == row.max())[0]) for row in logits]
    for t in (0.0, 0.8, 5.0):
        for k in (0, 40):
            assert _py_picks(logits, t, k, 0) == greedy
            assert _c_picks(cbin, tmp_path, logits, t, k, 0) == greedy
    assert _py_picks(logits, 0.0, 40, 99) == greedy
    assert _c_picks(cbin, tmp_path, logits, 0.0, 40, 99) == greedy
    # top_k 1 is greedy whatever the noise
    assert _py_picks(logits, 1.0, 1, 5) == greedy


def test_sampler_top_k_respected_and_distribution() -> None:
    logits = np.array([0.0, 1.0, 2.0, -1.0, 2.0, 0.5], np.float32)
    s = Sampler(1.0, 3, 77)
    picks = np.array([s.pick(logits) for _ in range(4000)])
    # top-3 by (logit desc, id asc): ids 2, 4, 1
    assert set(np.unique(picks).tolist()) == {1, 2, 4}
    p = np.exp(np.array([1.0, 2.0, 2.0]))
    p /= p.sum()
    freq = np.array([(picks == i).mean() for i in (1, 2, 4)])
    assert np.abs(freq - p).max() < 0.03, (freq, p)
    # temperature sharpens: at T=0.25 the 1.0 logit is ~e^-4 as likely as a 2.0 one
    s = Sampler(0.25, 0, 78)
    picks = np.array([s.pick(logits) for _ in range(2000)])
    assert (picks == 1).mean() < 0.03 and abs((picks == 2).mean() - 0.5) < 0.05


def test_sampler_errors(cbin: dict[str, Path], tmp_path: Path) -> None:
    logits = np.zeros((1, 1000), np.float32)
    with pytest.raises(ValueError, match="exceeds the supported 256"):
        Sampler(0.8, MAX_TOP_K + 1, 1).pick(logits[0])
    assert "exceeds the supported 256" in _c_picks(cbin, tmp_path, logits, 0.8, 257, 1)
    # a top_k covering the whole vocabulary is fine
    assert _c_picks(cbin, tmp_path, logits, 0.8, 1000, 1) == _py_picks(logits, 0.8, 1000, 1)
    bad = logits.copy()
    bad[0, 17] = np.nan
    with pytest.raises(ValueError, match="logit 17 is NaN"):
        Sampler(0.8, 40, 1).pick(bad[0])
    assert "logit 17 is NaN" in _c_picks(cbin, tmp_path, bad, 0.8, 40, 1)
    for t in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            Sampler(t, 40, 1)
        assert "temperature" in _c_picks(cbin, tmp_path, logits, t, 40, 1)


def test_sampler_state_carries_and_reset_replays() -> None:
    rng = np.random.default_rng(13)
    logits = (rng.standard_normal((30, 400)) * 2).astype(np.float32)
    s = Sampler(1.0, 40, 4242)
    first = [s.pick(r) for r in logits]
    s.reset()
    assert [s.pick(r) for r in logits] == first
    assert len(set(first)) > 1  # sampling really varies


@pytest.mark.parametrize("compiler,opt", [("gcc", "-O0"), ("gcc", "-O3"), ("clang", "-O2")])
def test_mathf_same_bits_across_compilers(cbin: dict[str, Path], tmp_path: Path,
                                          compiler: str, opt: str) -> None:
    """No optimisation level or compiler may change a bit (no FMA, no reassociation)."""
    if not have(compiler):
        missing_tool(f"{compiler} not installed")
    prog = build(f"mathf_dump_{compiler}{opt}", [ENGINE / "mathf.c", CTESTS / "mathf_dump.c"],
                 tmp_path, compiler=compiler, opt=opt, extra=["-march=native"])
    x = _inputs()[::4]
    (tmp_path / "in.f32").write_bytes(x.tobytes())
    outs = []
    for p in (cbin["mathf"], prog):
        out = tmp_path / f"out-{p.name}.f32"
        r = run(p, "eval", str(tmp_path / "in.f32"), str(out))
        assert r.returncode == 0, r.stderr
        outs.append(np.fromfile(out, dtype=np.float32))
    assert _same_bits(outs[0], outs[1]).all()


def test_quantize_rounds_like_lrintf_without_libm(tmp_path: Path) -> None:
    """kernels_ref.c rounds half to even with an add/subtract of 1.5*2^23 instead of
    libm's lrintf: ~39 million values (every halfway point, a sweep of float bit
    patterns, whole vectors with their own scale) against lrintf itself."""
    exe = build("quantize_check", [ENGINE / "kernels_ref.c", CTESTS / "quantize_check.c"],
                tmp_path)
    r = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    n, bad = (int(v) for v in re.fullmatch(r"compared=(\d+) mismatches=(\d+)\n", r.stdout).groups())
    assert n > 30_000_000 and bad == 0


def test_four_wide_transcendentals_equal_one_at_a_time(tmp_path: Path) -> None:
    """llm_expf4 / llm_erff4 (what softmax, SiLU and GELU call) give llm_expf /
    llm_erff's bits lane by lane: ~44 million patterns, edges, specials."""
    exe = build("mathf4_check", [ENGINE / "mathf.c", CTESTS / "mathf4_check.c"], tmp_path)
    r = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    n, bad = (int(v) for v in re.fullmatch(r"compared=(\d+) mismatches=(\d+)\n", r.stdout).groups())
    assert n > 80_000_000 and bad == 0


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
                    reason="llm_expf_sub_n is built where simd.h has vector lanes "
                           "(x86-64, ARM64)")
def test_vector_softmax_exp_equals_one_at_a_time(tmp_path: Path) -> None:
    """llm_expf_sub_n (softmax's weights on the host's vector lanes) gives
    llm_expf(x - sub)'s bits element by element: ~44 million patterns in runs
    of every length 1..19 (every lane position, the 8- and 4-wide steps and
    the scalar tail), edges and specials in every lane, in place too."""
    exe = build("mathf_vec_check", [ENGINE / "mathf.c", CTESTS / "mathf_vec_check.c"], tmp_path)
    r = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    n, bad = (int(v) for v in re.fullmatch(r"compared=(\d+) mismatches=(\d+)\n", r.stdout).groups())
    assert n > 40_000_000 and bad == 0
