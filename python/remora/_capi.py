"""ctypes bindings of Remora's C API (include/remora/remora.h) and of ROCm's
rocattach API as Remora implements it (include/rocattach.h).

Nothing here is compiled: the structs below mirror the C headers field by
field, and every struct the library reads or writes carries its size, so a
newer libremora.so keeps working with these bindings (remora.h: "Structs are
size-prefixed"). A library is loaded once per path and kept for the life of
the process: libremora.so holds one process-wide controller, which remembers
the processes it attached (remora_detach(0), remora_detach_tree).
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
from pathlib import Path

__all__ = [
    "Status",
    "RemoraError",
    "Backend",
    "RemoraBackend",
    "RocattachBackend",
    "load",
    "find_library",
    "exit_code_for",
]

# The names of the shared libraries.
REMORA_SONAME = "libremora.so.0"
REMORA_FILE = "libremora.so"
DEFAULT_TOOL_FILE = "libremora-tool.so"


class Status(enum.IntEnum):
    """remora_status_t: same numbers, same order as the C enum."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    NO_SUCH_PROCESS = 2
    OWN_PROCESS = 3
    ZOMBIE = 4
    KERNEL_THREAD = 5
    STATIC_BINARY = 6
    TRACED_BY_OTHER = 7
    PTRACE_DENIED = 8
    LIBRARY_NOT_MAPPED = 9
    AMBIGUOUS_LIBRARY = 10
    SYMBOL_NOT_FOUND = 11
    TIMED_OUT = 12
    TARGET_EXITED = 13
    FAULT = 14
    PARSE = 15
    IO = 16
    NOT_SUPPORTED = 17
    IDENTITY_MISMATCH = 18
    INTERNAL = 19
    REFUSED = 20
    NOT_ATTACHABLE = 21
    TOOL_FAILED = 22
    NOT_ATTACHED = 23
    ALREADY_ATTACHED = 24


class RocattachStatus(enum.IntEnum):
    """rocattach_status_t (values and order as in ROCm)."""

    SUCCESS = 0
    ERROR = 1
    ERROR_INVALID_ARGUMENT = 2
    ERROR_NOT_SUPPORTED = 3
    ERROR_PTRACE_ERROR = 4
    ERROR_PTRACE_OPERATION_NOT_PERMITTED = 5
    ERROR_PTRACE_PROCESS_NOT_FOUND = 6


class RemoraError(Exception):
    """A Remora call failed.

    code:    the status code (remora_status_t, or rocattach_status_t when the
             library in use is a rocattach library; see `api`)
    name:    the code's enumerator name, e.g. "REMORA_STATUS_NO_SUCH_PROCESS"
    message: what failed and how to fix it (remora_last_error())
    api:     "remora" or "rocattach"
    pid:     the process the call was about, or None
    """

    def __init__(self, code: int, name: str, message: str, *, api: str = "remora", pid: int | None = None):
        self.code = int(code)
        self.name = name
        self.message = message
        self.api = api
        self.pid = pid
        super().__init__(f"{message} [{name}]" if message else name)

    @property
    def exit_code(self) -> int:
        """The exit code rocprof-attach (and the `remora` command) use for it."""
        return exit_code_for(self.code, self.api)


# Exit codes: the table of the `remora` command (cli/exit_codes.h,
# docs/cli.md), so that scripts branch the same way on both commands.
EXIT_OK = 0
EXIT_USAGE = 1
EXIT_CODES = [
    (0, "success"),
    (1, "usage: bad command line or argument value (invalid-argument)"),
    (2, "no such process, a zombie, a kernel thread, or this process itself"),
    (3, "ptrace refused (uid, CAP_SYS_PTRACE, Yama ptrace_scope), or another tracer holds the process"),
    (4, "a library Remora needs is not mapped or ambiguous, a symbol is missing, or a file differs"),
    (5, "not supported: statically linked target, kernel, libc or architecture"),
    (6, "timed out"),
    (7, "the target exited during the operation"),
    (8, "a call in the target faulted"),
    (9, "a system call failed, or a /proc or ELF file was malformed"),
    (10, "internal error in Remora (please report it)"),
    (11, "the target refuses tools (REMORA_TOOL_ATTACH=0 or ROCP_TOOL_ATTACH=0)"),
    (12, "a tool is not attachable, failed to load, or a callback failed"),
    (13, "not attached (detach), or already attached (attach)"),
]

