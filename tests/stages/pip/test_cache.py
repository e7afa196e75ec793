"""Unit tests of cotainr_lumi.stages.pip.cache (host pip cache in and out of the sandbox)."""

import os

from cotainr_lumi.stages.pip.cache import export_cache, import_cache


def test_round_trip_links_in_and_brings_new_entries_back(tmp_path):
    host = tmp_path / "host-cache"
    (host / "http" / "a").mkdir(parents=True)
    (host / "http" / "a" / "entry").write_bytes(b"old")
    (host / "wheels").mkdir()
    (host / "wheels" / "x.whl").write_bytes(b"wheel")
    sandbox_cache = tmp_path / "sandbox" / "opt" / "cache"

    stats = import_cache(host_dir=host, sandbox_dir=sandbox_cache)
    assert stats == {"files": 2, "bytes": 8, "linked": 2}
    assert os.path.samefile(
        sandbox_cache / "http" / "a" / "entry", host / "http" / "a" / "entry"
    )

    # pip writes new entries and replaces old ones (new inodes), as pip does.
    (sandbox_cache / "http" / "b").mkdir()
    (sandbox_cache / "http" / "b" / "new").write_bytes(b"new")
    tmp = sandbox_cache / "wheels" / "tmp"
    tmp.write_bytes(b"rebuilt")
    os.replace(tmp, sandbox_cache / "wheels" / "x.whl")

    stats = export_cache(sandbox_dir=sandbox_cache, host_dir=host)
    assert stats == {"files": 3, "new": 2}
    assert not sandbox_cache.exists()
    assert (host / "http" / "b" / "new").read_bytes() == b"new"
    assert (host / "wheels" / "x.whl").read_bytes() == b"rebuilt"
    assert (host / "http" / "a" / "entry").read_bytes() == b"old"
    assert not [p for p in host.rglob(".cotainr-lumi-*")]


def test_copies_when_hard_links_fail(tmp_path, mocker):
    host = tmp_path / "host"
    host.mkdir()
    (host / "f").write_bytes(b"data")
    mocker.patch(
        "cotainr_lumi.stages.pip.cache.os.link",
        side_effect=OSError(18, "Invalid cross-device link"),
    )
    sandbox_cache = tmp_path / "sb"
    stats = import_cache(host_dir=host, sandbox_dir=sandbox_cache)
    assert stats["linked"] == 0
    assert (sandbox_cache / "f").read_bytes() == b"data"
    assert not os.path.samefile(sandbox_cache / "f", host / "f")
    (sandbox_cache / "g").write_bytes(b"more")
    # "f" is a copy now: it is copied back (harmless), "g" is new.
    assert export_cache(sandbox_dir=sandbox_cache, host_dir=host) == {
        "files": 2,
        "new": 2,
    }
    assert (host / "g").read_bytes() == b"more"


def test_missing_host_cache_is_created_and_missing_sandbox_cache_is_fine(tmp_path):
    host = tmp_path / "new" / "cache"
    assert import_cache(host_dir=host, sandbox_dir=tmp_path / "sb")["files"] == 0
    assert host.is_dir()
    assert export_cache(sandbox_dir=tmp_path / "absent", host_dir=host) == {
        "files": 0,
        "new": 0,
    }
