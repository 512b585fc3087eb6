"""Rendering a default-tool session from its raw records, through Remora's
renderer plugin (libremora-render.so, next to libremora.so; its C entry is
src/profile/render_plugin.h): what `remora report DIR` does.

The default tool only collects, in the target; the controller renders. The
remora command does it after each session; rocprof-attach does it here."""

from __future__ import annotations

import ctypes
import os
import time

RENDER_FILE = "libremora-render.so"
DEFAULT_TOOL_FILE = "libremora-tool.so"


class _Request(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("pid", ctypes.c_int32), ("dir", ctypes.c_char_p)]


def render_library(library_path: str) -> str:
    """libremora-render.so next to the library in use (or $REMORA_RENDER_PATH)."""
    return os.environ.get("REMORA_RENDER_PATH") or os.path.join(os.path.dirname(library_path), RENDER_FILE)


def render(directory: str, library_path: str, pid: int = 0) -> None:
    """Renders `directory` (it holds profile.remora) into its output files.
    Raises OSError with the renderer's message when it cannot."""
    lib = ctypes.CDLL(render_library(library_path))
    fn = lib.remora_render_session_v1
    fn.argtypes = [ctypes.POINTER(_Request), ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    req = _Request(ctypes.sizeof(_Request), pid, os.fsencode(directory))
    err = ctypes.create_string_buffer(4096)
    rc = fn(ctypes.byref(req), err, len(err))
    if rc != 0:
        raise OSError(f"cannot render {directory}: {err.value.decode(errors='replace')}")


def output_root(pid: int, environ) -> str:
    """Where the default tool in process `pid` writes: REMORA_OUTPUT_PATH,
    resolved as the target resolves it (against its working directory), or
    its default ./remora-output there."""
    value = environ.get("REMORA_OUTPUT_PATH") or "./remora-output"
    if os.path.isabs(value):
        return value
    return os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)


def finished_sessions(root: str, since: float) -> list[str]:
    """The session directories under `root` finished since `since` (a
    time.time()): those holding profile.remora."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in sorted(names):
        raw = os.path.join(root, name, "profile.remora")
        try:
            if not os.path.islink(os.path.join(root, name)) and os.stat(raw).st_mtime >= since - 1:
                out.append(os.path.join(root, name))
        except OSError:
            continue
    return out


def now() -> float:
    return time.time()