_REMORA_EXIT = {
    Status.SUCCESS: 0,
    Status.INVALID_ARGUMENT: 1,
    Status.NO_SUCH_PROCESS: 2,
    Status.OWN_PROCESS: 2,
    Status.ZOMBIE: 2,
    Status.KERNEL_THREAD: 2,
    Status.TRACED_BY_OTHER: 3,
    Status.PTRACE_DENIED: 3,
    Status.LIBRARY_NOT_MAPPED: 4,
    Status.AMBIGUOUS_LIBRARY: 4,
    Status.SYMBOL_NOT_FOUND: 4,
    Status.IDENTITY_MISMATCH: 4,
    Status.STATIC_BINARY: 5,
    Status.NOT_SUPPORTED: 5,
    Status.TIMED_OUT: 6,
    Status.TARGET_EXITED: 7,
    Status.FAULT: 8,
    Status.IO: 9,
    Status.PARSE: 9,
    Status.INTERNAL: 10,
    Status.REFUSED: 11,
    Status.NOT_ATTACHABLE: 12,
    Status.TOOL_FAILED: 12,
    Status.NOT_ATTACHED: 13,
    Status.ALREADY_ATTACHED: 13,
}

# rocattach folds Remora's codes into fewer families (include/rocattach.h);
# each goes to the family its most common cause belongs to.
_ROCATTACH_EXIT = {
    RocattachStatus.SUCCESS: 0,
    RocattachStatus.ERROR_INVALID_ARGUMENT: 1,
    RocattachStatus.ERROR_PTRACE_PROCESS_NOT_FOUND: 2,
    RocattachStatus.ERROR_PTRACE_OPERATION_NOT_PERMITTED: 3,
    RocattachStatus.ERROR_NOT_SUPPORTED: 5,
    RocattachStatus.ERROR_PTRACE_ERROR: 9,
    RocattachStatus.ERROR: 12,
}


def invalid_argument(message: str, pid: int | None = None) -> RemoraError:
    """A RemoraError for an argument this package refuses before any call."""
    return RemoraError(Status.INVALID_ARGUMENT, "REMORA_STATUS_INVALID_ARGUMENT", message, pid=pid)


def unload_unsupported(library: str) -> RemoraError:
    """A RemoraError for unload=True with a library that cannot unload."""
    return RemoraError(
        Status.NOT_SUPPORTED,
        "REMORA_STATUS_NOT_SUPPORTED",
        f"{library} cannot unload the agent (unload needs libremora.so of API 0.2 or later, which has "
        "remora_detach_with); pass attach_library=remora.library_path() or detach without unload",
    )


def exit_code_for(code: int, api: str = "remora") -> int:
    """The command's exit code for status `code` of `api` ("remora" or "rocattach")."""
    table = _ROCATTACH_EXIT if api == "rocattach" else _REMORA_EXIT
    return table.get(code, 10)  # an unknown status: treat as internal


# --- structs (remora.h) -----------------------------------------------------

pid_t = ctypes.c_int


class _Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("timeout_msec", ctypes.c_uint32),
        ("tools", ctypes.c_char_p),
        ("env", ctypes.POINTER(ctypes.c_char_p)),
        ("env_count", ctypes.c_size_t),
        ("attach_children", ctypes.c_bool),
        ("lease", ctypes.c_bool),
        ("channel", ctypes.c_uint8),  # REMORA_CHANNEL_* (0.4; reserved before)
        ("reserved", ctypes.c_uint8 * 5),
        ("agent_path", ctypes.c_char_p),
    ]


class _AgentState(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("agent_loaded", ctypes.c_bool),
        ("attached", ctypes.c_bool),
        ("lease_expired", ctypes.c_bool),
        ("session_channel", ctypes.c_uint8),  # REMORA_CHANNEL_PTRACE or _SOCKET (0.4; reserved before)
        ("sessions", ctypes.c_uint64),
        ("detaches", ctypes.c_uint64),
        ("listener_tid", pid_t),
        ("lease_pid", pid_t),
        ("tools", ctypes.c_char * 4096),
        ("message", ctypes.c_char * 2048),
    ]


