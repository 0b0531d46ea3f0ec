"""lstm_tvm._files.atomic_path: a file is replaced whole or not at all."""

import pytest

from lstm_tvm._files import atomic_path


def test_the_file_is_replaced_when_the_block_succeeds(tmp_path):
    target = tmp_path / "lib.so"
    target.write_text("old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".so" and tmp != target
        tmp.write_text("new")
        assert target.read_text() == "old"  # readers see the old file until the end
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib.so"]


def test_the_file_is_left_alone_when_the_block_fails(tmp_path):
    target = tmp_path / "lib.so"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="compiler failed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("compiler failed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib.so"]
