"""Start and stop a local MongoDB wire-protocol test server (stdlib only).

Two servers are supported, each installed by ``scripts/bootstrap`` in its own venv:

* ``secantus``: SecantusDB (``.venv-secantus/bin/secantusd-py``), the default;
* ``mongoeco``: mongoeco, run by ``.venv-mongoeco/bin/python scripts/mongoeco_server.py``.

From Python::

    from servers import start_server

    with start_server("secantus") as server:
        client = MongoClient(server.uri)

From a shell (foreground, Ctrl-C stops it)::

    python scripts/servers.py run --kind secantus [--port N] [--storage PATH]

The server listens on 127.0.0.1 only; its log goes to ``.servers/<kind>-<port>.log``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Final

ROOT: Final = Path(__file__).resolve().parent.parent
SCRIPTS_DIR: Final = ROOT / "scripts"
LOG_DIR: Final = ROOT / ".servers"
HOST: Final = "127.0.0.1"
KINDS: Final = ("secantus", "mongoeco")

READY_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 10.0
PORT_FREE_TIMEOUT: Final = 15.0
_LISTENING_MARK: Final = b"listening on"

__all__ = ["KINDS", "RunningServer", "ServerError", "free_port", "start_server"]


class ServerError(RuntimeError):
    """The test server could not be found, started or stopped."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _command(kind: str, port: int, storage_path: str | None) -> list[str]:
    if kind == "secantus":
        exe = ROOT / ".venv-secantus" / "bin" / "secantusd-py"
        venv = ".venv-secantus"
    elif kind == "mongoeco":
        exe = ROOT / ".venv-mongoeco" / "bin" / "python"
        venv = ".venv-mongoeco"
    else:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not os.access(exe, os.X_OK):
        raise ServerError(
            f"{kind} test server not installed: {exe.relative_to(ROOT)} is missing "
            f"(run scripts/bootstrap first to create {venv})"
        )
    if kind == "secantus":
        storage = storage_path if storage_path is not None else ":memory:"
        return [str(exe), "--host", HOST, "--port", str(port), "--storage-path", storage]
    cmd = [str(exe), str(SCRIPTS_DIR / "mongoeco_server.py"), "--host", HOST, "--port", str(port)]
    if storage_path is not None:
        cmd += ["--storage", storage_path]
    return cmd


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


class RunningServer:
    """A wire-protocol server process listening on 127.0.0.1; see :func:`start_server`."""

    def __init__(self, kind: str, port: int, storage_path: str | None) -> None:
        self.kind: Final = kind
        self.host: Final = HOST
        self.port: Final = port
        self.storage_path: Final = storage_path
        self.log_path: Final = LOG_DIR / f"{kind}-{port}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0

    @property
    def uri(self) -> str:
        """Connection string for pymongo/Motor (direct connection, no retryable writes)."""
        return f"mongodb://{self.host}:{self.port}/?directConnection=true&retryWrites=false"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        if self.is_running():
            raise ServerError(f"{self.kind} server on port {self.port} is already running")
        cmd = _command(self.kind, self.port, self.storage_path)
        if self.storage_path not in (None, ":memory:"):
            Path(str(self.storage_path)).mkdir(parents=True, exist_ok=True)
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        self._log.flush()
        self._log_offset = self._log.tell()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        in_main_thread = threading.current_thread() is threading.main_thread()
        self._process = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the server
            # PR_SET_PDEATHSIG fires when the creating *thread* exits: main thread only.
            preexec_fn=_die_with_parent if in_main_thread and sys.platform == "linux" else None,
        )
        _live_servers.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _log_text(self) -> bytes:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return fh.read()
        except OSError:
            return b""

    def log_tail(self, lines: int = 30) -> str:
        text = self._log_text().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        delay = 0.05
        while True:
            assert self._process is not None
            code = self._process.poll()
            if code is not None:
                raise ServerError(
                    f"{self.kind} server exited with code {code} before it was ready "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if _LISTENING_MARK in self._log_text() and _accepts_connections(self.port):
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.kind} server not ready on port {self.port} after {READY_TIMEOUT:.0f}"
                    f" s (log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to ``timeout`` seconds for exit, then SIGKILL. Idempotent."""
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    process.wait(timeout=timeout)
        finally:
            _live_servers.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    def restart(self) -> None:
        """Stop, then start again on the same port with the same storage path."""
        self.stop()
        deadline = time.monotonic() + PORT_FREE_TIMEOUT
        while not _port_is_free(self.port):
            if time.monotonic() > deadline:
                raise ServerError(
                    f"port {self.port} still busy {PORT_FREE_TIMEOUT:.0f} s after stop"
                )
            time.sleep(0.1)
        self._start()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"<RunningServer {self.kind} {self.uri} {state}>"


_live_servers: set[RunningServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop()


def start_server(
    kind: str = "secantus",
    storage_path: str | None = None,
    port: int | None = None,
) -> RunningServer:
    """Start a ``kind`` server on 127.0.0.1 and return once it accepts connections.

    ``storage_path`` is a directory for on-disk data (kept across :meth:`RunningServer.restart`);
    ``None`` keeps data in memory. ``port`` defaults to a free port.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {', '.join(KINDS)}")
    if storage_path is not None:
        storage_path = os.path.abspath(storage_path)
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        server = RunningServer(kind, port if port is not None else free_port(), storage_path)
        try:
            server._start()
        except ServerError as error:
            # Another process may have taken the free port between the probe and the bind.
            if "already in use" in str(error).lower() and attempt + 1 < attempts:
                continue
            raise
        return server
    raise AssertionError("unreachable")


def _run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        server = start_server(args.kind, storage_path=args.storage, port=args.port)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    with server:
        print(server.uri, flush=True)
        print(
            f"{server.kind} pid {server.pid}, log {server.log_path}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        while not stop.is_set() and server.is_running():
            stop.wait(0.5)
        if not server.is_running():
            print(f"error: server exited:\n{server.log_tail()}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local MongoDB wire-protocol test servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a server in the foreground and print its URI")
    run.add_argument("--kind", choices=KINDS, default="secantus")
    run.add_argument("--port", type=int, default=None, help="default: a free port")
    run.add_argument("--storage", default=None, help="directory for on-disk data")
    args = parser.parse_args(argv)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
