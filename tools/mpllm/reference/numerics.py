"""float32 numerics of the engine, mirrored operation for operation in numpy.

Everything here returns the same bits as the C engine (the numerics contract, docs/ARCHITECTURE.md):
  - `expf`, `logf`, `erff`: native/engine/mathf.c, same constants (hex floats),
    same operation order, no libm;
  - `quantize_act` and `matvec`: the kernels.h contract;
  - `sum_seq`, `rmsnorm`, `silu`, `gelu`: the forward pass's exact order.
Every array op keeps float32: constants are np.float32 and the tests assert
dtypes, so numpy never widens an intermediate to float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..formats.align import align_up
from ..formats.model import F32Matrix, Matrix, Q8Matrix, QMatrix

F32 = np.float32


def _c(hexfloat: str) -> np.float32:
    return F32(float.fromhex(hexfloat))


# ---- mathf mirror -------------------------------------------------------------

_ROUND_SHIFT = _c("0x1.8p23")
_LOG2E = _c("0x1.715476p+0")
_LN2_HI = _c("0x1.63p-1")
_LN2_LO = _c("-0x1.bd0106p-13")
_EXP_Q = [_c(h) for h in ("0x1.6a243ap-10", "0x1.1239ep-7", "0x1.5558f2p-5",
                          "0x1.555492p-3", "0x1.fffffcp-2")]
_LOG_R = [_c(h) for h in ("0x1.31e1fcp-2", "0x1.995ec6p-2", "0x1.55557ap-1")]
_ERF_SMALL = [_c(h) for h in (
    "0x1.06eba8p-3", "-0x1.812746p-2", "0x1.ce2f08p-4", "-0x1.b829a8p-6",
    "0x1.5628eep-8", "-0x1.bcbeap-11", "0x1.d826b4p-14", "-0x1.43844cp-17")]
_ERF_MID = np.array([[float.fromhex(h) for h in row] for row in (
    ("0x1.d8865ep-1", "0x1.e4653p-3", "-0x1.2ebf54p-2", "0x1.571d14p-3",
     "-0x1.91ded2p-8", "-0x1.82905p-5", "0x1.517a18p-6", "0x1.ec8e7p-9"),
    ("0x1.f92d08p-1", "0x1.b0553p-5", "-0x1.7a4a8p-4", "0x1.7148ecp-4",
     "-0x1.8a1486p-5", "0x1.b1a74cp-8", "0x1.28858ap-7", "-0x1.83f5aap-8"),
    ("0x1.ff4048p-1", "0x1.d4143cp-8", "-0x1.074b2p-6", "0x1.63ef22p-6",
     "-0x1.38bdfp-6", "0x1.5d542ep-7", "-0x1.6c53eap-9", "-0x1.7d36ecp-11"),
    ("0x1.fff2dp-1", "0x1.3360dp-11", "-0x1.a6a56ep-10", "0x1.69cedep-9",
     "-0x1.aafeb6p-9", "0x1.6949dap-9", "-0x1.b535a2p-10", "0x1.4cc3f6p-11"),
    ("0x1.ffff7p-1", "0x1.e9b5cep-16", "-0x1.8de92ap-14", "0x1.9aa6d6p-13",
     "-0x1.2c120ep-12", "0x1.48d174p-12", "-0x1.1f0e16p-12", "0x1.6ce3e2p-13"),
    ("0x1.fffffcp-1", "0x1.d9364cp-21", "-0x1.bbbbb8p-19", "0x1.0b7378p-17",
     "-0x1.ce8feap-17", "0x1.335912p-16", "-0x1.5b2874p-16", "0x1.214804p-16"),
)], dtype=np.float32)


def _f32(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _from_bits(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _elementwise(
    flat: Callable[[np.ndarray], np.ndarray],
) -> Callable[[np.ndarray | float], np.ndarray]:
    """A mathf mirror for any shape: `flat` gets the float32 values as one flat
    array, with numpy's floating-point warnings off (the special values are
    handled explicitly, as in C), and must return float32."""
    @functools.wraps(flat)
    def apply(x: np.ndarray | float) -> np.ndarray:
        x = _f32(x)
        with np.errstate(all="ignore"):
            out = flat(x.reshape(-1))
        assert out.dtype == np.float32
        return out.reshape(x.shape)
    return apply


@_elementwise
def expf(x: np.ndarray) -> np.ndarray:
    """llm_expf, element-wise (see native/engine/mathf.h for special values)."""
    nan = np.isnan(x)
    big = x > F32(89.0)
    small = x < F32(-104.0)
    xs = np.where(nan | big | small, F32(0.0), x)
    t = xs * _LOG2E
    k = (t + _ROUND_SHIFT) - _ROUND_SHIFT
    n = k.astype(np.int32)
    r = xs - k * _LN2_HI
    r = r - k * _LN2_LO
    q = np.full_like(r, _EXP_Q[0])
    for c in _EXP_Q[1:]:
        q = c + r * q
    y = F32(1.0) + (r + (r * r) * q)
    out = y * _from_bits(((np.clip(n, -126, 127) + 127).astype(np.uint32)) << 23)
    # the rare branches are only evaluated when some element needs them
    if (n > 127).any():
        over = (y * F32(2.0**127)) * F32(2.0)
        out = np.where(n > 127, over, out)
    if (n < -126).any():
        sub_scale = _from_bits(((np.clip(n, -150, -126) + 100 + 127).astype(np.uint32))
                               << 23)
        under = (y * sub_scale) * F32(2.0**-100)
        out = np.where(n < -126, under, out)
    if (nan | big | small).any():
        out = np.where(small, F32(0.0), out)
        out = np.where(big, F32(np.inf), out)
        out = np.where(nan, x + x, out)
    return out


@_elementwise
def logf(x: np.ndarray) -> np.ndarray:
    """llm_logf, element-wise (see native/engine/mathf.h for special values)."""
    ix = _bits(x)
    nan = np.isnan(x)
    zero = (ix & np.uint32(0x7FFFFFFF)) == 0
    neg = (ix >> np.uint32(31)) != 0
    pinf = ix == np.uint32(0x7F800000)
    special = nan | zero | neg | pinf
    xs = np.where(special, F32(1.0), x)
    sub = _bits(xs) < np.uint32(0x00800000)
    xs = np.where(sub, xs * F32(2.0**25), xs)
    e = np.where(sub, -25, 0).astype(np.int32)
    ixs = _bits(xs)
    e = e + ((ixs >> np.uint32(23)).astype(np.int32) - 127)
    mant = ixs & np.uint32(0x007FFFFF)
    hi = mant > np.uint32(0x3504F3)
    mant = np.where(hi, mant | np.uint32(0x3F000000), mant | np.uint32(0x3F800000))
    e = e + hi.astype(np.int32)
    m = _from_bits(mant)
    f = m - F32(1.0)
    s = f / (F32(2.0) + f)
    z = s * s
    R = np.full_like(z, _LOG_R[0])
    R = _LOG_R[1] + z * R
    R = _LOG_R[2] + z * R
    R = z * R
    hfsq = (F32(0.5) * f) * f
    dk = e.astype(np.float32)
    w = s * (hfsq + R) + dk * _LN2_LO
    w = (hfsq - w) - f
    out = dk * _LN2_HI - w
    out = np.where(pinf, F32(np.inf), out)
    out = np.where(neg, F32(np.nan), out)
    out = np.where(zero, F32(-np.inf), out)
    out = np.where(nan, x + x, out)
    return out


@_elementwise
def erff(x: np.ndarray) -> np.ndarray:
    """llm_erff, element-wise (see native/engine/mathf.h for special values)."""
    nan = np.isnan(x)
    ix = _bits(x)
    sign = ix & np.uint32(0x80000000)
    ax = _from_bits(ix & np.uint32(0x7FFFFFFF))
    ax = np.where(nan, F32(0.0), ax)
    # |x| < 1
    z = ax * ax
    p = np.full_like(z, _ERF_SMALL[7])
    for c in _ERF_SMALL[6::-1]:
        p = c + z * p
    y_small = ax + ax * p
    # 1 <= |x| < 4
    am = np.where((ax >= F32(1.0)) & (ax < F32(4.0)), ax, F32(1.0))
    j = ((am - F32(1.0)) * F32(2.0)).astype(np.int32)
    mid = F32(1.25) + F32(0.5) * j.astype(np.float32)
    t = am - mid
    coef = _ERF_MID[j]
    p = coef[:, 7].copy()
    for i in range(6, -1, -1):
        p = coef[:, i] + t * p
    y = np.where(ax < F32(1.0), y_small, np.where(ax < F32(4.0), p, F32(1.0)))
    out = _from_bits(_bits(y) | sign)
    out = np.where(nan, x + x, out)
    return out


# ---- fp16 helpers -------------------------------------------------------------

def fp16_to_f32(h: np.ndarray) -> np.ndarray:
    """float16 values (or their uint16 bit patterns) widened exactly to float32."""
    h = np.asarray(h)
    if h.dtype == np.uint16:
        h = h.view(np.float16)
    if h.dtype != np.float16:
        raise TypeError(f"fp16_to_f32 wants float16 or uint16 bits, got {h.dtype}")
    return h.astype(np.float32)


def f32_to_fp16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest float16 (ties to even; overflow -> inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16)


# ---- kernels.h contract --------------------------------------------------------

def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """llm_quantize_act: (xq int8[n], xscale float32).

    xmax = max(1e-8f, max|x|); inv = 127.f/xmax; q = rint(x*inv) (half to
    even, like lrintf) clamped to +-127; xscale = xmax/127.f. A NaN in x
    makes the C comparison `a > xmax` false, so NaN is skipped for xmax; its q
    is undefined in C, so NaN input is rejected here.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"quantize_act wants a vector, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("quantize_act: activation vector holds NaN or Inf")
    xmax = max(F32(1e-8), F32(np.max(np.abs(x)))) if x.size else F32(1e-8)
    xmax = F32(xmax)
    inv = F32(127.0) / xmax
    q = np.rint(x * inv)
    q = np.clip(q, -127, 127).astype(np.int8)
    return q, F32(xmax / F32(127.0))


