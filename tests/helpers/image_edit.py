"""Edits of a valid model image that keep everything else valid: one section's
payload replaced, the sections after it moved to their aligned places, every
CRC (sections and header) recomputed. What a test or fuzzer needs to reach one
section's own checks in the C loader instead of a checksum or layout error."""

from __future__ import annotations

import dataclasses
import zlib

from mpllm.formats.align import align_up
from mpllm.formats.image import ALIGN, HEADER_BYTES, SECTION, SECTION_BYTES, Section, read_header


def with_section(image: bytes, name: str, payload: bytes) -> bytes:
    """`image` with section `name`'s payload replaced by `payload` (any length)."""
    header, sections = read_header(image)
    payloads = [payload if s.name == name else image[s.offset:s.offset + s.size]
                for s in sections]
    if all(s.name != name for s in sections):
        raise KeyError(f"the image has no section {name!r}")
    pos = align_up(HEADER_BYTES + SECTION_BYTES * len(sections), ALIGN)
    out = bytearray(pos)
    moved = []
    for s, p in zip(sections, payloads):
        out += bytes(align_up(len(out), ALIGN) - len(out))
        moved.append(Section(s.name, s.kind, len(out), len(p), zlib.crc32(p)))
        out += p
    header = dataclasses.replace(header, file_bytes=len(out), header_crc32=0)
    table = b"".join(SECTION.pack(s.name.encode("ascii"), s.kind, s.offset, s.size, s.crc32)
                     for s in moved)
    header = dataclasses.replace(header, header_crc32=zlib.crc32(table,
                                                                 zlib.crc32(header.pack())))
    out[:HEADER_BYTES + len(table)] = header.pack() + table
    return bytes(out)


def section_payload(image: bytes, name: str) -> bytes:
    """The payload of section `name`."""
    _header, sections = read_header(image)
    for s in sections:
        if s.name == name:
            return image[s.offset:s.offset + s.size]
    raise KeyError(f"the image has no section {name!r}")


def tokenizer_verdicts(image: bytes, section: bytes) -> tuple[str | None, str | None]:
    """The two readers of a tokenizer section on `image` with `section` in place of its
    own: the C loader (`_llm.Model`, the engine's words after "bad image: ") and the
    board's Python (`llm_tokenizer.Tokenizer` with the header's vocab_out). Each is None
    where it accepts, else its message (a Python exception other than ValueError comes
    back as its type and text: a crash, never an agreement)."""
    import llm_tokenizer
    from engine_ext import load

    _llm = load()
    edited = with_section(image, "tokenizer", section)
    c: str | None = None
    try:
        _llm.Model(edited).close()
    except _llm.Error as e:
        c = str(e).removeprefix("bad image: ")
    vocab_out = read_header(image)[0].config.vocab_out
    py: str | None = None
    try:
        llm_tokenizer.Tokenizer(section, vocab_out)
    except ValueError as e:
        py = str(e)
    except Exception as e:  # noqa: BLE001 - any other failure is a finding
        py = f"{type(e).__name__}: {e}"
    return c, py
