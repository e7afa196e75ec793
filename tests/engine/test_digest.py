import hashlib
import os

import pytest

from cotainr_lumi.engine import digest
from cotainr_lumi.errors import InputError


def test_sha256_streams_in_chunks(tmp_path):
    f = tmp_path / "blob"
    data = os.urandom(3 * 1024 + 7)
    f.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert digest.sha256_of_file(path=f, chunk_size=1024) == expected


@pytest.fixture
def counted(mocker):
    return mocker.patch.object(
        digest, "sha256_of_file", side_effect=digest.sha256_of_file
    )


def test_an_unchanged_file_is_read_once_and_a_changed_one_again(tmp_path, counted):
    f, cache = tmp_path / "base.sif", tmp_path / "cache" / "sha256.json"
    f.write_bytes(b"one")
    link = tmp_path / "link.sif"
    link.symlink_to(f)
    first = digest.remembered_sha256(path=f, cache_file=cache)
    assert first == hashlib.sha256(b"one").hexdigest()
    assert digest.remembered_sha256(path=link, cache_file=cache) == first
    assert counted.call_count == 1
    assert oct(cache.parent.stat().st_mode & 0o777) == "0o700"
    before = f.stat()
    f.write_bytes(b"two")  # same size, mtime set back: only the ctime moved
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (
        digest.remembered_sha256(path=f, cache_file=cache)
        == hashlib.sha256(b"two").hexdigest()
    )
    assert counted.call_count == 2
    assert [p.name for p in cache.parent.iterdir()] == ["sha256.json"]


def test_a_cache_file_others_can_write_or_a_link_is_not_trusted(tmp_path, counted):
    f, cache = tmp_path / "base.sif", tmp_path / "sha256.json"
    f.write_bytes(b"one")
    digest.remembered_sha256(path=f, cache_file=cache)
    cache.chmod(0o666)
    digest.remembered_sha256(path=f, cache_file=cache)
    assert counted.call_count == 2
    cache.chmod(0o600)
    cache.rename(tmp_path / "real.json")
    cache.symlink_to(tmp_path / "real.json")
    digest.remembered_sha256(path=f, cache_file=cache)
    assert counted.call_count == 3


def test_a_cache_that_cannot_be_written_still_gives_the_digest(tmp_path, counted):
    f, blocker = tmp_path / "base.sif", tmp_path / "a-file"
    f.write_bytes(b"one")
    blocker.write_text("")
    found = digest.remembered_sha256(path=f, cache_file=blocker / "sha256.json")
    assert found == hashlib.sha256(b"one").hexdigest()


def test_the_default_cache_is_the_users(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "base.sif").write_bytes(b"one")
    digest.remembered_sha256(path=tmp_path / "base.sif")
    assert (tmp_path / "cotainr-lumi" / "sha256.json").is_file()


@pytest.mark.parametrize("text", ["5", "[1, 2]", "{", '{"x": 1}', "null"])
def test_a_broken_cache_file_is_read_as_empty(tmp_path, counted, text):
    f, cache = tmp_path / "base.sif", tmp_path / "sha256.json"
    f.write_bytes(b"one")
    cache.write_text(text)
    cache.chmod(0o600)
    found = digest.remembered_sha256(path=f, cache_file=cache)
    assert found == hashlib.sha256(b"one").hexdigest() and counted.call_count == 1
    assert digest.remembered_sha256(path=f, cache_file=cache) == found
    assert counted.call_count == 1


@pytest.mark.parametrize("change", ["renamed over", "written to"])
def test_a_pinned_file_is_read_as_opened_and_a_change_is_one_error(tmp_path, change):
    """The base of a build (issue 38, 2): its bytes, whatever happens to its path."""
    base, cache = tmp_path / "base.sif", tmp_path / "cache" / "sha256.json"
    base.write_bytes(b"the base")
    pinned = digest.Pinned(base)
    pinned.check()
    if change == "renamed over":
        (tmp_path / "other.sif").write_bytes(b"another base")
        os.replace(tmp_path / "other.sif", base)
        with open(pinned.path, "rb") as f:  # the held file, as the mount reads it
            assert f.read() == b"the base"
    else:
        with open(base, "ab") as f:
            f.write(b"!")
    with pytest.raises(InputError, match="base.sif changed during the build"):
        pinned.check()
    with pytest.raises(InputError, match="changed during the build"):
        digest.remembered_sha256(path=base, cache_file=cache, pinned=pinned)


def test_a_fifo_is_never_pinned(tmp_path):
    os.mkfifo(tmp_path / "base.sif")
    with pytest.raises(InputError, match="not a regular file"):
        digest.Pinned(tmp_path / "base.sif")
