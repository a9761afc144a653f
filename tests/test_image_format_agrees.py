"""native/engine/image_format.h is the image format's specification; mpllm.formats.image
mirrors its constants and struct layouts. Compile a probe against the header and
compare every value with the Python side, so the two cannot drift apart."""

from __future__ import annotations

import re
import struct

import cbuild
from mpllm.formats import drafts_table, head_tiles, image, tokenizer

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "image_format.h"
int main(void) {
    printf("MAGIC %s\n", LLM_IMAGE_MAGIC);
    printf("VERSION %u\nHEADER_BYTES %u\nSECTION_BYTES %u\nALIGN %u\n", LLM_IMAGE_VERSION,
           LLM_IMAGE_HEADER_BYTES, LLM_IMAGE_SECTION_BYTES, LLM_IMAGE_ALIGN);
    printf("BLOCK_COLS %u\nNAME_BYTES %u\nMAX_SECTIONS %u\n", LLM_IMAGE_BLOCK_COLS,
           LLM_IMAGE_NAME_BYTES, LLM_IMAGE_MAX_SECTIONS);
    printf("FLAG_TIED_HEAD %u\nFLAGS_KNOWN %u\n", LLM_IMAGE_FLAG_TIED_HEAD, LLM_IMAGE_FLAGS_KNOWN);
    printf("KIND_F32 %d\nKIND_Q4 %d\nKIND_ROWS %d\nKIND_TOKENIZER %d\n", LLM_IMAGE_KIND_F32,
           LLM_IMAGE_KIND_Q4, LLM_IMAGE_KIND_ROWS, LLM_IMAGE_KIND_TOKENIZER);
    printf("KIND_HEAD_TILES %d\nKIND_DRAFTS %d\n", LLM_IMAGE_KIND_HEAD_TILES,
           LLM_IMAGE_KIND_DRAFTS);
    printf("DRAFTS_ORDER %u\nDRAFTS_MAX %u\nDRAFTS_HEADER %zu\n", LLM_IMAGE_DRAFTS_ORDER,
           LLM_IMAGE_DRAFTS_MAX, sizeof(llm_image_drafts_header));
    printf("Q4_HEADER_BYTES %zu\n", sizeof(llm_image_q4_header));
    printf("HEADER_CRC_OFFSET %zu\n", offsetof(llm_image_header, header_crc32));
    printf("OFF_ROPE_THETA %zu\nOFF_SHA %zu\n", offsetof(llm_image_header, rope_theta),
           offsetof(llm_image_header, source_sha256));
    printf("OFF_SECTION_KIND %zu\n", offsetof(llm_image_section, kind));
    /* the structs image.c reads sections through (READ_STRUCT): field offsets */
    printf("SECTION_FIELDS %zu %zu %zu %zu\n", offsetof(llm_image_section, kind),
           offsetof(llm_image_section, offset), offsetof(llm_image_section, size),
           offsetof(llm_image_section, crc32));
    printf("Q4_FIELDS %zu %zu %zu %zu\n", offsetof(llm_image_q4_header, rows),
           offsetof(llm_image_q4_header, cols), offsetof(llm_image_q4_header, group),
           offsetof(llm_image_q4_header, row_bytes));
    printf("TILES_FIELDS %zu %zu %zu %zu %zu\n", offsetof(llm_image_tiles_header, rows),
           offsetof(llm_image_tiles_header, tile_rows), offsetof(llm_image_tiles_header, n_tiles),
           offsetof(llm_image_tiles_header, cols_padded), sizeof(llm_image_tiles_header));
    printf("DRAFTS_FIELDS %zu %zu %zu\n", offsetof(llm_image_drafts_header, contexts),
           offsetof(llm_image_drafts_header, max_draft),
           offsetof(llm_image_drafts_header, min_odds));
    printf("WEIGHTS_FIELDS %zu %zu %zu %zu %zu\n", offsetof(llm_image_weights_header, chosen),
           offsetof(llm_image_weights_header, n_tried),
           offsetof(llm_image_weights_header, positions),
           offsetof(llm_image_weights_header, reserved), sizeof(llm_image_weights_header));
    printf("TRIED_FIELDS %zu %zu %zu %zu %zu\n", offsetof(llm_image_weights_tried, kind),
           offsetof(llm_image_weights_tried, agreement),
           offsetof(llm_image_weights_tried, mean_abs_diff),
           offsetof(llm_image_weights_tried, bytes), sizeof(llm_image_weights_tried));
    printf("TOKENIZER_FIELDS %zu %zu %zu %zu %zu %zu\n",
           offsetof(llm_image_tokenizer_header, n_vocab),
           offsetof(llm_image_tokenizer_header, n_merges),
           offsetof(llm_image_tokenizer_header, n_special),
           offsetof(llm_image_tokenizer_header, flags),
           offsetof(llm_image_tokenizer_header, byte_ids), sizeof(llm_image_tokenizer_header));
    printf("ARCH_ESP32AI %u\nARCH_LLAMA %u\nARCH_COUNT %u\n", LLM_ARCH_ESP32AI, LLM_ARCH_LLAMA,
           LLM_ARCH_COUNT);
    printf("OFF_ARCH %zu\nOFF_N_KV_HEADS %zu\nOFF_NORM_EPS %zu\nOFF_RESERVED %zu\n",
           offsetof(llm_image_header, arch), offsetof(llm_image_header, n_kv_heads),
           offsetof(llm_image_header, norm_eps), offsetof(llm_image_header, reserved));
    return 0;
}
"""


def test_header_constants_match_the_python_side(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = cbuild.build("image_format_probe", [src], tmp_path)
    result = cbuild.run(exe)
    assert result.returncode == 0, result.stderr
    got = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert got.pop("MAGIC").encode() == image.MAGIC
    # HEADER = "<8s16IfI32s16s": rope_theta follows the magic and 16 u32 fields,
    # then eot_id, then the 32-byte fingerprint.
    assert int(got.pop("OFF_ROPE_THETA")) == 8 + 16 * 4
    assert int(got.pop("OFF_SHA")) == 8 + 16 * 4 + 4 + 4
    assert int(got.pop("OFF_SECTION_KIND")) == image.NAME_BYTES
    # HEADER ends "2IfI": arch, n_kv_heads, norm_eps, reserved after the fingerprint
    assert [int(got.pop(k)) for k in ("OFF_ARCH", "OFF_N_KV_HEADS", "OFF_NORM_EPS",
                                      "OFF_RESERVED")] == [112, 116, 120, 124]
    assert int(got.pop("ARCH_COUNT")) == len(image.FAMILIES) == len(image.ARCHS)
    assert int(got.pop("DRAFTS_ORDER")) == drafts_table.ORDER
    assert int(got.pop("DRAFTS_MAX")) == drafts_table.MAX_DRAFT
    assert int(got.pop("DRAFTS_HEADER")) == drafts_table.HEADER.size

    def offsets(py: struct.Struct, fields: list[str]) -> list[int]:
        """The offset of each C field (its struct format, an array one field)
        and the size, after checking that the fields spell the Python format's
        types in its order."""
        def flat(fmt: str) -> str:
            return "".join(code if code == "s" else code * int(n or 1)
                           for n, code in re.findall(r"(\d*)([A-Za-z])", fmt.lstrip("<")))
        assert flat("".join(fields)) == flat(py.format), (fields, py.format)
        at = [struct.calcsize("<" + "".join(fields[:k])) for k in range(len(fields) + 1)]
        assert at[-1] == py.size
        return at

    fields = {k: [int(x) for x in got.pop(k).split()] for k in list(got) if k.endswith("_FIELDS")}
    assert fields["SECTION_FIELDS"] == offsets(image.SECTION, ["16s", "I", "I", "I", "I"])[1:5]
    assert fields["Q4_FIELDS"] == offsets(image.Q4_HEADER, ["I"] * 4)[:4]
    assert fields["TILES_FIELDS"] == offsets(head_tiles.TILES_HEADER, ["I"] * 4)
    # contexts[3], max_draft, min_odds[8]
    assert fields["DRAFTS_FIELDS"] == offsets(drafts_table.HEADER, ["3I", "I", "8H"])[:3]
    assert fields["WEIGHTS_FIELDS"] == offsets(image.WEIGHTS_HEADER, ["I"] * 4)
    assert fields["TRIED_FIELDS"] == offsets(image.WEIGHTS_TRIED, ["I", "f", "f", "I"])
    assert fields["TOKENIZER_FIELDS"] == offsets(tokenizer.HEADER, ["I"] * 4 + ["256H"])
    for name, value in got.items():
        assert int(value) == getattr(image, name), name
    assert image.HEADER.size == image.HEADER_BYTES
    assert image.SECTION.size == image.SECTION_BYTES


def test_python_mirrors_of_engine_limits() -> None:
    """The limits the board's Python and the numpy oracle keep as numbers (they
    cannot import the engine's headers) equal the engine's."""
    import sys

    import engine_ext
    from mpllm.reference import sampler

    _llm = engine_ext.load()
    sys.path.insert(0, str(engine_ext.MODULES))
    import llm

    assert sampler.MAX_TOP_K == _llm.MAX_TOP_K
    assert llm.MAX_DRAFT == drafts_table.MAX_DRAFT
    llm_h = (cbuild.ENGINE / "llm.h").read_text()
    verify_max = int(re.search(r"#define LLM_VERIFY_MAX (\d+)u", llm_h).group(1))
    assert verify_max == drafts_table.MAX_DRAFT + 1


LIMITS_PROBE = r"""
#include <stdio.h>
#include "image.h"
int main(void) {
    printf("MAX_DIM %u\nMAX_HEAD_DIM %u\nMAX_FFN %u\n", LLM_MAX_DIM, LLM_MAX_HEAD_DIM, LLM_MAX_FFN);
    printf("MAX_PLE_COLS %u\nMAX_SEQ_LEN %u\nMAX_VOCAB %u\n", LLM_MAX_PLE_COLS, LLM_MAX_SEQ_LEN,
           LLM_MAX_VOCAB);
    printf("MAX_LAYERS %u\nSECTIONS_BEFORE_LAYERS %u\nSECTIONS_PER_LAYER %u\n",
           (unsigned)LLM_MAX_LAYERS, (unsigned)LLM_SEC_LAYER0, (unsigned)LLM_LSEC_COUNT);
    return 0;
}
"""


def test_engine_limits_match_the_python_side(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """mpllm.formats.limits (what the converter refuses past) is what the
    loader enforces: native/engine/image.h's LLM_MAX_*, compiled."""
    from mpllm.formats import limits

    src = tmp_path / "limits_probe.c"
    src.write_text(LIMITS_PROBE)
    result = cbuild.run(cbuild.build("image_limits_probe", [src], tmp_path))
    assert result.returncode == 0, result.stderr
    got = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(got) == 9
    for name, value in got.items():
        assert int(value) == getattr(limits, name), name
    # the sections after the layers: what LLM_MAX_LAYERS subtracts (image.h's "- 4u")
    image_h = (cbuild.ENGINE / "image.h").read_text()
    after = int(re.search(r"LLM_SEC_LAYER0 - (\d+)u\) / LLM_LSEC_COUNT", image_h).group(1))
    assert after == limits.SECTIONS_AFTER_LAYERS
