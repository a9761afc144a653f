"""Stories of the engine with its speed-ups against plain mode, bit for bit.

A story is the token ids decoded after a prompt and the sha256 of the raw
float32 logits row of every head evaluation that proposed one of them. Plain
mode (every speed-up off: float K and V, the dense head, one position a pass)
is the reference; the default engine, and the engine with K cached as dots
(set_k_dots), must give the same story one step at a time and with
speculative decoding (verify passes of drafted tokens, kept and rejected
drafts, rewinds). With drafts, a verify pass leaves only its last
kept evaluation's logits (llm_logits after rewind), so those rows are checked,
and every token.

tests/test_kv_dots.py runs a few prompts; the full matrix (20 prompts x 6
samplers x the images given, both decodings, K as floats and as dots) runs by
hand (--preload: the engine's stories with the cache preload hints on):

    python tests/helpers/story_matrix.py IMAGE [IMAGE ...] [--tokens N] [--preload]
        [--f32-reference]

Plain mode reads the head as the engine staged it: with a certificate, the
copy in tile order whose scales are fp16 (engine_open.c). --f32-reference
takes the reference story instead from the image with its certificate
emptied (`uncertified`), whose head is the image's own rows with their f32
scales, and checks plain mode against it too (tests/test_head_f16_scales.py).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (temperature, top_k, seed): greedy; T 0.8 top-40 with two seeds; T 1.0
#: over the whole vocabulary; T 0.5 top-10; T 1.2 top-40
SAMPLERS: list[tuple[float, int, int]] = [
    (0.0, 0, 0), (0.8, 40, 1), (0.8, 40, 2), (1.0, 0, 3), (0.5, 10, 4), (1.2, 40, 5)]


@dataclass(frozen=True)
class Story:
    tokens: list[int]
    rows: dict[int, str]  # index into tokens -> sha256 of the logits that proposed it


def prompts(vocab: int, n: int, seed: int = 34) -> list[list[int]]:
    """n prompts of 1..12 random token ids below vocab (the first of 4 fixed
    ids), the same for a seed."""
    rng = random.Random(seed)
    out = [[433 % vocab, 447 % vocab, 259 % vocab, 405 % vocab]]
    while len(out) < n:
        out.append([rng.randrange(vocab) for _ in range(rng.randint(1, 12))])
    return out


def _sha(m: Any) -> str:
    return hashlib.sha256(m.logits()).hexdigest()


@contextmanager
def _opened(llm: Any, image: str, sampler: tuple[float, int, int], *, plain: bool,
            k_dots: bool, preload: bool) -> Iterator[Any]:
    """The engine a story is decoded with: K as dots or floats, the cache
    preload hints on or left as they are, the sampler set."""
    with llm.Model(image, plain=plain) as m:
        m.set_k_dots(k_dots)
        if preload:
            m.set_preload(True)
        m.sampler(*sampler)
        yield m


def stepped(llm: Any, image: str, prompt: list[int], sampler: tuple[float, int, int],
            n: int, *, plain: bool, k_dots: bool = False, preload: bool = False) -> Story:
    """n tokens one step at a time (fewer when the context fills), every row."""
    with _opened(llm, image, sampler, plain=plain, k_dots=k_dots, preload=preload) as m:
        seq = m.config()["seq_len"]
        tokens = [m.prefill(prompt)]
        rows = {0: _sha(m)}
        while len(tokens) < n and m.pos() < seq:
            tokens.append(m.step(tokens[-1]))
            rows[len(tokens) - 1] = _sha(m)
        return Story(tokens, rows)


def speculative(llm: Any, image: str, prompt: list[int], sampler: tuple[float, int, int],
                n: int, want: list[int], vocab: int, *, k_dots: bool = False,
                preload: bool = False) -> Story:
    """n tokens through verify passes whose drafts are the reference story's next
    tokens (1..7 of them, in turn), every other pass with its last draft made
    wrong: passes of several positions, drafts kept and refused, rewinds."""
    with _opened(llm, image, sampler, plain=False, k_dots=k_dots, preload=preload) as m:
        seq = m.config()["seq_len"]
        tokens = [m.prefill(prompt)]
        rows = {0: _sha(m)}
        k = 0
        while len(tokens) < n and m.pos() < seq:
            k += 1
            room = min(seq - m.pos() - 1, n - len(tokens), 7)
            draft = list(want[len(tokens):len(tokens) + 1 + (k % 7)])[:room]
            if draft and k % 2 == 0:
                draft[-1] = (draft[-1] + 1) % vocab
            pos0 = m.pos()
            got = m.verify([tokens[-1]] + draft)
            kept = 1
            while kept <= len(draft) and draft[kept - 1] == got[kept - 1]:
                kept += 1
            tokens.extend(got[:kept])
            m.rewind(pos0 + kept)
            rows[len(tokens) - 1] = _sha(m)
        return Story(tokens[:n], {i: h for i, h in rows.items() if i < n})


def uncertified(image: Path, out: Path) -> Path:
    """`image` written to `out` with its head certificate emptied (n_tiles 0):
    the engine then stages the head in id order with the image's f32 scales
    and scores it densely."""
    from image_edit import with_section
    from mpllm.formats import head_tiles
    from mpllm.formats.image import read_image

    cfg = read_image(image).config
    empty = head_tiles.TILES_HEADER.pack(cfg.vocab_out, 0, 0, head_tiles.cols_padded(cfg.dim))
    out.write_bytes(with_section(image.read_bytes(), "head_tiles", empty))
    return out


def check(llm: Any, image: str, prompt: list[int], sampler: tuple[float, int, int],
          n: int, vocab: int, k_dots: tuple[bool, ...] = (False, True),
          preload: bool = False, reference: str | None = None) -> list[str]:
    """The differences from plain mode of the engine (K as floats and, or, as
    dots; with the cache preload hints on when `preload`) stepped and with
    speculative decoding ([] when the stories are the same). With `reference`
    (an image of the same weights, e.g. `uncertified`), the reference is plain
    mode on it, and plain mode on `image` is checked against it as well."""
    ref = stepped(llm, reference or image, prompt, sampler, n, plain=True)
    bad = []
    if reference is not None:
        got = stepped(llm, image, prompt, sampler, n, plain=True)
        if got != ref:
            bad.append(f"plain mode against {Path(reference).name}: "
                       f"{_first_difference(ref, got)}")
    for kd in k_dots:
        how = ("K as dots" if kd else "K as floats") + (", preload on" if preload else "")
        got = stepped(llm, image, prompt, sampler, n, plain=False, k_dots=kd, preload=preload)
        if got != ref:
            bad.append(f"{how}, stepped: {_first_difference(ref, got)}")
        spec = speculative(llm, image, prompt, sampler, n, ref.tokens, vocab, k_dots=kd,
                           preload=preload)
        if spec.tokens != ref.tokens or any(ref.rows[i] != h for i, h in spec.rows.items()):
            bad.append(f"{how}, speculative: {_first_difference(ref, spec)}")
    return bad


def _first_difference(ref: Story, got: Story) -> str:
    for i, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        if a != b:
            return f"token {i}: {b} instead of {a}"
    for i in sorted(got.rows):
        if ref.rows.get(i) != got.rows[i]:
            return f"logits row {i} differ"
    return f"{len(got.tokens)} tokens instead of {len(ref.tokens)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The default engine's stories (stepped and "
                                 "speculative) against plain mode's, on 20 prompts x 6 "
                                 "samplers per image: token ids and logits hashes.")
    ap.add_argument("images", nargs="+", type=Path, help="engine images (.img)")
    ap.add_argument("--tokens", type=int, default=120, help="tokens a story (default 120)")
    ap.add_argument("--prompts", type=int, default=20, help="prompts an image (default 20)")
    ap.add_argument("--preload", action="store_true",
                    help="the engine's stories with the cache preload hints on (set_preload)")
    ap.add_argument("--f32-reference", action="store_true",
                    help="the reference from each image with its head certificate emptied "
                         "(its head's f32 rows), plain mode checked against it too")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here)]
    import engine_ext

    llm = engine_ext.load()
    failed = total = 0
    tmp = tempfile.TemporaryDirectory() if args.f32_reference else None
    for image in args.images:
        with llm.Model(str(image)) as m:
            vocab = m.config()["vocab_out"]
        reference = (str(uncertified(image, Path(tmp.name) / f"f32-{image.name}"))
                     if tmp is not None else None)
        t0 = time.time()
        for p, prompt in enumerate(prompts(vocab, args.prompts)):
            for sampler in SAMPLERS:
                total += 1
                bad = check(llm, str(image), prompt, sampler, args.tokens, vocab,
                            preload=args.preload, reference=reference)
                failed += bool(bad)
                for b in bad:
                    print(f"DIFFER {image.name} prompt {p} sampler {sampler}: {b}", flush=True)
            print(f"{image.name}: prompt {p + 1}/{args.prompts} done "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    ref = ("plain mode's on the image with its certificate emptied (f32 head rows), plain "
           "mode's on the image too" if args.f32_reference else "plain mode's")
    print(f"\n{total - failed} of {total} (prompt, sampler, image) stories equal {ref}, "
          f"stepped and speculative, K as floats and as dots"
          f"{', preload on' if args.preload else ''} ({args.tokens} tokens each)")
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
