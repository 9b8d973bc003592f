"""The metadata store that stands in for xattrs where gVisor's gofer refuses them (issue 21,
item 10): keyed by path, carried along by moves, dropped by removals and for files that are
gone, and read back by a fresh envd (a restored or forked sandbox) from the file alone."""

from __future__ import annotations

from pathlib import Path

from aenv.envd.filesystem.metadata_store import MetadataStore


def test_put_get_replace_and_clear(tmp_path: Path) -> None:
    store = MetadataStore(str(tmp_path / "store"))
    f = tmp_path / "f"
    f.write_text("x")
    assert store.get(str(f)) == {}
    assert not store.has_entries()
    store.put(str(f), {"a": "1"})
    assert store.get(str(f)) == {"a": "1"}
    store.put(str(f), {"b": "2"})
    assert store.get(str(f)) == {"b": "2"}
    store.put(str(f), {})
    assert store.get(str(f)) == {}
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700


def test_a_new_instance_reads_what_was_saved(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    MetadataStore(str(tmp_path / "store")).put(str(f), {"k": "v"})
    assert MetadataStore(str(tmp_path / "store")).get(str(f)) == {"k": "v"}


def test_moves_and_removals_of_trees(tmp_path: Path) -> None:
    store = MetadataStore(str(tmp_path / "store"))
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "dd").mkdir()
    for name in ("d/sub/a", "d/b", "dd/c"):
        (tmp_path / name).write_text("x")
        store.put(str(tmp_path / name), {"name": name})
    (tmp_path / "d").rename(tmp_path / "e")
    store.move_tree(str(tmp_path / "d"), str(tmp_path / "e"))
    assert store.get(str(tmp_path / "e/sub/a")) == {"name": "d/sub/a"}
    assert store.get(str(tmp_path / "e/b")) == {"name": "d/b"}
    assert store.get(str(tmp_path / "dd/c")) == {"name": "dd/c"}  # a sibling, not below d
    store.forget_tree(str(tmp_path / "e"))
    assert store.get(str(tmp_path / "e/b")) == {}
    assert store.has_entries()


def test_entries_of_vanished_files_are_dropped_on_save(tmp_path: Path) -> None:
    store = MetadataStore(str(tmp_path / "store"))
    for name in ("a", "b"):
        (tmp_path / name).write_text("x")
        store.put(str(tmp_path / name), {"n": name})
    (tmp_path / "a").unlink()
    store.put(str(tmp_path / "b"), {"n": "b2"})
    assert "/a" not in (tmp_path / "store" / "file-metadata.json").read_text().replace(
        str(tmp_path), ""
    )
