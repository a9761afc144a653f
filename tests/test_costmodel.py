"""The ESP32-S3 cost model (mpllm.costmodel): anchors, measured counters, report.

The model is fitted on two stock anchors (head, attention) and must then
predict the other published figures within costmodel.ANCHOR_TOLERANCE; our
build's prediction must come from the engine's measured byte counters and the
PIE host model's instruction counters.
"""

from __future__ import annotations

import dataclasses

import engine_ext
import pytest
from mpllm import costmodel as cm


@pytest.fixture(scope="module")
def llm_mod():
    return engine_ext.load()


@pytest.fixture(scope="module")
def measured(release_model, llm_mod) -> cm.Measured:
    return cm.measure_host(str(release_model.image), llm_module=llm_mod, n_steps=200)


def test_stock_anchors_fitted_exactly_and_others_predicted() -> None:
    rep = cm.report()
    stock = rep.predictions["stock"]
    # the two fitted stages are exact by construction
    assert stock["head"] == pytest.approx(cm.ANCHORS_MS["stock"]["head"], abs=1e-9)
    assert stock["attn"] == pytest.approx(cm.ANCHORS_MS["stock"]["attn"], abs=1e-9)
    # the rest are predictions held to the stated tolerance
    for build, stages in cm.ANCHORS_MS.items():
        for st, published in stages.items():
            got = rep.predictions[build][st]
            assert abs(got - published) <= cm.ANCHOR_TOLERANCE * published, (build, st, got)
    # physically sensible fitted constants: a scalar int8 MAC costs a few
    # cycles, any other scalar op about one
    assert 1.0 < rep.fit.c_mac_i8 < 8.0
    assert 0.3 < rep.fit.c_op < 4.0


def test_fit_moves_with_the_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    base = cm.fit_stock()
    monkeypatch.setitem(cm.ANCHORS_MS, "stock", {**cm.ANCHORS_MS["stock"], "head": 70.0})
    assert cm.fit_stock().c_mac_i8 > base.c_mac_i8


@pytest.mark.parametrize("shape", [(768, 96, 128), (288, 96, 128), (96, 66, 128),
                                   (25353, 96, 128), (96, 128, 128), (37, 300, 128),
                                   (5, 33, 32), (3, 1, 128), (17, 256, 64)])
def test_pie_counts_measured_equal_closed_form(shape: tuple[int, int, int]) -> None:
    counts = cm.measure_pie_counts([shape])
    assert counts[shape] == cm.pie_matvec_instructions(*shape)


def test_engine_byte_counters_equal_the_formulas(measured: cm.Measured) -> None:
    # measure_host raises unless the counters match the formulas byte for
    # byte; here: the per-token result is what the release plan implies
    s = cm.RELEASE
    per_pos = [cm.engine_stage_bytes(s, p) for p in measured.positions]
    for region in cm.REGIONS:
        expect = sum(st[region] for d in per_pos for st in d.values()) / len(per_pos)
        assert measured.region_bytes[region] == pytest.approx(expect, rel=1e-12)
    # the head dominates PSRAM: 25,353 rows x (48 code + 4 scale) bytes
    assert measured.region_bytes["bulk"] > 25353 * 52
    # measured PIE counts are used, and sum to the per-token figure
    per_tok = sum(measured.pie_per_call[m.name] * m.per_token for m in cm.matrices(s))
    assert per_tok == sum(cm.pie_matvec_instructions(m.rows, m.cols, s.group) * m.per_token
                          for m in cm.matrices(s))


@pytest.mark.parametrize("name", ["tiny_untied", "small"])
def test_byte_counters_other_shapes(test_model, llm_mod, name: str) -> None:
    m = cm.measure_host(str(test_model(name).image), llm_module=llm_mod, n_steps=20, pie=False)
    assert m.region_bytes["fast"] > 0 and m.region_bytes["bulk"] > 0


def test_check_bytes_names_the_disagreeing_region() -> None:
    good = cm.run_region_bytes(cm.RELEASE, 4, 10)
    assert cm.check_bytes(good, cm.RELEASE, 4, 10) == good
    with pytest.raises(ValueError, match="bulk: engine"):
        cm.check_bytes({**good, "bulk": good["bulk"] + 4}, cm.RELEASE, 4, 10)


def test_ours_is_computed_from_the_measured_counters(measured: cm.Measured) -> None:
    base = cm.report(measured).predictions["ours"]
    more_bulk = dataclasses.replace(
        measured, region_bytes={**measured.region_bytes,
                                "bulk": 2 * measured.region_bytes["bulk"]})
    doubled = cm.report(more_bulk).predictions["ours"]
    assert doubled["head"] > base["head"] * 1.5 and doubled["attn"] > base["attn"] * 1.3
    assert doubled["ffn"] == pytest.approx(base["ffn"])  # core bytes are SRAM: free
    slower_pie = dataclasses.replace(
        measured, pie_per_call={**measured.pie_per_call,
                                "head": 10 * measured.pie_per_call["head"]})
    assert cm.report(slower_pie).predictions["ours"]["head"] > base["head"] + 5.0
    # and the analytic counters give the same answer, since they agree
    analytic = cm.report(None, positions=measured.positions).predictions["ours"]
    for st in (*cm.STAGES, "total"):
        assert base[st] == pytest.approx(analytic[st], rel=1e-9)


def test_table_json_and_plot(measured: cm.Measured, tmp_path) -> None:
    rep = cm.report(measured)
    table = rep.table()
    for b in cm.BUILDS.values():
        assert b.label in table
    assert "+0.0%" in table and "published" in table
    rows = rep.rows()
    assert len(rows) == 3 * (len(cm.STAGES) + 1)
    data = rep.to_json()
    assert data["measured"]["pie_per_call"]["head"] == measured.pie_per_call["head"]
    png = cm.plot(rep, tmp_path / "cost.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_positions_outside_the_context_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside the 256-position context"):
        cm.build_work(cm.BUILDS["ours"], cm.RELEASE, [300])