def _group_codes(q: np.ndarray, ng: int, width: int) -> np.ndarray:
    """Codes q [rows, cols] as float32 [ng, rows, width], zero-padded columns."""
    rows, cols = q.shape
    a = np.zeros((rows, ng * width), dtype=np.float32)
    a[:, :cols] = q
    return np.ascontiguousarray(a.reshape(rows, ng, width).transpose(1, 0, 2))


def _group_input(xq: np.ndarray, ng: int, width: int) -> np.ndarray:
    """A quantized input as float32 [ng, width], zero-padded like the codes."""
    xp = np.zeros(ng * width, dtype=np.float32)
    xp[: xq.shape[0]] = xq
    return xp.reshape(ng, width)


def _check_x(x: np.ndarray, cols: int) -> np.ndarray:
    if x.shape != (cols,):
        raise ValueError(f"matvec: x has shape {x.shape}, matrix has {cols} columns")
    return x


@dataclass
class QMatvec:
    """llm_matvec_q4 on a QMatrix: quantize x, then the engine's sums, exactly.

    Codes are kept as float32: every per-group dot is an integer of magnitude
    <= 8 * 127 * group < 2^24, so a float32 BLAS product of integer-valued
    operands is exact whatever order it sums in (== the kernel's int32 sum).
    """

    codes: np.ndarray  # f32 [n_groups, rows, group] (zero-padded columns)
    scales: np.ndarray  # f32 [rows, n_groups]
    rows: int
    cols: int
    group: int  # columns per group as stored (== cols when one group covers a row)

    @classmethod
    def of(cls, m: QMatrix) -> QMatvec:
        ng, g = m.n_groups, m.group
        if g * 127 * 8 >= 1 << 24:
            raise ValueError(f"group {g} too large for exact float32 integer dots")
        width = m.cols if ng == 1 else g  # no padding to stream when one group covers a row
        return cls(_group_codes(m.q, ng, width), m.scales.astype(np.float32), m.rows, m.cols,
                   width)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xq, xscale = quantize_act(_check_x(x, self.cols))
        xp = _group_input(xq, self.codes.shape[0], self.group)
        ng = self.codes.shape[0]
        acc = np.zeros(self.rows, dtype=np.float32)
        for k in range(ng):
            g = np.dot(self.codes[k], xp[k])  # exact integers
            acc = acc + g * self.scales[:, k]
        return acc * xscale


