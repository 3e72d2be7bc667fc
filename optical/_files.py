"""Writing a file so that a reader, a kill or a full disk never leaves half of
it: the new content goes to a temporary file beside it, renamed over it at
the end, after an fsync of the new content, so that a power cut too leaves
the old file or the new one, never an empty one (the rename itself may be
lost: a sweep's run then runs again). Used by the sweep store and by every
``--json`` report and figure."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["absolute", "atomic_write", "cwd_deleted", "linked_to", "named", "own_descriptor",
           "read_plain", "replacing", "replacing_target", "writable_descriptor", "write_output"]

#: The largest JSON file of a model directory read (config.json, an index,
#: sentence-transformers' files: real ones are kilobytes).
MODEL_JSON_BYTES = 1 << 24


@contextlib.contextmanager
def replacing(path: Path, *, exclusive: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write its new content to, which
    replaces ``path`` when the block ends: a reader (or a kill) never sees
    half a file. The new file keeps the permission bits of the one it
    replaces (a new one gets the umask's, as ``open`` gives), and is private
    until then. A failed write (a full disk) leaves ``path`` as it was,
    removes the temporary file and raises an OSError naming ``path``.
    ``exclusive``: ``path`` is created only if no file has that name by then
    (a hard link, atomic), else FileExistsError naming it; on a file system
    without hard links the rename replaces it as otherwise."""
    # At most 100 bytes of the name (255 bytes is the most most file systems
    # take). The process id for the reader; a random part, so that two writers
    # never share a temporary (processes of one id on two hosts sharing a
    # directory, as containers have; two writes of one file in one thread).
    short = os.fsencode(path.name)[:100].decode(errors="ignore")
    tmp = path.with_name(f".{short}.{os.getpid()}.{_unique()}.tmp")
    try:
        # Replacing a file: created private, so that a private file's new
        # content is never readable by others, and given its mode last. A new
        # file: created as open() creates one, so that the kernel applies the
        # umask or the directory's default ACL (a chmod would override the
        # ACL's mask: a shared sweep directory's files unreadable to its group).
        private = os.path.lexists(path)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o600 if private else 0o666))
        yield tmp
        _sync(tmp)  # the content on disk before the name points at it: a power cut
        try:        # leaves the old file or the new one, never an empty one
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:  # a new file: the mode it was created with, or
            if private:            # (the target gone meanwhile, or a dangling link)
                os.chmod(tmp, 0o666 & ~_umask())  # the umask's, as open() gives
        if exclusive:
            _link(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        # A write names no file, a rename or an open the temporary one: name path.
        if isinstance(err, OSError) and err.filename in (None, str(tmp)):
            raise OSError(err.errno, f"{err.strerror or err} while writing it",
                          str(path)) from err
        raise


def _umask() -> int:
    """The process's umask (from /proc on Linux: setting it to read it back
    would race with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _unique() -> str:
    """A random part of a temporary file's name (64 bits, hex)."""
    return os.urandom(8).hex()


def _link(tmp: Path, path: Path) -> None:
    """Give ``tmp``'s file the name ``path`` unless that exists (FileExistsError)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "made by another process meanwhile",
                              str(path)) from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK,
                             errno.ENOSYS):
            raise
        os.replace(tmp, path)  # no hard links on this file system
        return
    tmp.unlink()


def _sync(path: Path) -> None:
    """fsync the file ``path``; a file system that cannot is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)


def read_plain(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, refusing (ValueError naming it) what is not a
    plain file (a FIFO would block for ever, a link to /dev/zero fill the
    memory) or claims more than ``limit`` bytes (a sparse file costs nothing
    on disk or in a tarball, whatever size it claims): a directory from
    someone else may hold either."""
    try:
        # O_NONBLOCK: a FIFO is refused below, not waited on (POSIX only);
        # O_BINARY: Windows' os.open would read text, CRLF as LF.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_BINARY", 0))
    except OSError as err:
        raise named(err, path) from None
    try:
        # fstat before open(): a directory opens (O_RDONLY) but its reads fail
        # with "<fd>: Is a directory".
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a plain file (a FIFO, a device or a directory)")
        if info.st_size > limit:
            raise ValueError(f"{path}: {info.st_size} bytes, more than a file of its kind "
                             f"holds ({limit}); not read")
        with open(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as err:  # EIO and the like: name the file
        raise named(err, path) from None
    finally:
        os.close(fd)


def linked_to(path: Path, others: Iterable[Path]) -> bool:
    """Whether ``path`` is a hard link to one of ``others``: one regular file
    under two names, which ``Path.resolve`` does not see. An output with
    other links is written in place (:func:`replacing_target`), so a report
    written there rewrites every name of the file. False for a path that is
    missing or has one link."""
    try:
        mine = path.stat()
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(mine.st_mode) or mine.st_nlink < 2:
        return False
    for other in others:
        try:
            theirs = other.stat()
        except (OSError, ValueError):
            continue
        if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
            return True
    return False


def named(err: OSError, path: Path | str) -> OSError:
    """``err`` naming ``path`` when it names no file (a read's EIO), of the
    same class (FileNotFoundError stays one)."""
    if err.filename is not None or err.errno is None:
        return err
    return type(err)(err.errno, err.strerror, str(path))


def atomic_write(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` so a reader (or a kill) never sees half a
    file; ``exclusive``: only if ``path`` does not exist (see :func:`replacing`)."""
    with replacing(path, exclusive=exclusive) as tmp:
        tmp.write_text(text)


def _link_hops(path: Path | str) -> Iterator[str]:
    """``path`` made absolute, then each name its symlinks lead to, one link
    at a time, up to the kernel's own limit of 40 links followed."""
    hop = os.path.abspath(path)
    yield hop
    for _ in range(40):
        if not os.path.islink(hop):
            return
        hop = os.path.abspath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
        yield hop


def replacing_target(path: Path) -> Path | None:
    """Where :func:`replacing` should write a user's output ``path``: the file
    its symlinks name (the links are kept), or None for a target that must
    be written in place: one that is not a regular file (a FIFO), one with
    other hard links, or a file descriptor's name, ``/dev/stdout`` or a link
    to it (redirected to a file, a new file there would leave the shell's
    open one behind, and what the command prints with it)."""
    if any(hop.startswith(("/dev/", "/proc/")) for hop in _link_hops(path)):
        return None
    target = Path(os.path.realpath(path))
    if str(target).startswith(("/dev/", "/proc/")):
        return None
    if target.exists() and (not target.is_file() or target.stat().st_nlink > 1):
        return None
    return target


#: Names of one of this process's own descriptors: /dev/stdout, /dev/stderr,
#: /dev/fd/N and /proc/self/fd/N (or /proc/<this pid>/fd/N).
_DESCRIPTOR_NAME = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))"
                              r"|/proc/(?:self|thread-self|(\d+))/fd/(\d+)")


