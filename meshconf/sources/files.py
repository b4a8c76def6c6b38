"""Reading a config file with bounded time and memory, whatever the path names."""

from __future__ import annotations

import os
import stat

# Opening a FIFO for reading blocks until a writer comes; non-blocking, it returns at once.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


class NotAFileError(OSError):
    """The path names a directory, FIFO, device or socket rather than a regular file."""

    def __init__(self, message: str, *, directory: bool = False) -> None:
        super().__init__(message)
        self.directory = directory


class TooLargeError(OSError):
    """The file holds more bytes than the limit; ``size`` is what was seen (at least limit+1)."""

    def __init__(self, size: int, limit: int = 0) -> None:
        super().__init__(f"{size:,} bytes, more than the {limit:,} it may have")
        self.size = size


def read_limited(path: str | os.PathLike[str], limit: int, kind: str = "config file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``kind`` names what it should
    be, for the messages (``a directory, not a config file``).

    The size is checked before reading, and at most ``limit + 1`` bytes are read, so a file
    that grows meanwhile cannot make the read unbounded. Raises :class:`NotAFileError` for
    anything but a regular file, :class:`TooLargeError` past ``limit``, and ``OSError`` when
    the file cannot be opened or read.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise NotAFileError(f"is a directory, not a {kind}", directory=True)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(
                f"is not a regular file (a FIFO, device or socket); meshconf reads {kind}s"
            )
        if info.st_size > limit:
            raise TooLargeError(info.st_size, limit)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise TooLargeError(total, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)
