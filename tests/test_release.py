"""mpllm.board.release: the assets a maker flashes without ESP-IDF, their
manifests (offsets from partitions.csv, sizes, sha256), the merged image, and
esp-web-tools vendored from its pinned npm tarball."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from conftest import web_tools_tarball
from mpllm.board import firmware_pins as pins
from mpllm.board import release
from mpllm.formats.partitions import find, load_partitions

ROOT = Path(__file__).resolve().parent.parent
TABLE = load_partitions(ROOT / pins.BOARD_DIR / "partitions.csv")


@pytest.fixture
def built(tmp_path: Path, tiny_model) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    fw = tmp_path / "in" / "firmware.bin"
    fw.parent.mkdir()
    fw.write_bytes(b"\xe9" + bytes(range(256)) * 40)  # an ESP32 boot image starts with 0xE9
    img = tmp_path / "in" / "model.img"
    img.write_bytes(tiny_model.image.read_bytes())
    return fw, img


def test_web_manifest_offsets_are_the_partition_tables(built: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    fw, img = built
    out = tmp_path / "dist"
    release.build_assets(fw, img, out, "v9.8.7")
    web = json.loads((out / release.WEB_MANIFEST).read_text())
    (build,) = web["builds"]
    assert build["chipFamily"] == "ESP32-S3" and web["version"] == "v9.8.7"
    # the table read here, independently: firmware (bootloader first) at 0x0,
    # the model image at the `model` partition
    assert [(p["path"], p["offset"]) for p in build["parts"]] == [
        (release.FIRMWARE_ASSET, 0x0), (release.MODEL_ASSET, find(TABLE, "model").offset)]
    assert find(TABLE, "model").offset == 0x200000
    assert web["new_install_prompt_erase"] is False  # never wipes the filesystem
    for part in build["parts"]:
        assert (out / part["path"]).is_file()


def test_release_manifest_and_merged_image(built: tuple[Path, Path], tmp_path: Path) -> None:
    fw, img = built
    out = tmp_path / "dist"
    assets = release.build_assets(fw, img, out, "v1.0.0")
    listed = release.parse_release_manifest((out / release.RELEASE_MANIFEST).read_text(), "m")
    assert listed == assets
    for a in listed:
        data = (out / a.name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (a.size, a.sha256)
    assert {a.kind: a.offset for a in listed} == {"firmware": 0, "model": 0x200000,
                                                   "merged": 0}
    merged = (out / release.MERGED_ASSET).read_bytes()
    model_at = find(TABLE, "model").offset
    assert merged[:fw.stat().st_size] == fw.read_bytes()
    assert set(merged[fw.stat().st_size:model_at]) == {0xFF}  # erased flash
    assert merged[model_at:] == img.read_bytes()
    data = json.loads((out / release.RELEASE_MANIFEST).read_text())
    assert (data["micropython"], data["esp_idf"], data["board"]) == (
        pins.MICROPYTHON_TAG, pins.ESP_IDF_VERSION, pins.BOARD)


def test_assets_refuse_what_would_not_boot(built: tuple[Path, Path], tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    fw, img = built
    not_fw = tmp_path / "x.bin"
    not_fw.write_bytes(b"MZ" + bytes(10))
    args = ["assets", "--image", str(img), "--out", str(tmp_path / "o")]
    assert release.main([*args, "--firmware", str(not_fw)]) == 2
    assert "is not an ESP32 firmware image" in capfd.readouterr().err
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.write(b"\xe9")
        f.truncate(0x200000 + 1)
    assert release.main([*args, "--firmware", str(big)]) == 2
    assert "it has 2097152 bytes from 0x0 on" in capfd.readouterr().err
    bad_img = tmp_path / "bad.img"
    data = bytearray(img.read_bytes())
    data[-1] ^= 0xFF  # the last section's CRC no longer matches
    bad_img.write_bytes(bytes(data))
    assert release.main(["assets", "--firmware", str(fw), "--image", str(bad_img), "--out",
                         str(tmp_path / "o")]) == 2
    assert "is not a valid mpllm model image" in capfd.readouterr().err
    assert not (tmp_path / "o" / release.RELEASE_MANIFEST).exists()


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(schema=2), "not an mpllm release manifest"),
    (lambda d: d.update(board="OTHER"), "is for board 'OTHER'"),
    (lambda d: d["files"][0].update(sha256="abc"), "is not 64 hex digits"),
    (lambda d: d["files"][0].update(name="../x"), "is not a plain file name"),
    (lambda d: d["files"][0].update(kind="bootloader"), "kind 'bootloader'"),
    (lambda d: d["files"][0].update(size=-1), "positive integer size"),
])
def test_manifest_errors_are_named(built: tuple[Path, Path], tmp_path: Path, edit,
                                   message: str) -> None:  # type: ignore[no-untyped-def]
    release.build_assets(*built, tmp_path / "d", "v1")
    data = json.loads((tmp_path / "d" / release.RELEASE_MANIFEST).read_text())
    edit(data)
    with pytest.raises(release.ReleaseError, match=message):
        release.parse_release_manifest(json.dumps(data), "m.json")
    with pytest.raises(release.ReleaseError, match="not valid JSON"):
        release.parse_release_manifest("{", "m.json")


def test_vendored_web_tools_are_the_pinned_bundle(tmp_path: Path) -> None:
    tgz = web_tools_tarball()
    files = release.vendor_web_tools(tgz, tmp_path / "v")
    names = {p.name for p in files}
    assert "install-button.js" in names and "LICENSE" in names
    assert any(n.startswith("esp32s3-") for n in names)  # the chip this firmware is for
    # a tarball with other bytes under the same name is refused
    fake = tmp_path / "fake.tgz"
    with tarfile.open(fake, "w:gz") as tar:
        info = tarfile.TarInfo("package/dist/web/install-button.js")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"//"))
    with pytest.raises(release.ReleaseError, match="is not the pinned esp-web-tools"):
        release.vendor_web_tools(fake, tmp_path / "w")


def test_offline_without_the_tarball_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(release.ReleaseError, match="python -m mpllm.board.release web-tools"):
        release.web_tools_tarball(tmp_path, offline=True)


def test_site_has_pages_assets_and_web_tools(built: tuple[Path, Path], tmp_path: Path) -> None:
    release.build_assets(*built, tmp_path / "d", "v1")
    release.assemble_site(tmp_path / "d", tmp_path / "site", web_tools_tarball())
    have = {p.relative_to(tmp_path / "site").as_posix()
            for p in (tmp_path / "site").rglob("*") if p.is_file()}
    for name in ("index.html", "chat.html", "raw_repl.js", "chat.js", "flasher.js",
                 release.FIRMWARE_ASSET, release.MODEL_ASSET, release.WEB_MANIFEST,
                 release.RELEASE_MANIFEST, f"{release.WEB_TOOLS_DIR}/install-button.js"):
        assert name in have, name
    assert release.MERGED_ASSET not in have  # a release download, not for the page