def own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``,
    ``/dev/fd/3``, a symlink to one), or None. Opening such a name opens the
    file behind it afresh: at offset 0 and truncated, where the shell's
    ``>`` or ``>>`` gave the process its own offset (and append mode), so the
    JSON and the table printed after it overwrote each other, and ``>>``
    lost what the file held."""
    for hop in _link_hops(path):
        match = _DESCRIPTOR_NAME.fullmatch(hop)
        if match:
            out, err, fd, pid, proc_fd = match.groups()
            if pid is not None and int(pid) != os.getpid():
                return None
            number = 1 if out else 2 if err else int(fd or proc_fd)
            try:
                os.fstat(number)
            except (OSError, OverflowError):  # not open here: the name fails as it would
                return None
            return number
    return None


def writable_descriptor(number: int) -> bool:
    """Whether descriptor ``number`` is open for writing (``/dev/stdin``, or
    ``5< file``, is not: a report written there was lost after the work)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the write itself will say
        return True
    try:
        return fcntl.fcntl(number, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
    except OSError:
        return False


def cwd_deleted() -> bool:
    """Whether this process's working directory was deleted (a shell left in
    it): relative paths, and spawned processes, then fail with a bare
    ENOENT."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def absolute(path: str | os.PathLike, name: str) -> Path:
    """``path`` made absolute; where it is relative and the working directory
    was deleted (a shell left in it), FileNotFoundError says so, naming
    ``name``, where Python's named nothing."""
    try:
        return Path(path).absolute()
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"No such file or directory ({name} is relative "
                                "to the current directory, which was deleted: cd to a "
                                "directory that exists, or give an absolute path)",
                                str(path)) from None


def _write_to_descriptor(number: int, path: Path, write: Callable[[Any], None]) -> None:
    """``write`` a binary file object on a duplicate of descriptor ``number``
    (which shares its offset and append mode), after what Python's own
    stdout and stderr hold is flushed, so that the file keeps their order."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    try:
        with os.fdopen(os.dup(number), "wb") as file:
            write(file)
    except OSError as err:
        raise named(err, path) from None


def write_output(path: Path, write: Callable[[Any], None]) -> None:
    """Write a user's output file (a report, a figure) by calling ``write``
    on a path: through :func:`replacing` where :func:`replacing_target`
    allows, else in place; in place too where the file may be written but
    not replaced (a directory the user cannot write to, another user's file
    in a sticky one). A file the user may not write is refused
    (PermissionError naming ``path``), as a plain write refuses it, though
    a rename would replace it. A write in place that fails (a full disk)
    leaves the file partly written; an OSError names ``path`` either way.
    A name of one of this process's descriptors (``/dev/stdout``: see
    :func:`own_descriptor`) is written through that descriptor: ``write``
    is then given a binary file object, not a path."""
    number = own_descriptor(path)
    if number is not None:
        _write_to_descriptor(number, path, write)
        return
    target = replacing_target(path)
    if target is None:
        try:
            write(path)
        except OSError as err:
            raise named(err, path) from None
        return
    if target.exists() and not os.access(target, os.W_OK):  # a rename would not ask
        raise PermissionError(errno.EACCES, "Permission denied (the file is read-only)",
                              str(path))
    try:
        with replacing(target) as tmp:
            write(tmp)
    except PermissionError:
        if not (target.is_file() and os.access(target, os.W_OK)):
            raise
        try:
            write(target)
        except OSError as err:
            raise named(err, path) from None
