"""A real pair's converted IR is kept in the cache and linked into place by a later install (catalog.copy_tree):
the same bytes, no second copy on disk, an incomplete copy replaced."""

import os

from inference.pairs import catalog


def test_a_kept_ir_is_linked_into_place_and_replaces_an_incomplete_one(tmp_path):
    kept = tmp_path / "cache" / "ir" / "pair-1234"
    (kept / "main").mkdir(parents=True)
    (kept / "main" / "openvino_model.bin").write_bytes(b"weights")
    (kept / "main" / "openvino_model.xml").write_text("<net/>")
    folder = tmp_path / "models" / "pair"
    (folder / "draft").mkdir(parents=True)  # what an interrupted install left
    catalog.copy_tree(kept, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["main"]
    assert (folder / "main" / "openvino_model.bin").read_bytes() == b"weights"
    assert os.stat(folder / "main" / "openvino_model.bin").st_nlink == 2  # linked, not copied
    assert not folder.with_name("pair.partial").exists()


def test_the_kept_ir_is_named_by_what_decides_its_bytes(settings, tmp_path):
    from dataclasses import replace

    settings.CACHE_DIR = tmp_path
    real = catalog.QWEN_CODER
    other_format = replace(real, draft=replace(real.draft, weight_format="int8"))
    assert catalog.converted_ir(real).parent == tmp_path / "ir"
    assert catalog.converted_ir(real) != catalog.converted_ir(other_format)
    assert catalog.converted_ir(real) == catalog.converted_ir(replace(real))
