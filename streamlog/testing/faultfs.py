"""A FileIO that simulates power loss, torn writes, flipped bits and I/O errors.

Strategy: `FaultFileIO` passes every call through to an inner FileIO: real files
(`OsFileIO`, the default), so the code under test runs unchanged on a real directory,
or memory (`FaultFileIO(seed, inner=MemoryFileIO())`, testing/memfs.py), so it runs with
no disk at all. Beside the files it keeps a model of what a power loss would leave
behind, as TigerBeetle's `src/testing/storage.zig` does over memory:

  * each file (an *inode*: an open handle and a rename follow it, not its name) has a
    *durable image*, the bytes the last fsync made durable, and the list of writes and
    truncations issued since (its *pending* operations), which the page cache holds but
    the disk may not;
  * the directories have a journal of entry changes (create, rename, unlink) made since
    the last fsync_dir of the directory they happened in.

`crash(rng, mode)` is the power loss. It decides, file by file, what reached the disk,
rewrites the files (through the inner FileIO) to match, and puts the file system in the
CRASHED state: every later call except `close` raises OSError(EIO) and no byte reaches
the disk. The log object that was running is dead: stop it with `log.close()` (its
errors swallowed, see `abandon`), then open the directory again with a new FileIO (for
memory: over the same MemoryFileIO), as a rebooted machine would. The LMDB index does
not go through FileIO, so after a crash it may be *ahead* of the segments; recovery
must cope, and that is part of what the simulation tests.

Crash modes: what reaches the disk of the operations pending on each file.

    mode            files                                     directories
    drop_unsynced   nothing: back to the durable image        back to the last fsync_dir
    torn            the first k operations, the last of them  the first k changes
                    possibly cut short (a frame in half)
    garbage         as torn, then zeros or random bytes up    as torn
                    to the length the file had: the inode
                    size reached the disk, the data did not

Faults scheduled ahead:

    crash_at_step(step, mode)     mutating operation number `step` is issued, then the
                                  power fails before it returns (it raises OSError)
    inject_eio(operation, nth)    the nth call of `operation` from now raises
                                  OSError(EIO); a pwrite may first write a prefix

The mutating operations, counted in `steps` from 1, are: create (an `open` with
create=True of a missing file), pwrite, fsync, truncate, rename, unlink, rmdir,
fsync_dir; the last few are kept in `trace` as (step, operation, path). `makedirs` and
`rmdir` are durable at once (an rmdir with the changes in its directory before it). A
rename across directories, or of a directory (undone, it moves back whole), is one
change, made durable by an fsync_dir of either directory (one journal transaction).

Limits: the model holds each file's durable image in memory, which suits the test logs
of a few megabytes it is meant for. `fsync` does not call the inner fsync unless
`real_fsync=True`: durability is the model's business, and the tests run faster.

Determinism: every random choice comes from the Random passed to `crash` (or made from
`seed`), and files are visited in a fixed order, so a single-threaded workload replays
exactly from its seed. With concurrent appenders, group commit makes the grouping
depend on thread timing; the seed then fixes the faults but not every byte.

Thread-safety: one lock serialises the operations, so a crash asked for by a test
thread lands between two operations of a writer thread, never inside one.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import errno
import os
import random
import threading

from ..fileio import FileIO, OsFileIO, read_file

TRACE_ENTRIES_MAX = 256


class CrashMode(str, enum.Enum):
    DROP_UNSYNCED = "drop_unsynced"
    TORN = "torn"
    GARBAGE = "garbage"


@dataclasses.dataclass(frozen=True, slots=True)
class _Write:
    position: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class _Truncate:
    size: int


class _Inode:
    """One file: what the disk surely holds, and what was issued since the last fsync."""

    __slots__ = ("number", "durable", "pending")

    def __init__(self, number: int, durable: bytes) -> None:
        self.number = number  # creation order: files are visited in this order
        self.durable = bytes(durable)
        self.pending: list[_Write | _Truncate] = []

    def volatile(self) -> bytearray:
        """The content the page cache shows (and the real file holds before a crash)."""
        return _apply(self.durable, self.pending)

    def dirty_from(self) -> int:
        """First position a pending operation may have changed."""
        positions = [op.position if isinstance(op, _Write) else op.size
                     for op in self.pending]
        return min(positions, default=len(self.durable))


@dataclasses.dataclass(frozen=True, slots=True)
class _EntryChange:
    """One directory change since its directory's last fsync_dir, with what undoes it:
    `path` named `before` and names `inode` now (None: no entry); a rename also took
    the entry `source` away."""

    directory: str
    path: str
    inode: _Inode | None
    before: _Inode | None
    source: str | None = None
    tree: bool = False  # the rename of a directory: every name under `source` moved

    def directories(self) -> tuple[str, ...]:
        """The directories whose fsync_dir makes it durable (a rename's source's too)."""
        if self.source is None:
            return (self.directory,)
        return (self.directory, os.path.dirname(self.source))


@dataclasses.dataclass(frozen=True, slots=True)
class _Fault:
    partial: bool  # an injected EIO; True: a pwrite writes a prefix of its data first


@dataclasses.dataclass(frozen=True, slots=True)
class _CrashPlan:
    step: int
    mode: CrashMode
    rng: random.Random


class FaultFileIO:
    """The FileIO protocol of streamlog/fileio.py over another FileIO, with simulated
    faults.

    Args:
        seed: seeds the Random used by crashes that are not given one.
        real_fsync: also fsync through the inner FileIO (off: the model decides
            durability).
        inner: the files underneath (default: the real file system, OsFileIO); a
            `testing.memfs.MemoryFileIO` runs the whole model in memory. It outlives a
            crash: the next FaultFileIO over it is the rebooted machine.
    """

    def __init__(self, seed: int = 0, *, real_fsync: bool = False,
                 inner: FileIO | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.real_fsync = real_fsync
        self.crashed = False
        # Called with (rng, mode) at the instant of a power loss, after the files: what
        # else loses power with this disk (the in-memory index, testing/memindex.py).
        self.crash_hooks: list = []
        self.steps = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.trace: collections.deque = collections.deque(maxlen=TRACE_ENTRIES_MAX)
        self.inner: FileIO = inner if inner is not None else OsFileIO()
        self._lock = threading.RLock()
        self._names: dict[str, _Inode] = {}
        self._handles: dict[int, _Inode] = {}
        self._journal: list[_EntryChange] = []
        self._inode_count = 0
        self._crash_plan: _CrashPlan | None = None
        self._eio: dict[str, dict[int, _Fault]] = collections.defaultdict(dict)

    def __repr__(self) -> str:
        return (f"FaultFileIO(seed={self.seed}, steps={self.steps}, "
                f"crashed={self.crashed}, unsynced_bytes={self.unsynced_bytes()})")

    # -- scheduling faults ----------------------------------------------------------

    def crash_at_step(self, step: int, mode: CrashMode | str = CrashMode.DROP_UNSYNCED,
                      rng: random.Random | None = None) -> None:
        """Lose power while mutating operation number `step` (counted in `steps`) is
        being issued: its effect reaches the page cache, not the disk, and it raises."""
        assert step > self.steps, f"step {step} has already happened ({self.steps})"
        self._crash_plan = _CrashPlan(step, CrashMode(mode), rng or self.rng)

    def inject_eio(self, operation: str, nth: int = 1, *, partial: bool = False) -> None:
        """Make the `nth` call of `operation` from now raise OSError(EIO). With
        `partial`, a failing pwrite first writes a random prefix of its data."""
        assert operation in ("create", "pwrite", "fsync", "truncate", "rename", "unlink",
                             "rmdir", "fsync_dir"), operation
        assert nth >= 1
        self._eio[operation][self.counts[operation] + nth] = _Fault(partial)

    # -- the power loss -------------------------------------------------------------

    def crash(self, rng: random.Random | None = None,
              mode: CrashMode | str = CrashMode.DROP_UNSYNCED) -> None:
        """Lose power now: rewrite the files as `mode` says, then refuse every call."""
        with self._lock:
            self._crash_locked(rng or self.rng, CrashMode(mode))

    def _crash_locked(self, rng: random.Random, mode: CrashMode) -> None:
        assert not self.crashed, "the file system has already crashed"
        names = dict(self._names)
        kept = 0 if mode is CrashMode.DROP_UNSYNCED else rng.randint(0, len(self._journal))
        for change in reversed(self._journal[kept:]):
            names = _undone(names, change)
            if change.tree:  # the directory goes back, whole; the names seen now follow it
                self.inner.rename(change.path, change.source)
                self._names = _moved(self._names, change.path, change.source)
        images: dict[int, bytes] = {}
        for inode in sorted(set(names.values()), key=lambda i: i.number):
            if mode is CrashMode.DROP_UNSYNCED:
                images[inode.number] = inode.durable
            else:
                images[inode.number] = _torn_image(inode, rng,
                                                   garbage=mode is CrashMode.GARBAGE)
        for path in sorted(set(self._names) | set(names)):
            _rewrite(self.inner, path, self._names.get(path), names.get(path), images)
        for inode in names.values():
            inode.durable, inode.pending = images[inode.number], []
        self._names, self._journal = names, []
        self.crashed = True
        self._crash_plan = None
        for hook in self.crash_hooks:
            hook(rng, mode)

    def abandon(self, log) -> None:
        """Crash if not crashed yet, then stop `log` (the dead process's log object):
        its writer threads see only EIO, so nothing more reaches the files."""
        if not self.crashed:
            self.crash()
        try:
            log.close()
        except Exception:  # noqa: BLE001 - the machine is off; the object is garbage
            pass

    # -- helpers for tests ----------------------------------------------------------

    def unsynced_bytes(self) -> int:
        """Bytes written since the last fsync of their file, over every file."""
        with self._lock:
            return sum(len(op.data) for inode in set(self._names.values())
                       for op in inode.pending if isinstance(op, _Write))

    def flip_bit(self, path: str, position: int, bit: int = 0) -> None:
        """Flip one bit of a file on disk, durably (media corruption, not a write).
        Only for a file with no unsynced operations. Allowed after a crash too (the
        disk is still there to damage)."""
        with self._lock:
            _flip_bit_in(self.inner, path, position, bit)
            inode = self._names.get(os.path.abspath(path))
            if inode is not None:
                assert not inode.pending, "flip_bit on a file with unsynced writes"
                image = bytearray(inode.durable)
                image[position] ^= 1 << bit
                inode.durable = bytes(image)

    # -- the FileIO protocol: mutating operations -----------------------------------

    def open(self, path: str, *, writable: bool, create: bool = False) -> int:
        with self._lock:
            self._check_alive()
            inode = self._inode_at(path)
            if inode is not None or not create:
                handle = self.inner.open(path, writable=writable, create=create)
                self._handles[handle] = inode if inode is not None else self._adopt(path)
                return handle
            if self._begin("create", path) is not None:
                raise _eio("create", path)
            handle = self.inner.open(path, writable=writable, create=True)
            inode = self._new_inode(b"")
            self._handles[handle] = inode
            self._names[os.path.abspath(path)] = inode
            self._journal.append(_EntryChange(_directory(path), os.path.abspath(path),
                                              inode, None))
            self._maybe_crash()
            return handle

    def pwritev(self, handle: int, buffers: list, position: int) -> None:  # (joined)
        self.pwrite(handle, b"".join(buffers), position)

    def pwrite(self, handle: int, data, position: int) -> None:
        with self._lock:
            data = bytes(data)
            inode = self._inode_of(handle)
            fault = self._begin("pwrite", self.inner.path_of(handle))
            if fault is not None:
                if fault.partial and data:
                    prefix = data[:self.rng.randrange(len(data))]
                    self.inner.pwrite(handle, prefix, position)
                    inode.pending.append(_Write(position, prefix))
                raise _eio("pwrite", self.inner.path_of(handle))
            self.inner.pwrite(handle, data, position)
            inode.pending.append(_Write(position, data))
            self._maybe_crash()

    def fsync(self, handle: int) -> None:
        with self._lock:
            inode = self._inode_of(handle)
            if self._begin("fsync", self.inner.path_of(handle)) is not None:
                raise _eio("fsync", self.inner.path_of(handle))
            self._maybe_crash()  # the power fails before the disk acknowledges
            if self.real_fsync:
                self.inner.fsync(handle)
            inode.durable, inode.pending = bytes(inode.volatile()), []

    def truncate(self, handle: int, size: int) -> None:
        with self._lock:
            inode = self._inode_of(handle)
            if self._begin("truncate", self.inner.path_of(handle)) is not None:
                raise _eio("truncate", self.inner.path_of(handle))
            self.inner.truncate(handle, size)
            inode.pending.append(_Truncate(size))
            self._maybe_crash()

    def rename(self, source: str, target: str) -> None:
        with self._lock:
            if self._begin("rename", f"{source} -> {target}") is not None:
                raise _eio("rename", source)
            inode = self._inode_at(source)
            tree = inode is None and self.inner.exists(source)  # a directory
            if tree:
                self._adopt_tree(source)
            before = self._inode_at(target)
            self.inner.rename(source, target)
            if tree:  # every name under it moves
                self._names = _moved(self._names, *map(os.path.abspath, (source, target)))
            else:
                assert inode is not None
                del self._names[os.path.abspath(source)]
                self._names[os.path.abspath(target)] = inode
            self._journal.append(_EntryChange(_directory(target), os.path.abspath(target),
                                              inode, before, os.path.abspath(source), tree))
            self._maybe_crash()

    def unlink(self, path: str) -> None:
        with self._lock:
            if self._begin("unlink", path) is not None:
                raise _eio("unlink", path)
            before = self._inode_at(path)
            self.inner.unlink(path)
            assert before is not None
            del self._names[os.path.abspath(path)]
            self._journal.append(_EntryChange(_directory(path), os.path.abspath(path),
                                              None, before))
            self._maybe_crash()

    def rmdir(self, path: str) -> None:
        """Durable at once, with the changes in it before (see the module docstring)."""
        with self._lock:
            if self._begin("rmdir", path) is not None:
                raise _eio("rmdir", path)
            self.inner.rmdir(path)
            directory = os.path.abspath(path)
            self._journal = [c for c in self._journal if directory not in (
                *c.directories(), c.path)]
            self._maybe_crash()

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            if self._begin("fsync_dir", path) is not None:
                raise _eio("fsync_dir", path)
            self._maybe_crash()
            if self.real_fsync:
                self.inner.fsync_dir(path)
            directory = os.path.abspath(path)
            self._journal = [c for c in self._journal if directory not in c.directories()]

    # -- the FileIO protocol: the rest ----------------------------------------------

    def close(self, handle: int) -> None:
        """Allowed after a crash too, so a dead log can let go of its handles."""
        with self._lock:
            self._handles.pop(handle, None)
            self.inner.close(handle)

    def size(self, handle: int) -> int:
        self._check_alive()
        return self.inner.size(handle)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        self._check_alive()
        return self.inner.pread(handle, size, position)

    def listdir(self, path: str) -> list[str]:
        self._check_alive()
        return self.inner.listdir(path)

    def exists(self, path: str) -> bool:
        self._check_alive()
        return self.inner.exists(path)

    def identity(self, path: str) -> tuple:
        self._check_alive()
        return self.inner.identity(path)

    def makedirs(self, path: str) -> None:
        self._check_alive()
        self.inner.makedirs(path)

    def path_of(self, handle: int) -> str:
        return self.inner.path_of(handle)

    def open_shared(self, path: str, size: int, *, writable: bool) -> int:
        """Not durable data (a lock's counters, mapped by live processes): passed
        through and never rewritten by a crash, which would pull the pages from under
        the dead log's mapping."""
        self._check_alive()
        return self.inner.open_shared(path, size, writable=writable)

    def map_shared(self, handle: int, size: int):
        """Passed through, as open_shared."""
        self._check_alive()
        return self.inner.map_shared(handle, size)

    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool:
        """Locks are not state a power loss keeps: passed through."""
        self._check_alive()
        return self.inner.lock(handle, exclusive=exclusive, blocking=blocking)

    def unlock(self, handle: int) -> None:
        """Allowed after a crash too (a dead process's locks go with it)."""
        self.inner.unlock(handle)

    # -- bookkeeping ----------------------------------------------------------------

    def _check_alive(self) -> None:
        if self.crashed:
            raise OSError(errno.EIO, "simulated power loss: the file system is gone")

    def _begin(self, operation: str, path: str) -> _Fault | None:
        """Count one mutating step; the injected fault this call must suffer, if any."""
        self._check_alive()
        self.steps += 1
        self.counts[operation] += 1
        self.trace.append((self.steps, operation, path))
        return self._eio[operation].pop(self.counts[operation], None)

    def _maybe_crash(self) -> None:
        plan = self._crash_plan
        if plan is not None and self.steps >= plan.step:
            self._crash_locked(plan.rng, plan.mode)
            step, operation, path = self.trace[-1]
            raise OSError(errno.EIO, f"simulated power loss during step {step} "
                                     f"({operation} {path})")

    def _inode_of(self, handle: int) -> _Inode:
        self._check_alive()
        inode = self._handles.get(handle)
        if inode is None:  # as the OS would say; a reused descriptor would be worse
            raise OSError(errno.EBADF, f"handle {handle} is not open")
        return inode

    def _inode_at(self, path: str) -> _Inode | None:
        """The inode `path` names, adopting a file the model has not seen yet."""
        inode = self._names.get(os.path.abspath(path))
        if inode is None:
            try:
                inode = self._adopt(path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None  # no file there (nothing, or a directory)
        return inode

    def _adopt_tree(self, directory: str) -> None:
        """Adopt every file under `directory` (a crash may have to put them back)."""
        pending = [directory]
        while pending:  # (a name that is no file is a directory: listed in turn)
            directory = pending.pop()
            pending += [path for path in (os.path.join(directory, name) for name in
                                          self.inner.listdir(directory))
                        if self._inode_at(path) is None]

    def _adopt(self, path: str) -> _Inode:
        """A file that existed before this FileIO saw it: taken as durable."""
        inode = self._new_inode(read_file(self.inner, path))
        self._names[os.path.abspath(path)] = inode
        return inode

    def _new_inode(self, durable: bytes) -> _Inode:
        self._inode_count += 1
        return _Inode(self._inode_count, durable)


def flip_bit(path: str, position: int, bit: int = 0) -> None:
    """Flip bit `bit` of the byte at `position` of the real file at `path`, in place."""
    _flip_bit_in(OsFileIO(), path, position, bit)


def _flip_bit_in(fileio: FileIO, path: str, position: int, bit: int) -> None:
    assert 0 <= bit < 8
    handle = fileio.open(path, writable=True)
    try:
        byte = fileio.pread(handle, 1, position)
        if len(byte) != 1:
            raise ValueError(f"{path} has no byte at position {position}")
        fileio.pwrite(handle, bytes([byte[0] ^ (1 << bit)]), position)
    finally:
        fileio.close(handle)


# -- pure helpers ----------------------------------------------------------------------


def _apply(image: bytes, operations) -> bytearray:
    out = bytearray(image)
    for operation in operations:
        _apply_one(out, operation)
    return out


def _apply_one(out: bytearray, operation: _Write | _Truncate) -> None:
    if isinstance(operation, _Truncate):
        if operation.size < len(out):
            del out[operation.size:]
        else:
            out.extend(bytes(operation.size - len(out)))
        return
    if not operation.data:
        return
    end = operation.position + len(operation.data)
    if operation.position > len(out):
        out.extend(bytes(operation.position - len(out)))
    out[operation.position:end] = operation.data


def _torn_image(inode: _Inode, rng: random.Random, *, garbage: bool) -> bytes:
    """The first k pending operations reach the disk, the k-th perhaps in part; with
    `garbage`, the file then keeps its pre-crash length, filled with junk or zeros."""
    operations = inode.pending
    if not operations:
        return inode.durable
    kept = rng.randint(0, len(operations))
    image = _apply(inode.durable, operations[:max(kept - 1, 0)])
    if kept:
        last = operations[kept - 1]
        if isinstance(last, _Write):
            last = _Write(last.position, last.data[:rng.randint(0, len(last.data))])
        _apply_one(image, last)
    if garbage:
        missing = len(inode.volatile()) - len(image)
        if missing > 0:
            image.extend(rng.randbytes(missing) if rng.random() < 0.5 else bytes(missing))
    return bytes(image)


def _moved(names: dict[str, _Inode], source: str, target: str) -> dict[str, _Inode]:
    """`names` with every name under the directory `source` under `target` instead."""
    return {(target + path[len(source):] if path.startswith(source + os.sep) else path):
            inode for path, inode in names.items()}


def _undone(names: dict[str, _Inode], change: _EntryChange) -> dict[str, _Inode]:
    """`names` (changed in place, but for a directory's rename) before `change`."""
    if change.tree:
        return _moved(names, change.path, change.source)
    if change.before is None:
        names.pop(change.path, None)
    else:
        names[change.path] = change.before
    if change.source is not None:
        names[change.source] = change.inode
    return names


def _rewrite(fileio: FileIO, path: str, current: _Inode | None, target: _Inode | None,
             images: dict[int, bytes]) -> None:
    """Make the file at `path` (in `fileio`, the inner one) hold what the crash left."""
    if target is None:
        if fileio.exists(path):
            fileio.unlink(path)
        return
    image = images[target.number]
    start = 0
    if target is current:
        if not target.pending:
            return  # nothing was pending: the disk already holds the durable image
        start = min(target.dirty_from(), len(image))
    handle = fileio.open(path, writable=True, create=True)
    try:
        fileio.truncate(handle, len(image))
        fileio.pwrite(handle, memoryview(image)[start:], start)
    finally:
        fileio.close(handle)


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _eio(operation: str, path: str) -> OSError:
    return OSError(errno.EIO, f"injected I/O error in {operation} ({path})")
