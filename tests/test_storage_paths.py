"""The places a run writes to, refused before Ray starts: a local path that cannot be made, an
unknown URI scheme; a writable path passes and nothing is created by checking."""

import os
import re

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.storage_paths import require_writable


def test_a_path_under_a_regular_file_is_refused_naming_the_key_and_the_file(tmp_path):
    blocker = tmp_path / "results.txt"
    blocker.write_text("a file where a directory would go")
    wanted = blocker / "runs" / "one"
    with pytest.raises(ConfigError) as caught:
        require_writable(str(wanted), "output.storage_path")
    assert str(caught.value) == (
        f"output.storage_path: {wanted}: {blocker} is a file, not a directory"
    )


def test_a_path_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"^data\.token_cache_dir: .*cache: is a file, not a"):
        require_writable(str(blocker), "data.token_cache_dir")


def test_a_file_uri_under_a_file_is_refused_like_the_path(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    with pytest.raises(
        ConfigError,
        match=rf"^output\.storage_path: file://.*: {re.escape(str(blocker))} is a file, not a "
        "directory$",
    ):
        require_writable(f"file://{blocker}/runs", "output.storage_path")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only directory")
def test_a_path_in_a_read_only_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=r"cannot be created: .*locked is not writable"):
            require_writable(str(locked / "runs"), "output.dir")
    finally:
        locked.chmod(0o755)


def test_a_writable_path_passes_and_is_not_created(tmp_path):
    for location in (tmp_path / "new" / "deeper", tmp_path, f"file://{tmp_path}/new"):
        require_writable(str(location), "output.storage_path")
    require_writable(None, "data.token_cache_dir")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri", ["foo://bucket/runs", "://bucket"])
def test_a_uri_whose_filesystem_is_unknown_is_refused_in_one_line(uri):
    with pytest.raises(pa.ArrowInvalid) as pyarrow_says:
        pafs.FileSystem.from_uri(uri)
    with pytest.raises(ConfigError) as caught:
        require_writable(uri, "output.storage_path")
    assert str(caught.value) == (
        f"output.storage_path: {uri}: cannot resolve its filesystem ({pyarrow_says.value})"
    )
