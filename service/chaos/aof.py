"""The crash model of ``--lose-last-writes``: a host dying inside ``appendfsync everysec``'s second.

A process crash loses nothing the server wrote (the kernel keeps its page cache); a host crash loses
what was written to the AOF after the last fsync that completed, and never anything before it: that is
what ``WAITAOF`` confirms and what the engine relies on. So the cut must land at or after the offset the
last completed fsync covered, and the chaos command must *know* that offset, not guess it.

How it knows: Valkey is started with a tiny preloaded library (:data:`RECORDER_SOURCE`, built with the
system's C compiler) wrapping ``fsync``/``fdatasync``. Before the real call it reads the file's size;
after the call returns it appends ``<device>:<inode> <size>`` to a log. A line exists only once the
fsync returned, and Valkey confirms a ``WAITAOF`` only after that (its fsync thread reports the job done
after the call returns), so:

* every byte a ``WAITAOF`` confirmed lies below the last logged size of the file (never cut);
* bytes written during or after that fsync may or may not be on disk: a crash may lose them.

At a crash the server is first stopped (SIGSTOP: no write, fsync or reply from then on), the current
``incr`` file of its multi-part AOF (``appendonlydir``, named by the manifest) is measured, a cut point is
drawn between the fsynced size (or what the file held when the server last started: loaded from disk,
so durable) and the end, the server is killed (SIGKILL) and the file truncated there. Valkey loads a
torn last command with ``aof-load-truncated yes`` (its default), as after a real crash.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durapay.config.embedded import EmbeddedValkey

RECORDER_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int log_fd = -1;

__attribute__((constructor)) static void open_log(void) {
    const char *path = getenv("DURAPAY_CHAOS_FSYNC_LOG");
    if (path) log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static long long size_of(int fd, struct stat *st) {
    return fstat(fd, st) == 0 ? (long long)st->st_size : -1;
}

static void record(struct stat *st, long long size) {
    char line[96];
    int n;
    if (log_fd < 0 || size < 0) return;
    n = snprintf(line, sizeof line, "%llu:%llu %lld\n", (unsigned long long)st->st_dev,
                 (unsigned long long)st->st_ino, size);
    if (n > 0) (void)!write(log_fd, line, (size_t)n);
}

int fdatasync(int fd) {
    static int (*real)(int);
    struct stat st;
    long long size = size_of(fd, &st);
    int result;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    result = real(fd);
    if (result == 0) record(&st, size);
    return result;
}

int fsync(int fd) {
    static int (*real)(int);
    struct stat st;
    long long size = size_of(fd, &st);
    int result;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    result = real(fd);
    if (result == 0) record(&st, size);
    return result;
}
"""

AOF_DIR = "appendonlydir"
LOG_VARIABLE = "DURAPAY_CHAOS_FSYNC_LOG"


class CrashModelUnavailable(RuntimeError):
    """The fsync recorder cannot be built here (no C compiler): ``--lose-last-writes`` cannot run faithfully."""


@dataclass(frozen=True)
class Cut:
    """One simulated host crash: the AOF file cut, its size, the fsynced floor, and where it was cut."""

    file: str
    size: int
    floor: int
    cut_at: int

    @property
    def lost_bytes(self) -> int:
        return self.size - self.cut_at


