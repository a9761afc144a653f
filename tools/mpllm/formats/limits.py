"""What the engine and the image format can hold: the one Python statement of
the sizes the loader refuses past (native/engine/image.h's LLM_MAX_* and the
checks of image.c's check_config / check_arch), so that a converter refuses a
model before it writes an image the engine cannot open.

tests/test_image_format_agrees.py compiles a probe against image.h and holds
every number here equal to the C one.
"""

from __future__ import annotations

from .image import MAX_SECTIONS
from .tokenizer import MAX_IDS

#: image.h's bounds: they keep every derived size far from overflow and the
#: int32 dot products of kernels.h exact
MAX_DIM = 8192  # LLM_MAX_DIM: dim, and n_heads (a head has at least one column)
MAX_HEAD_DIM = 256  # LLM_MAX_HEAD_DIM: attention decodes one V head row on the stack
MAX_FFN = 32768  # LLM_MAX_FFN
MAX_PLE_COLS = 65536  # LLM_MAX_PLE_COLS: n_layers * ple_dim
MAX_SEQ_LEN = 65536  # LLM_MAX_SEQ_LEN: the context, in positions
MAX_VOCAB = 1 << 24  # LLM_MAX_VOCAB: vocab_rows and vocab_out
#: LLM_MAX_LAYERS: the section table (MAX_SECTIONS entries) holds the 6
#: sections before the layers (tokenizer, rope, embed and PLE's three), 10 per
#: layer (esp32-ai's count; the engine applies it to every arch) and 5 after
#: them (out_norm, head, head_tiles, drafts, weights)
SECTIONS_BEFORE_LAYERS = 6
SECTIONS_PER_LAYER = 10
SECTIONS_AFTER_LAYERS = 5
MAX_LAYERS = (MAX_SECTIONS - SECTIONS_BEFORE_LAYERS - SECTIONS_AFTER_LAYERS) // SECTIONS_PER_LAYER
#: the image's tokenizer stores ids as u16 (formats.tokenizer.MAX_IDS), so a
#: vocabulary, and with it the head, holds at most this many tokens
MAX_TOKENS = min(MAX_IDS, MAX_VOCAB)


def size_limit(name: str) -> tuple[int, str]:
    """(the largest value, what sets it) of a size the engine bounds by a
    constant: "dim", "ffn", "n_layers", "seq_len", "vocab" or "head_dim"."""
    return {"dim": (MAX_DIM, "LLM_MAX_DIM"), "ffn": (MAX_FFN, "LLM_MAX_FFN"),
            "n_layers": (MAX_LAYERS, f"LLM_MAX_LAYERS: {MAX_SECTIONS} sections"),
            "seq_len": (MAX_SEQ_LEN, "LLM_MAX_SEQ_LEN"),
            "vocab": (MAX_TOKENS, "token ids are u16 in the image"),
            "head_dim": (MAX_HEAD_DIM, "LLM_MAX_HEAD_DIM")}[name]