class _DetachOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("timeout_msec", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("children", ctypes.c_bool),
        ("channel", ctypes.c_uint8),  # REMORA_CHANNEL_* (0.4; reserved before)
        ("reserved", ctypes.c_uint8 * 2),
        ("kept_tools", ctypes.c_char * 4096),
    ]


DETACH_UNLOAD = 0x1  # REMORA_DETACH_UNLOAD
# REMORA_CHANNEL_*: how the agent is reached (remora.h).
CHANNELS = {"auto": 0, "ptrace": 1, "socket": 2}


def channel_code(channel: str) -> int:
    """The REMORA_CHANNEL_* value of "auto", "ptrace" or "socket"."""
    try:
        return CHANNELS[channel]
    except KeyError:
        raise invalid_argument(f"channel {channel!r}: use 'auto', 'ptrace' or 'socket'") from None
CHECK_TREE = 0x1  # REMORA_CHECK_TREE


def _decode(b: bytes | None) -> str:
    return (b or b"").decode("utf-8", "replace")


def _encode(s: str) -> bytes:
    # Paths and environment values travel as the OS sees them.
    return os.fsencode(s)


# --- finding and loading ----------------------------------------------------

_PACKAGE_DIR = Path(__file__).resolve().parent


def find_library(attach_library: str | os.PathLike | None = None) -> str:
    """The library to load: `attach_library`, else $REMORA_LIBRARY (a path,
    or a bare name for the dynamic loader), else libremora.so in
    ../build/lib next to this package (a source checkout), else the soname
    libremora.so.0 for the dynamic loader (ldconfig, LD_LIBRARY_PATH). Raises RemoraError (INVALID_ARGUMENT) when a path given
    explicitly does not exist."""
    for source, value in (("attach_library", attach_library), ("REMORA_LIBRARY", os.environ.get("REMORA_LIBRARY"))):
        if value:
            value = os.fspath(value)
            if os.sep not in value and not os.path.exists(value):
                return value  # a bare name ("libremora.so.0"): the dynamic loader searches it
            path = os.path.abspath(value)
            if not os.path.exists(path):
                raise invalid_argument(
                    f"{source} names {path}, which does not exist: build Remora (cmake --build build) "
                    "or give the path of libremora.so (or of librocprofiler-sdk-rocattach.so)",
                )
            return path
    # A source checkout (python/remora -> build/lib), then an installed tree
    # (share/remora/python/remora -> lib, and the multiarch lib dir).
    prefix = _PACKAGE_DIR.parent.parent.parent.parent
    for candidate in (
        _PACKAGE_DIR.parent.parent / "build" / "lib" / REMORA_FILE,
        prefix / "lib" / REMORA_FILE,
        *sorted(prefix.glob("lib/*-linux-gnu/" + REMORA_FILE)),
    ):
        if candidate.exists():
            return str(candidate)
    return REMORA_SONAME