def quantize_act_groups(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """llm_quantize_act_groups: quantize_act on each group of `group` entries
    alone (the last may be shorter; group >= len(x): one group). Returns
    (xq int8[n], xscale float32[n_groups])."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[0]
    group = min(n, group)
    parts = [quantize_act(x[j:j + group]) for j in range(0, n, group)]
    return (np.concatenate([q for q, _ in parts]).astype(np.int8),
            np.array([sc for _, sc in parts], dtype=np.float32))


@dataclass
class Q8Matvec:
    """llm_matvec_q8 on a Q8Matrix: x quantized in the weights' groups, per group
    an exact integer dot (|dot| <= 127*127*group < 2^24, exact in float32
    whatever the BLAS order), then acc += (dot * w_scale) * x_scale in group
    order, from 0.f."""

    codes: np.ndarray  # f32 [n_groups, rows, width]
    scales: np.ndarray  # f32 [rows, n_groups]
    rows: int
    cols: int
    group: int  # columns per group (== cols when one group covers a row)

    @classmethod
    def of(cls, m: Q8Matrix) -> Q8Matvec:
        ng, g = m.n_groups, min(m.group, m.cols)
        if g * 127 * 127 >= 1 << 24:
            raise ValueError(f"int8 group {g} too large for exact float32 integer dots")
        return cls(_group_codes(m.q, ng, g), m.scales.astype(np.float32), m.rows, m.cols, g)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xq, xs = quantize_act_groups(_check_x(x, self.cols), self.group)
        ng = self.codes.shape[0]
        xp = _group_input(xq, ng, self.group)
        acc = np.zeros(self.rows, dtype=np.float32)
        for k in range(ng):
            g = np.dot(self.codes[k], xp[k])  # exact integers
            acc = acc + (g * self.scales[:, k]) * xs[k]
        return acc


@dataclass
class F32Matvec:
    """llm_matvec_f32 on an F32Matrix: eight lane sums, lane k over columns
    k, k+8, ... in order from 0.f (each product rounded, then the add), then
    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Columns are zero-padded to a multiple
    of 8: a +0 product leaves a lane unchanged (a lane that starts at +0.f is
    never -0), so the padding cannot change a bit."""

    w: np.ndarray  # f32 [rows, steps, 8]
    rows: int
    cols: int

    @classmethod
    def of(cls, m: F32Matrix) -> F32Matvec:
        width = align_up(m.cols, F32_LANES)
        w = np.zeros((m.rows, width), dtype=np.float32)
        w[:, : m.cols] = m.w
        return cls(w.reshape(m.rows, width // F32_LANES, F32_LANES), m.rows, m.cols)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.shape != (self.cols,):
            raise ValueError(f"matvec: x has shape {x.shape}, matrix has {self.cols} columns")
        xp = np.zeros(self.w.shape[1] * F32_LANES, dtype=np.float32)
        xp[: self.cols] = x
        prod = self.w * xp.reshape(1, -1, F32_LANES)  # [rows, steps, 8], each rounded
        lanes = sum_seq(prod, axis=1)  # [rows, 8], each lane in column order
        l_ = [lanes[:, k] for k in range(F32_LANES)]
        return ((l_[0] + l_[1]) + (l_[2] + l_[3])) + ((l_[4] + l_[5]) + (l_[6] + l_[7]))


#: kernels.h LLM_F32_LANES
F32_LANES = 8


def matvec_of(m: Matrix) -> QMatvec | Q8Matvec | F32Matvec:
    """The engine's matvec of m's format."""
    if isinstance(m, Q8Matrix):
        return Q8Matvec.of(m)
    if isinstance(m, F32Matrix):
        return F32Matvec.of(m)
    return QMatvec.of(m)


def matvec(w: Matrix, x: np.ndarray) -> np.ndarray:
    """quantize x (as w's format does) then multiply: y = W x exactly as the engine."""
    return matvec_of(w)(x)


# ---- order-sensitive float helpers ---------------------------------------------

def sum_seq(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sequential float32 sum along `axis`: s = 0.f; s += x[i] for i ascending.

    np.cumsum accumulates strictly in order in the array dtype (np.sum is
    pairwise). The C loop's leading 0.f is applied to the first element, so a
    sum of negative zeros is +0 here as in C.
    """
    x = np.moveaxis(np.array(x, dtype=np.float32, copy=True), axis, -1)
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], dtype=np.float32)
    x[..., 0] = F32(0.0) + x[..., 0]
    return np.cumsum(x, axis=-1, dtype=np.float32)[..., -1]


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """ss = sum_seq(x*x); inv = 1.f/sqrtf(ss/n + eps); out = (w*x)*inv.

    Works on the last axis, so a [rows, n] array normalizes each row.
    """
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    n = x.shape[-1]
    ss = sum_seq(x * x, axis=-1)
    inv = F32(1.0) / np.sqrt(ss / F32(n) + F32(eps))
    return (w * x) * inv[..., None]


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + expf(-x))."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        return x / (F32(1.0) + expf(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5f * x * (1 + erff(x * 0.70710678f)), evaluated ((0.5*x)*(1+erf))."""
    x = np.asarray(x, dtype=np.float32)
    return (F32(0.5) * x) * (F32(1.0) + erff(x * F32(0.70710678)))
