"""One write path for every file ampgraph writes: a regular file is replaced atomically, a
device or FIFO is written through, and nothing that is not a regular file is ever replaced.

As root, renaming over ``/dev/null`` or ``/dev/full`` turns it into a regular file for the whole
machine; these tests make their own device nodes (``mknod``, root only) and FIFOs in ``tmp_path``
so that a regression breaks nothing outside the test.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampgraph.cli import main
from ampgraph.errors import AmpgraphError
from ampgraph.report.writing import atomic_write, check_writable


def _device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device like /dev/null (minor 3) or /dev/full (minor 7), in ``tmp_path``."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("this container does not allow mknod")
    return path


class _Reader(threading.Thread):
    """Reads a FIFO to its end, as the other side of a shell's ``>(...)`` would."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, b""

    def run(self) -> None:
        with open(self.path, "rb") as handle:
            self.data = handle.read()


def _fifo(tmp_path: Path) -> tuple[Path, _Reader]:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    reader = _Reader(path)
    reader.start()
    return path, reader


def test_a_device_is_written_through_never_replaced(tmp_path: Path) -> None:
    null = _device(tmp_path, "null", 3)
    atomic_write(null, b"anything")
    assert null.is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left


def test_a_full_device_is_an_oserror_and_stays_a_device(tmp_path: Path) -> None:
    full = _device(tmp_path, "full", 7)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(full, b"x" * 100)
    assert full.is_char_device()


def test_a_fifo_is_written_through(tmp_path: Path) -> None:
    path, reader = _fifo(tmp_path)
    atomic_write(path, b"through the pipe")
    reader.join(5)
    assert reader.data == b"through the pipe"
    assert stat.S_ISFIFO(path.lstat().st_mode)


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write(link, b"new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_folder_or_socket_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, b"x")
    with pytest.raises(AmpgraphError, match="it is a folder"):
        check_writable(tmp_path, "baseline")
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(OSError, match="socket"):
            atomic_write(sock_path, b"x")
        with pytest.raises(AmpgraphError, match="it is a socket"):
            check_writable(sock_path, "baseline")
        assert stat.S_ISSOCK(sock_path.lstat().st_mode)


def test_baseline_write_to_a_full_device_is_one_line_and_the_device_stays(tmp_path: Path) -> None:
    full = _device(tmp_path, "full", 7)
    result = CliRunner().invoke(
        main, ["baseline", "write", str(full), "llama-tiny", "-s", "amp-fp32"]
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: cannot write the baseline")
    assert "No space left" in result.output
    assert full.is_char_device()


def test_baseline_write_to_a_fifo_streams_the_baseline(tmp_path: Path) -> None:
    path, reader = _fifo(tmp_path)
    result = CliRunner().invoke(main, ["baseline", "write", str(path), "llama-tiny", "-s", "fp32"])
    reader.join(30)
    assert result.exit_code == 0, result.output
    assert b'"schema": "ampgraph.baseline"' in reader.data
    assert stat.S_ISFIFO(path.lstat().st_mode)


def test_verify_record_to_a_null_device_keeps_the_device(tmp_path: Path) -> None:
    null = _device(tmp_path, "null", 3)
    result = CliRunner().invoke(
        main, ["verify", "llama-tiny", "-s", "fp32", "--device", "cpu", "--record", str(null)]
    )
    assert result.exit_code == 0, result.output
    assert null.is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]