def _mapped_path(name: str) -> str | None:
    """The path of the mapped file whose name starts with `name`, from
    /proc/self/maps (how a library found by soname is located)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(name):
                    return parts[5].strip()
    except OSError:
        pass
    return None


class Backend:
    """One loaded library. Subclasses speak its API."""

    api = ""

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self.cdll = cdll
        self.path = path  # as loaded (a path, or the soname)
        self.lock = threading.Lock()  # guards tree_roots
        self.tree_roots: set[int] = set()  # roots attached with children, for detach

    @property
    def directory(self) -> str | None:
        """The directory the library lies in, where the default tool is looked for."""
        path = self.path if os.sep in self.path else _mapped_path(self.path)
        return os.path.dirname(os.path.realpath(path)) if path else None

    def default_tools(self) -> str | None:
        """libremora-tool.so next to the library, if it is there."""
        d = self.directory
        if d:
            tool = os.path.join(d, DEFAULT_TOOL_FILE)
            if os.path.exists(tool):
                return tool
        return None


class RemoraBackend(Backend):
    """libremora.so (remora.h)."""

    api = "remora"

    def __init__(self, cdll: ctypes.CDLL, path: str):
        super().__init__(cdll, path)
        c = cdll
        status_t = ctypes.c_int
        c.remora_options_init_sized.argtypes = [ctypes.POINTER(_Options), ctypes.c_size_t]
        c.remora_options_init_sized.restype = status_t
        for fn in (c.remora_attach, c.remora_attach_tree):
            fn.argtypes = [pid_t, ctypes.POINTER(_Options)]
            fn.restype = status_t
        for fn in (c.remora_detach, c.remora_detach_tree):
            fn.argtypes = [pid_t]
            fn.restype = status_t
        c.remora_status.argtypes = [pid_t, ctypes.POINTER(_AgentState)]
        c.remora_status.restype = status_t
        # Since API 0.2 (symbol version REMORA_1); an older libremora.so cannot unload.
        self.can_unload = hasattr(c, "remora_detach_with")
        if self.can_unload:
            c.remora_detach_options_init_sized.argtypes = [ctypes.POINTER(_DetachOptions), ctypes.c_size_t]
            c.remora_detach_options_init_sized.restype = status_t
            c.remora_detach_with.argtypes = [pid_t, ctypes.POINTER(_DetachOptions)]
            c.remora_detach_with.restype = status_t
        # Since API 0.3 (symbol version REMORA_2): the refusals about the
        # process alone, made before the tools are looked for.
        self.can_check = hasattr(c, "remora_check_target")
        if self.can_check:
            c.remora_check_target.argtypes = [pid_t, ctypes.c_uint32]
            c.remora_check_target.restype = status_t
        c.remora_last_error.argtypes = []
        c.remora_last_error.restype = ctypes.c_char_p
        for fn in (c.remora_status_name, c.remora_status_string):
            fn.argtypes = [status_t]
            fn.restype = ctypes.c_char_p

    def error(self, code: int, pid: int | None, what: str) -> RemoraError:
        # remora_last_error() is per thread: read it on the thread that made
        # the failed call, right after it (ctypes calls run on this thread).
        # Remora's messages carry their context ("attach to process 42: ..."),
        # so `what` is only needed when there is none.
        message = _decode(self.cdll.remora_last_error()) or f"{what}: {_decode(self.cdll.remora_status_string(code))}"
        return RemoraError(code, _decode(self.cdll.remora_status_name(code)), message, api=self.api, pid=pid)

    def check(self, pid: int, children: bool, channel: str = "auto") -> None:
        """Raises the RemoraError remora_attach would raise for what the
        process is (gone, a zombie, a kernel thread, traced by another,
        statically linked, this process), before anything is prepared.
        With a libremora.so older than 0.3 the attach says it instead. A
        ptrace refusal is left to the attach unless the channel is ptrace:
        the socket may serve where ptrace is refused."""
        if not self.can_check:
            return
        st = self.cdll.remora_check_target(pid, CHECK_TREE if children else 0)
        if st == Status.PTRACE_DENIED and channel != "ptrace":
            return
        if st != Status.SUCCESS:
            raise self.error(st, pid, f"attach {pid}")

    def attach(
        self,
        pid: int,
        tools: str,
        env: list[str],
        children: bool,
        lease: bool,
        timeout_msec: int | None,
        agent_path: str | None,
        channel: str = "auto",
    ) -> None:
        opts = _Options()
        st = self.cdll.remora_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts))
        if st != Status.SUCCESS:
            raise self.error(st, pid, "remora_options_init")
        # Keep every buffer alive until the call returns: the library reads
        # them during the call only (remora.h, "Ownership").
        tools_b = _encode(tools)
        env_arr = (ctypes.c_char_p * max(1, len(env)))(*[_encode(e) for e in env])
        agent_b = _encode(agent_path) if agent_path else None
        opts.tools = tools_b
        opts.env = ctypes.cast(env_arr, ctypes.POINTER(ctypes.c_char_p)) if env else None
        opts.env_count = len(env)
        opts.attach_children = False  # remora_attach_tree is called explicitly instead
        opts.lease = lease
        opts.channel = channel_code(channel)
        if timeout_msec is not None:
            opts.timeout_msec = timeout_msec
        opts.agent_path = agent_b
        fn = self.cdll.remora_attach_tree if children else self.cdll.remora_attach
        st = fn(pid, ctypes.byref(opts))
        if children:
            # A tree attach that failed on some processes leaves the others
            # attached: remember the root so that a detach reaches them.
            with self.lock:
                self.tree_roots.add(pid)
        if st != Status.SUCCESS:
            raise self.error(st, pid, f"attach {'tree ' if children else ''}{pid}")

    def detach(self, pid: int, children: bool | None, unload: bool = False) -> tuple[tuple[int, str], ...]:
        """Detaches (and with `unload` unloads); returns the (pid, tool) pairs
        an unload left loaded."""
        with self.lock:
            if children is None:
                children = pid in self.tree_roots
            if children:
                self.tree_roots.discard(pid)
        if unload:
            return self._detach_unload(pid, bool(children))
        if pid == 0:
            st = self.cdll.remora_detach(0)
            with self.lock:
                self.tree_roots.clear()
        elif children:
            st = self.cdll.remora_detach_tree(pid)
        else:
            st = self.cdll.remora_detach(pid)
        if st != Status.SUCCESS:
            raise self.error(st, pid, f"detach {'tree ' if children else ''}{pid}" if pid else "detach all")
        return ()

    def _detach_unload(self, pid: int, children: bool) -> tuple[tuple[int, str], ...]:
        if not self.can_unload:
            raise unload_unsupported(self.path)
        opts = _DetachOptions()
        st = self.cdll.remora_detach_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts))
        if st != Status.SUCCESS:
            raise self.error(st, pid, "remora_detach_options_init")
        opts.flags = DETACH_UNLOAD
        opts.children = children and pid != 0
        st = self.cdll.remora_detach_with(pid, ctypes.byref(opts))
        if pid == 0:
            with self.lock:
                self.tree_roots.clear()
        if st != Status.SUCCESS:
            raise self.error(st, pid, f"detach and unload {'tree ' if children else ''}{pid}" if pid else "unload all")
        kept = []
        for line in _decode(opts.kept_tools).splitlines():
            p, _, tool = line.partition(" ")
            kept.append((int(p), tool))
        return tuple(kept)

    def status(self, pid: int) -> _AgentState:
        state = _AgentState()
        state.size = ctypes.sizeof(state)
        st = self.cdll.remora_status(pid, ctypes.byref(state))
        if st != Status.SUCCESS:
            raise self.error(st, pid, f"status {pid}")
        return state


class RocattachBackend(Backend):
    """librocprofiler-sdk-rocattach.so (rocattach.h). It takes the tool list
    from the caller's ROCPROF_ATTACH_TOOL_LIBRARY and forwards the caller's
    ROCP* and REMORA_* variables, so both are set in os.environ for the call.
    It prints its own messages to stderr and has no lease and no status; when
    it is Remora's, libremora.so is its dependency and status() uses that."""

    api = "rocattach"

    # os.environ is process-wide: one rocattach attach at a time.
    env_lock = threading.Lock()

    def __init__(self, cdll: ctypes.CDLL, path: str):
        super().__init__(cdll, path)
        c = cdll
        for fn in (c.rocattach_attach, c.rocattach_attach_tree, c.rocattach_detach, c.rocattach_detach_tree):
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_int
        for fn in (c.rocattach_get_status_name, c.rocattach_get_status_string):
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_char_p
        # dlsym through a library's handle also searches its dependencies:
        # Remora's rocattach links libremora.so, ROCm's does not.
        self.remora: RemoraBackend | None = None
        if hasattr(c, "remora_status") and hasattr(c, "remora_last_error"):
            try:
                self.remora = RemoraBackend(c, path)
            except AttributeError:
                self.remora = None

    def error(self, code: int, pid: int | None, what: str) -> RemoraError:
        name = _decode(self.cdll.rocattach_get_status_name(code)) or "ROCATTACH_STATUS_UNKNOWN"
        text = _decode(self.cdll.rocattach_get_status_string(code)) or "unknown status"
        return RemoraError(
            code,
            name,
            f"{what}: {text} (the rocattach library printed the details on stderr)",
            api=self.api,
            pid=pid,
        )

    def check(self, pid: int, children: bool, channel: str = "auto") -> None:
        """Nothing here: rocattach.h has no such call, and its errors are
        rocattach's; Remora's rocattach_attach refuses the process first
        itself."""
        del pid, children, channel

    def attach(self, pid, tools, env, children, lease, timeout_msec, agent_path, channel="auto") -> None:
        del lease, timeout_msec  # rocattach has neither
        if channel == "ptrace":
            raise invalid_argument(
                "channel 'ptrace': a rocattach library chooses its channel itself (auto); use libremora.so"
            )
        extra = {}
        for e in env:
            name, _, value = e.partition("=")
            if not (name.startswith("ROCP") or name.startswith("REMORA_")):
                raise ValueError(
                    f"env variable {name!r}: a rocattach library forwards only ROCP* and REMORA_* variables; "
                    "use libremora.so (the default) to set others"
                )
            extra[name] = value
        extra["ROCPROF_ATTACH_TOOL_LIBRARY"] = tools
        if agent_path:
            extra["REMORA_AGENT_PATH"] = agent_path
        with self.env_lock:
            saved = {k: os.environ.get(k) for k in extra}
            try:
                os.environ.update(extra)
                fn = self.cdll.rocattach_attach_tree if children else self.cdll.rocattach_attach
                st = fn(pid)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        if children:
            with self.lock:
                self.tree_roots.add(pid)
        if st != RocattachStatus.SUCCESS:
            raise self.error(st, pid, f"attach {'tree ' if children else ''}{pid}")

    can_unload = False  # rocattach.h has no unload

    def detach(self, pid: int, children: bool | None, unload: bool = False) -> tuple[tuple[int, str], ...]:
        if unload:
            raise unload_unsupported(self.path)
        with self.lock:
            if children is None:
                children = pid in self.tree_roots
            if children:
                self.tree_roots.discard(pid)
        # rocattach_detach_tree knows only the trees it attached itself.
        st = self.cdll.rocattach_detach_tree(pid) if children and pid else self.cdll.rocattach_detach(pid)
        if st != RocattachStatus.SUCCESS:
            raise self.error(st, pid, f"detach {'tree ' if children else ''}{pid}" if pid else "detach all")
        return ()

    def status(self, pid: int) -> _AgentState:
        if self.remora is None:
            raise RemoraError(
                Status.NOT_SUPPORTED,
                "REMORA_STATUS_NOT_SUPPORTED",
                f"status {pid}: {self.path} has no remora_status (it is not Remora's rocattach); use libremora.so",
                pid=pid,
            )
        return self.remora.status(pid)


_loaded: dict[str, Backend] = {}
_load_lock = threading.Lock()


def load(attach_library: str | os.PathLike | None = None) -> Backend:
    """The backend for `attach_library` (see find_library), loaded once."""
    path = find_library(attach_library)
    with _load_lock:
        backend = _loaded.get(path)
        if backend is not None:
            return backend
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            hint = (
                "build it (cmake --build build --target remora_capi), set REMORA_LIBRARY to its path, "
                "or install it where the dynamic loader finds it"
                if path == REMORA_SONAME
                else "is it a shared library for this architecture?"
            )
            raise invalid_argument(f"cannot load {path}: {e}; {hint}") from None
        # A rocattach library exports rocattach_*, and (Remora's) reaches
        # remora_* through its dependency, so test for rocattach first.
        if hasattr(cdll, "rocattach_attach"):
            backend = RocattachBackend(cdll, path)
        elif hasattr(cdll, "remora_attach"):
            backend = RemoraBackend(cdll, path)
        else:
            raise invalid_argument(
                f"{path} exports neither remora_attach nor rocattach_attach: give the path of libremora.so "
                "or of librocprofiler-sdk-rocattach.so",
            )
        _loaded[path] = backend
        return backend