class FsyncRecorder:
    """The preloaded fsync logger of one Valkey server (built into ``folder``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.library = folder / "fsync_recorder.so"
        self.log = folder / "fsync.log"
        #: Per file identity (device:inode): its size when the server last started (it was loaded from disk).
        self.floors: dict[str, int] = {}

    def build(self) -> FsyncRecorder:
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            raise CrashModelUnavailable(
                "--lose-last-writes needs a C compiler (cc) to build its fsync recorder, which tells how much of the "
                "AOF an fsync had made durable; install one (apt-get install gcc) or run without --lose-last-writes"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        source = self.folder / "fsync_recorder.c"
        source.write_text(RECORDER_SOURCE, encoding="utf-8")
        built = subprocess.run(  # noqa: S603 - the compiler found on PATH, our own source file
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(self.library), str(source), "-ldl"],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            raise CrashModelUnavailable(f"building the fsync recorder failed: {built.stderr.strip()[:400]}")
        return self

    def env(self) -> dict[str, str]:
        """The server's environment: this process's, with the recorder preloaded."""
        return {**os.environ, "LD_PRELOAD": str(self.library), LOG_VARIABLE: str(self.log)}

    def fsynced(self, file: Path) -> int | None:
        """The size ``file`` had when its last completed fsync began (None: no fsync of it was logged)."""
        identity = file_identity(file)
        found = None
        if self.log.exists():
            for line in self.log.read_text(encoding="ascii", errors="replace").splitlines():
                name, _, size = line.partition(" ")
                if name == identity and size.strip().isdigit():
                    found = int(size)
        return found

    def started(self, data_dir: Path) -> None:
        """Note what the current AOF file holds as the server (re)starts: all of it came from disk."""
        current = current_incr(data_dir)
        if current is not None:
            self.floors[file_identity(current)] = current.stat().st_size


def file_identity(file: Path) -> str:
    stat = file.stat()
    return f"{stat.st_dev}:{stat.st_ino}"


def current_incr(data_dir: Path) -> Path | None:
    """The AOF file Valkey appends to: the last ``incr`` file its manifest names (None before any)."""
    folder = data_dir / AOF_DIR
    manifests = sorted(folder.glob("*.manifest"))
    if not manifests:
        return None
    name = None
    for line in manifests[-1].read_text(encoding="utf-8").splitlines():
        fields = line.split()
        info = dict(zip(fields[0::2], fields[1::2], strict=False))
        if info.get("type") == "i" and "file" in info:
            name = info["file"]
    return folder / name if name else None


def crash_model_valkey(folder: Path, recorder: FsyncRecorder | None, appendfsync: str) -> EmbeddedValkey:
    """A Valkey (not started) whose AOF a crash can be cut in: the recorder preloaded (when given), and
    no automatic rewrite, so the AOF stays one base and one incr file, the one a crash cuts."""
    env = recorder.env() if recorder else None
    return EmbeddedValkey(folder, appendfsync=appendfsync, extra=("--auto-aof-rewrite-percentage", "0"), env=env)


def stop_and_cut(server: EmbeddedValkey, recorder: FsyncRecorder, draw: Callable[[int, int], int]) -> Cut | None:
    """Freeze ``server``, cut its current AOF file between the fsynced floor and its end, kill it.

    Returns the cut (None when there is no AOF file yet). ``draw(low, high)`` picks the cut point.
    """
    assert server.process is not None, "the server is not running"
    server.process.send_signal(signal.SIGSTOP)
    try:
        current = current_incr(server.data_dir)
        if current is not None:
            size = current.stat().st_size
            floor = max(recorder.fsynced(current) or 0, recorder.floors.get(file_identity(current), 0))
            floor = min(floor, size)
            cut_at = draw(floor, size) if size > floor else size
    finally:
        server.kill()  # SIGKILL ends a stopped process too; kill() waits until it is gone
    if current is None:
        return None
    with current.open("r+b") as handle:
        handle.truncate(cut_at)
    return Cut(current.name, size, floor, cut_at)


def waitaof_waits_for_fsync(client: Any, data_dir: Path, recorder: FsyncRecorder, tries: int = 5) -> bool:
    """Whether the server answers ``WAITAOF 1 0`` only once an fsync covers the write (the recorder's
    log says). False: it answered first, as Redis 7.4.0-7.4.2 do under ``everysec`` within a second
    of the last fsync (fixed in redis/redis#13793), and so does the Valkey bundled here: a host crash
    can then lose writes the engine was told were on disk."""
    for number in range(tries):
        client.set("durapay:chaos:probe", number)
        current = current_incr(data_dir)
        if current is None:
            return True
        written = current.stat().st_size
        answer = client.execute_command("WAITAOF", 1, 0, 2000)
        if int(answer[0]) >= 1 and (recorder.fsynced(current) or 0) < written:
            return False
    return True
