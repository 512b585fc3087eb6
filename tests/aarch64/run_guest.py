#!/usr/bin/python3
"""Runs Remora's aarch64 suites inside qemu-system-aarch64 (issue 14).

qemu-user cannot ptrace, so the cross-built suites (build-aarch64, see
cmake/toolchain-aarch64.cmake) run under a real arm64 kernel: Debian's, booted
by qemu-system-aarch64 under TCG with an initramfs this script writes itself.
The initramfs holds guest_init.c as /init, the cross build tree's programs and
libraries at the same absolute paths as here (the suites embed them), the
dynamic loader and every library they need (DT_NEEDED, resolved recursively
from the arm64 multiarch and cross directories), busybox for the suites that
start a shell, and a minimal /etc.

  run_guest.py --build-dir build-aarch64 [--results DIR] [--deadline S]
      boot, run every suite of the manifest, write DIR/<suite>.json and
      DIR/<suite>.log, print a ctest-like summary; exit 0 when every suite
      passed, 1 when one failed, 2 when the guest did not finish, 77 when the
      rig cannot run here (the reason is printed). --fixture: exit 0 once the
      guest finished, whatever the suites did (ctest's aarch64.guest).
  run_guest.py --results DIR --show SUITE
      print SUITE's guest output; exit 0 iff it passed there (77: skipped,
      with the reason).

Only /usr/bin/python3's standard library; the kernel and busybox come from
Debian's arm64 packages (apt-get download, then dpkg-deb -x), cached in the
build tree.
"""

import argparse
import ctypes
import gzip
import json
import os
import re
import select
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
GUEST_FAILED = 2
MARKER = re.compile(r"@@REMORA-GUEST-(INIT|BEGIN|END|DONE)\s*([^@]*)@@")
# Where the arm64 libraries are here, in the order they are preferred: the
# :arm64 multiarch packages (libc6:arm64 brings a loader and libc of one
# build), then the cross toolchain's prefix.
HOST_LIB_DIRS = ["/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/aarch64-linux-gnu/lib"]
# Where they go in the guest: Debian's merged-/usr multiarch directory, which
# the arm64 loader searches by default (/lib is a link to usr/lib there).
GUEST_LIB_DIR = "/usr/lib/aarch64-linux-gnu"
# Loaded by name at run time, not through DT_NEEDED: libgcc_s by glibc for
# thread cancellation, the others by the agent's and tests' dlopen calls.
ALWAYS_LIBS = ["libgcc_s.so.1", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6"]
EM_AARCH64 = 183
QEMU = "qemu-system-aarch64"
# Time the init gets after qemu's start before its own deadline counts: the
# kernel's boot under TCG, and a margin for the report and power-off.
BOOT_ALLOWANCE_S = 90
CONSOLE_TAIL_LINES = 60


def log(msg):
    print(msg, flush=True)


# --- ELF --------------------------------------------------------------------


def elf_info(path):
    """PT_INTERP, DT_NEEDED and DT_RUNPATH/DT_RPATH of an aarch64 executable
    or shared object; None for anything else (objects, archives, scripts,
    x86_64 files)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            e_type, e_machine = struct.unpack_from("<HH", head, 16)
            if e_machine != EM_AARCH64 or e_type not in (2, 3):
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
            loads, dynamic, interp = [], None, None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", ph, i * phentsize)
                if p_type == 1:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == 2:
                    dynamic = (p_offset, p_filesz)
                elif p_type == 3:
                    f.seek(p_offset)
                    interp = f.read(p_filesz).split(b"\0", 1)[0].decode()
            info = {"interp": interp, "needed": [], "runpath": []}
            if dynamic is None:
                return info
            f.seek(dynamic[0])
            dyn = f.read(dynamic[1])
            entries = [struct.unpack_from("<qQ", dyn, o) for o in range(0, len(dyn) - 15, 16)]
            strtab = next((v for t, v in entries if t == 5), None)
            if strtab is None:
                return info
            base = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
            if base is None:
                return info

            def string_at(offset):
                f.seek(base + offset)
                return f.read(4096).split(b"\0", 1)[0].decode()

            for tag, value in entries:
                if tag == 0:
                    break
                if tag == 1:
                    info["needed"].append(string_at(value))
                elif tag in (15, 29):
                    info["runpath"].extend(p for p in string_at(value).split(":") if p)
            return info
    except (OSError, struct.error, UnicodeDecodeError):
        return None


# --- the newc cpio ----------------------------------------------------------


class Cpio:
    """A newc ("070701") archive, as the kernel's initramfs unpacker reads it.
    Parents are written before their entries; every entry is root's."""

    def __init__(self, out):
        self.out = out
        self.ino = 1
        self.entries = set()
        self.size = 0

    def _write(self, data):
        self.out.write(data)
        self.size += len(data)

    def _header(self, name, mode, size, rdev=(0, 0)):
        name_bytes = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, size, 0, 0, rdev[0], rdev[1], len(name_bytes), 0]
        self.ino += 1
        self._write(b"070701" + b"".join(b"%08X" % v for v in fields) + name_bytes)
        self._pad()

    def _pad(self):
        if self.size % 4:
            self._write(b"\0" * (4 - self.size % 4))

    def _parents(self, path):
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.dir("/" + "/".join(parts[:i]))

    def dir(self, path, mode=0o755):
        name = path.strip("/")
        if name in self.entries:
            return
        self._parents(path)
        self.entries.add(name)
        self._header(name, stat.S_IFDIR | mode, 0)

    def symlink(self, path, target):
        name = path.strip("/")
        if name in self.entries:
            return
        self._parents(path)
        self.entries.add(name)
        data = target.encode()
        self._header(name, stat.S_IFLNK | 0o777, len(data))
        self._write(data)
        self._pad()

    def node(self, path, mode, major, minor):
        name = path.strip("/")
        self._parents(path)
        self.entries.add(name)
        self._header(name, mode, 0, (major, minor))

    def data(self, path, data, mode=0o644):
        name = path.strip("/")
        if name in self.entries:
            return
        self._parents(path)
        self.entries.add(name)
        self._header(name, stat.S_IFREG | mode, len(data))
        self._write(data)
        self._pad()

    def file(self, path, source):
        name = path.strip("/")
        if name in self.entries:
            return
        self._parents(path)
        self.entries.add(name)
        st = os.stat(source)
        self._header(name, stat.S_IFREG | (stat.S_IMODE(st.st_mode) | 0o400), st.st_size)
        with open(source, "rb") as f:
            shutil.copyfileobj(f, self, 1 << 20)
        self._pad()

    def write(self, data):  # for shutil.copyfileobj
        self._write(data)

    def finish(self):
        self._header("TRAILER!!!", 0, 0)


# --- the manifest -------------------------------------------------------------


def read_manifest(path):
    """The guest build's manifest (tests/aarch64/CMakeLists.txt)."""
    m = {"builddir": None, "suites": [], "absent": []}
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "builddir":
                m["builddir"] = fields[1]
            elif fields[0] == "suite" and len(fields) >= 5:
                m["suites"].append({"name": fields[1], "timeout": int(fields[2]), "cwd": fields[3],
                                    "rest": fields[4:]})
            elif fields[0] == "absent":
                m["absent"].append({"name": fields[1], "reason": fields[2] if len(fields) > 2 else ""})
    return m


# --- kernel and busybox -------------------------------------------------------


def run_quiet(cmd, cwd=None, timeout=600):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def apt_dependency(meta):
    """The linux-image-*-arm64 package that `meta` depends on now, from apt's
    lists; None when apt cannot say (offline, lists without arm64)."""
    try:
        r = run_quiet(["apt-cache", "depends", meta], timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stdout.splitlines():
        m = re.match(r"\s*Depends:\s*(linux-image-\S+-arm64)", line)
        if m:
            return m.group(1).split(":")[0]
    return None


def extract_from_deb(package, member_prefix, cache, dest_name):
    """Downloads `package` (an :arm64 one) with apt-get download into the
    cache, unpacks it, keeps the first file under `member_prefix` as
    cache/dest_name and removes the rest. A .deb of that package already in
    $REMORA_GUEST_DEB_DIR is used instead of downloading."""
    work = tempfile.mkdtemp(prefix="fetch-", dir=cache)
    try:
        debs = []
        local = os.environ.get("REMORA_GUEST_DEB_DIR")
        if local and os.path.isdir(local):
            debs = [os.path.join(local, d) for d in sorted(os.listdir(local))
                    if d.startswith(package.split(":")[0] + "_") and d.endswith("_arm64.deb")]
        if not debs:
            log(f"fetching {package} (apt-get download)")
            r = run_quiet(["apt-get", "download", package if ":" in package else package + ":arm64"], cwd=work)
            debs = [os.path.join(work, d) for d in os.listdir(work) if d.endswith(".deb")]
            if r.returncode != 0 or not debs:
                raise RuntimeError(f"apt-get download {package} failed:\n{r.stdout.strip()}\n"
                                   "apt must know arm64: `make deps` runs dpkg --add-architecture arm64 "
                                   "and apt-get update")
        tree = os.path.join(work, "x")
        r = run_quiet(["dpkg-deb", "-x", debs[0], tree])
        if r.returncode != 0:
            raise RuntimeError(f"dpkg-deb -x {debs[0]} failed:\n{r.stdout}")
        base = os.path.join(tree, member_prefix.rsplit("/", 1)[0])
        stem = member_prefix.rsplit("/", 1)[1]
        found = sorted(n for n in os.listdir(base) if n.startswith(stem)) if os.path.isdir(base) else []
        if not found:
            raise RuntimeError(f"{debs[0]} holds no {member_prefix}*")
        dest = os.path.join(cache, dest_name)
        shutil.copyfile(os.path.join(base, found[0]), dest + ".part")
        os.chmod(dest + ".part", 0o755)
        os.replace(dest + ".part", dest)
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def find_kernel(cache):
    """cache/vmlinuz-<version> for the version linux-image-arm64 depends on
    now, fetched when missing; the newest cached one when apt cannot say."""
    if os.environ.get("REMORA_GUEST_KERNEL"):
        return os.environ["REMORA_GUEST_KERNEL"]
    package = apt_dependency("linux-image-arm64:arm64")
    cached = sorted(n for n in os.listdir(cache) if n.startswith("vmlinuz-"))
    if package is None:
        if cached:
            log(f"apt cannot resolve linux-image-arm64:arm64; using the cached {cached[-1]}")
            return os.path.join(cache, cached[-1])
        # The meta package itself says which image it wants.
        work = tempfile.mkdtemp(prefix="meta-", dir=cache)
        try:
            run_quiet(["apt-get", "download", "linux-image-arm64:arm64"], cwd=work)
            debs = [d for d in os.listdir(work) if d.endswith(".deb")]
            if debs:
                r = run_quiet(["dpkg-deb", "-f", os.path.join(work, debs[0]), "Depends"])
                m = re.search(r"(linux-image-\S+-arm64)", r.stdout)
                package = m.group(1) if m else None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if package is None:
            raise RuntimeError("cannot tell which arm64 kernel to boot: apt-cache depends linux-image-arm64:arm64 "
                               "answered nothing (run `make deps`: it adds the arm64 architecture to apt), "
                               "or set REMORA_GUEST_KERNEL=/path/to/vmlinuz")
    version = package[len("linux-image-"):]
    name = f"vmlinuz-{version}"
    if name in cached:
        return os.path.join(cache, name)
    return extract_from_deb(package + ":arm64", "boot/vmlinuz-", cache, name)


def find_busybox(cache):
    path = os.path.join(cache, "busybox")
    if os.path.exists(path):
        return path
    return extract_from_deb("busybox-static:arm64", "bin/busybox", cache, "busybox")


# --- the initramfs ------------------------------------------------------------


def resolve_library(name, origin, runpaths):
    candidates = []
    for rp in runpaths:
        candidates.append(rp.replace("$ORIGIN", origin).replace("${ORIGIN}", origin))
    candidates.extend(HOST_LIB_DIRS)
    for d in candidates:
        p = os.path.join(d, name)
        if os.path.isfile(p) and elf_info(p) is not None:
            return p
    return None


def collect(builddir, manifest):
    """{guest path: host path} of everything the suites load, the build
    tree's links to them ({path: link text}: libremora.so -> .so.0 ...), and
    the libraries that could not be found (named in the report)."""
    files, links = {}, {}
    for root, dirs, names in os.walk(builddir):
        # Object files, the runner's own cache and outputs: not the suites'.
        dirs[:] = [d for d in dirs if d not in ("CMakeFiles", "guest", "Testing")]
        for n in names:
            p = os.path.join(root, n)
            if n.endswith((".o", ".a")) or not os.path.isfile(p):
                continue
            if os.path.islink(p):
                if os.path.realpath(p).startswith(builddir + "/") and elf_info(p) is not None:
                    links[p] = os.readlink(p)
            elif elf_info(p) is not None:
                files[p] = p
    for suite in manifest["suites"]:
        argv0 = next((x for x in suite["rest"] if x.startswith("/")), None)
        # A suite that failed to build is reported by the guest (exec fails).
        if argv0 and os.path.isfile(argv0):
            files[argv0] = argv0
    missing = set()
    pending = list(files.values())
    for name in ALWAYS_LIBS:
        p = resolve_library(name, "/", [])
        if p:
            files[os.path.join(GUEST_LIB_DIR, name)] = p
            pending.append(p)
    seen = set()
    while pending:
        host = pending.pop()
        if host in seen:
            continue
        seen.add(host)
        info = elf_info(host)
        if info is None:
            continue
        if info["interp"]:
            loader = resolve_library(os.path.basename(info["interp"]), "/", [])
            if loader is None:
                missing.add(info["interp"])
            else:
                files[os.path.join(GUEST_LIB_DIR, os.path.basename(loader))] = loader
        for needed in info["needed"]:
            p = resolve_library(needed, os.path.dirname(host), info["runpath"])
            if p is None:
                missing.add(needed)
                continue
            if p in links:
                pending.append(os.path.realpath(p))
                continue
            guest = p if p.startswith(builddir + "/") else os.path.join(GUEST_LIB_DIR, needed)
            files.setdefault(guest, p)
            pending.append(p)
    return files, links, sorted(missing)


ETC_FILES = {
    "/etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "/etc/group": "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
    "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "/etc/hostname": "remora-guest\n",
}


def host_calibration(cache):
    """The calibration's time on this host, in ns (guest_init.c's
    calibrate(), built natively: `--calibrate` runs it five times and prints
    the fastest); None, with the reason printed, when it cannot be built or
    run. The guest divides its own time by it: the factor that stretches the
    tests' limits there (REMORA_TEST_TIME_SCALE)."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guest_init.c")
    exe = os.path.join(cache, "host-calibrate")
    try:
        if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(source):
            r = run_quiet(["cc", "-O2", "-o", exe + ".part", source], timeout=120)
            if r.returncode != 0:
                log(f"warning: cannot build the host calibration ({source}): {r.stdout.strip()}")
                return None
            os.replace(exe + ".part", exe)
        r = run_quiet([exe, "--calibrate"], timeout=120)
        ns = int(r.stdout.strip()) if r.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        log(f"warning: the host calibration failed: {e}")
        return None
    if ns <= 0:
        log(f"warning: the host calibration failed: {r.stdout.strip()}")
        return None
    return ns


def guest_manifest(manifest, deadline, reference_ns=None):
    lines = [f"deadline\t{deadline}"]
    if reference_ns:
        lines.append(f"reference\t{reference_ns}")
    for s in manifest["suites"]:
        lines.append("\t".join(["suite", s["name"], str(s["timeout"]), s["cwd"]] + s["rest"]))
    return ("\n".join(lines) + "\n").encode()


def build_initramfs(path, builddir, manifest, init, busybox, deadline, compress, reference_ns=None):
    files, links, missing = collect(builddir, manifest)
    raw = gzip.open(path, "wb", compresslevel=1) if compress else open(path, "wb")
    with raw as out:
        c = Cpio(out)
        for d in ("/usr/bin", "/usr/sbin", "/usr/lib/aarch64-linux-gnu", "/proc", "/sys", "/dev", "/run", "/root",
                  "/guest"):
            c.dir(d)
        c.dir("/tmp", 0o1777)
        c.dir("/var/tmp", 0o1777)
        # Merged /usr, as Debian 12 has it: /lib/ld-linux-aarch64.so.1 (the
        # PT_INTERP) and /bin/sh resolve through these.
        c.symlink("/lib", "usr/lib")
        c.symlink("/bin", "usr/bin")
        c.symlink("/sbin", "usr/sbin")
        c.symlink("/usr/lib/ld-linux-aarch64.so.1", "aarch64-linux-gnu/ld-linux-aarch64.so.1")
        c.node("/dev/console", stat.S_IFCHR | 0o600, 5, 1)
        c.node("/dev/null", stat.S_IFCHR | 0o666, 1, 3)
        c.file("/init", init)
        c.data("/guest/manifest", guest_manifest(manifest, deadline, reference_ns))
        for p, text in ETC_FILES.items():
            c.data(p, text.encode())
        if busybox:
            c.file("/usr/bin/busybox", busybox)
            c.symlink("/usr/bin/sh", "busybox")
        for s in manifest["suites"]:
            c.dir(s["cwd"])
        for guest in sorted(files):
            c.file(guest, files[guest])
        for path in sorted(links):
            c.symlink(path, links[path])
        c.finish()
        size = c.size
    return size, len(files) + len(links), missing


# --- the guest ----------------------------------------------------------------


# No network device: the guest needs none, and the virt machine's default
# virtio NIC wants its option ROM (efi-virtio.rom, Debian's ipxe-qemu), a
# package qemu-system-arm only recommends.
def qemu_command(kernel, initrd):
    return [QEMU, "-M", "virt", "-cpu", "max,pauth-impdef=on,sve=on,sme=on", "-smp", "2", "-m", "1024",
            "-nographic", "-no-reboot", "-nic", "none", "-kernel", kernel, "-initrd", initrd,
            "-append", "console=ttyAMA0 panic=-1 quiet loglevel=3 rdinit=/init"]


def boot(cmd, deadline_s, console_path):
    """Runs qemu until it exits or `deadline_s` passes; the console goes to
    console_path and is parsed as it comes. Returns (finished, lines,
    boot_s): finished is False when qemu had to be killed."""
    start = time.monotonic()
    lines = []
    boot_s = None
    partial = b""
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
        try:
            while True:
                left = start + deadline_s - time.monotonic()
                if left <= 0:
                    break
                ready, _, _ = select.select([proc.stdout], [], [], min(left, 5.0))
                if not ready:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                console.write(chunk)
                console.flush()
                partial += chunk
                *complete, partial = partial.split(b"\n")
                for raw in complete:
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    lines.append(line)
                    m = MARKER.search(line)
                    if not m:
                        continue
                    if m.group(1) == "INIT":
                        boot_s = time.monotonic() - start
                        log(f"guest: /init started {boot_s:.1f} s after qemu ({m.group(2)})")
                    elif m.group(1) == "BEGIN":
                        log(f"guest: {m.group(2)} ...")
                    elif m.group(1) == "END":
                        log(f"guest:   {m.group(2)}")
        finally:
            # At EOF qemu is exiting (power-off): give it a moment; at the
            # deadline (or on any error here) it is killed at once.
            eof = time.monotonic() < start + deadline_s
            finished = proc.poll() is not None or (eof and _wait(proc, 10))
            if not finished:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if partial:
        lines.append(partial.decode("utf-8", "replace").rstrip("\r"))
    return finished, lines, boot_s


def _die_with_parent():
    """qemu gets SIGKILL when this runner dies, however it dies (ctest's
    timeout kills the runner, not its children)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _wait(proc, seconds):
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def parse_console(lines):
    """{suite: {status, code, ms, output}} from the markers; a suite that
    began and never ended is "unfinished"; and whether DONE was seen."""
    results, current, done = {}, None, False
    for line in lines:
        m = MARKER.search(line)
        if not m:
            if current is not None:
                current["output"].append(line)
            continue
        kind, rest = m.group(1), m.group(2).split()
        if kind == "BEGIN":
            current = {"status": "unfinished", "code": 0, "ms": 0, "output": []}
            results[rest[0]] = current
        elif kind == "END":
            fields = dict(x.split("=", 1) for x in rest[1:] if "=" in x)
            entry = results.setdefault(rest[0], {"output": []})
            entry.update(status=fields.get("status", "error"), code=int(fields.get("code", "0")),
                         ms=int(fields.get("ms", "0")))
            current = None
        elif kind == "DONE":
            done = True
    return results, done


def verdict(entry):
    if entry["status"] == "exit" and entry["code"] == 0:
        return "pass", ""
    return "fail", {
        "exit": f"exited with status {entry['code']}",
        "signal": f"killed by signal {entry['code']}",
        "timeout": "passed its guest deadline: the init killed its process group",
        "notrun": "not run: the guest's global deadline came first",
        "unfinished": "did not finish: the guest stopped while it ran (see the console tail)",
    }.get(entry["status"], f"guest init error ({entry['status']}, code {entry['code']})")


def write_json(path, obj):
    with open(path + ".part", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".part", path)


def skip_run(results, reason):
    write_json(os.path.join(results, "guest.json"), {"state": "skipped", "reason": reason})
    log(f"SKIPPED: {reason}")
    return SKIP


def run(args):
    results = os.path.abspath(args.results or os.path.join(args.build_dir, "guest", "results"))
    # No result of an earlier run may pass for this one's.
    os.makedirs(results, exist_ok=True)
    for name in os.listdir(results):
        if name.endswith((".json", ".log", ".part")):
            os.remove(os.path.join(results, name))
    builddir = os.path.abspath(args.build_dir)
    manifest_path = os.path.join(builddir, "guest", "manifest.txt")
    init = os.path.join(builddir, "guest", "remora_guest_init")
    if shutil.which(QEMU) is None:
        return skip_run(results, f"{QEMU} not found (Debian: apt-get install qemu-system-arm; `make deps`)")
    if not os.path.exists(manifest_path) or not os.path.exists(init):
        return skip_run(results, f"no aarch64 build in {builddir} (its guest/manifest.txt or "
                        "guest/remora_guest_init is missing): `make test-aarch64` cross-builds it, or "
                        "cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake && "
                        "cmake --build build-aarch64 (needs g++-aarch64-linux-gnu; `make deps`)")
    manifest = read_manifest(manifest_path)
    if args.add_suite:
        for spec in args.add_suite:
            name, timeout, *argv = shlex.split(spec)
            manifest["suites"].append({"name": name, "timeout": int(timeout), "cwd": "/", "rest": argv})
    if args.only:
        manifest["suites"] = [s for s in manifest["suites"] if s["name"] in args.only]
        manifest["absent"] = [a for a in manifest["absent"] if a["name"] in args.only]
    cache = os.path.join(builddir, "guest", "cache")
    os.makedirs(cache, exist_ok=True)
    try:
        kernel = find_kernel(cache)
        busybox = find_busybox(cache)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log(f"FAILED: cannot get the guest's kernel or busybox: {e}")
        write_json(os.path.join(results, "guest.json"), {"state": "failed", "reason": str(e)})
        return GUEST_FAILED

    guest_deadline = args.guest_deadline or max(30, args.deadline - BOOT_ALLOWANCE_S)
    initrd = os.path.join(builddir, "guest", "initramfs.cpio" + (".gz" if args.gzip else ""))
    reference_ns = host_calibration(cache)
    if reference_ns:
        log(f"host calibration: {reference_ns / 1e6:.1f} ms (the guest scales the tests' limits by its own "
            "time over this)")
    t0 = time.monotonic()
    size, count, missing = build_initramfs(initrd, builddir, manifest, init, busybox, guest_deadline, args.gzip,
                                           reference_ns)
    pack_s = time.monotonic() - t0
    log(f"initramfs: {initrd}: {size / 1e6:.1f} MB before compression, "
        f"{os.path.getsize(initrd) / 1e6:.1f} MB on disk, {count} files, written in {pack_s:.1f} s")
    if missing:
        log(f"warning: not found for the guest (they will fail to load there): {' '.join(missing)}")

    cmd = qemu_command(kernel, initrd)
    log("boot: " + " ".join(cmd))
    console_path = os.path.join(results, "console.log")
    t0 = time.monotonic()
    finished, lines, boot_s = boot(cmd, args.deadline, console_path)
    wall_s = time.monotonic() - t0
    parsed, done = parse_console(lines)
    return report(args, results, manifest, parsed, done, finished, lines, boot_s, wall_s,
                  {"initramfs_bytes": size, "initramfs_file_bytes": os.path.getsize(initrd), "kernel": kernel})


def report(args, results, manifest, parsed, done, finished, lines, boot_s, wall_s, extra):
    rows, failed = [], 0
    for s in manifest["suites"]:
        entry = parsed.get(s["name"], {"status": "unfinished" if not done else "error", "code": 0, "ms": 0,
                                       "output": ["(no output: the guest never started this suite)"]})
        v, reason = verdict(entry)
        failed += v != "pass"
        with open(os.path.join(results, s["name"] + ".log"), "w") as f:
            f.write("\n".join(entry["output"]) + "\n")
        write_json(os.path.join(results, s["name"] + ".json"),
                   {"verdict": v, "reason": reason, "status": entry["status"], "code": entry["code"],
                    "ms": entry["ms"]})
        rows.append((s["name"], v, reason, entry["ms"]))
    for a in manifest["absent"]:
        write_json(os.path.join(results, a["name"] + ".json"), {"verdict": "skip", "reason": a["reason"]})
    ok = finished and done
    write_json(os.path.join(results, "guest.json"),
               dict(extra, state="ran" if ok else "failed", boot_s=boot_s, wall_s=wall_s,
                    reason="" if ok else "the guest did not finish"))

    log("")
    width = max([len(r[0]) for r in rows] + [10]) + 12
    for i, (name, v, reason, ms) in enumerate(rows, 1):
        label = f"aarch64.{name} "
        log(f"{i:3}/{len(rows)} {label.ljust(width, '.')} {'  Passed' if v == 'pass' else '***Failed'}"
            f"  {ms / 1000:7.2f} sec" + ("" if v == "pass" else f"  ({reason})"))
    for a in manifest["absent"]:
        log(f"    skipped aarch64.{a['name']}: {a['reason']}")
    log("")
    passed = len(rows) - failed
    pct = 100 * passed // len(rows) if rows else 100
    log(f"{pct}% tests passed, {failed} tests failed out of {len(rows)} in the aarch64 guest "
        f"({len(manifest['absent'])} not built for aarch64)")
    log(f"guest: qemu ran {wall_s:.1f} s" + (f", /init started after {boot_s:.1f} s" if boot_s else ""))
    if not ok:
        why = (f"qemu ran past the deadline of {args.deadline} s and was killed" if not finished
               else "qemu exited before the init reported DONE (a kernel panic, or the init died)")
        log(f"FAILED: {why}. The console's last {CONSOLE_TAIL_LINES} lines "
            f"({os.path.join(results, 'console.log')}):")
        for line in lines[-CONSOLE_TAIL_LINES:]:
            log("  | " + line)
        return GUEST_FAILED
    if failed and not args.fixture:
        return 1
    return 0


def show(args):
    """One ctest entry aarch64.<suite>: the suite's guest output and verdict."""
    results = os.path.abspath(args.results)
    try:
        with open(os.path.join(results, "guest.json")) as f:
            guest = json.load(f)
    except (OSError, ValueError):
        log(f"SKIPPED: no guest run in {results} (aarch64.guest, the fixture, writes it; run it first)")
        return SKIP
    if guest.get("state") == "skipped":
        log(f"SKIPPED: the aarch64 guest did not run: {guest.get('reason')}")
        return SKIP
    try:
        with open(os.path.join(results, args.show + ".json")) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        log(f"FAILED: the aarch64 guest has no result for {args.show}: it is in tests/aarch64/suites.cmake but "
            "not in build-aarch64's manifest; re-run cmake in build-aarch64 (make test-aarch64 does)")
        return 1
    if entry["verdict"] == "skip":
        log(f"SKIPPED: {args.show}: {entry['reason']}")
        return SKIP
    log(f"--- {args.show}: its output in the aarch64 guest ---")
    try:
        with open(os.path.join(results, args.show + ".log")) as f:
            sys.stdout.write(f.read())
    except OSError:
        pass
    log(f"--- {args.show}: {entry['status']} {entry['code']}, {entry['ms'] / 1000:.2f} s in the guest ---")
    if entry["verdict"] == "pass":
        return 0
    log(f"FAILED in the guest: {entry['reason']}")
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", help="the aarch64 cross build (build-aarch64)")
    ap.add_argument("--results", help="where the per-suite results go (default BUILD_DIR/guest/results)")
    ap.add_argument("--deadline", type=int, default=1800, help="seconds qemu may run in all (default 1800)")
    ap.add_argument("--guest-deadline", type=int, default=0,
                    help="the init's own global deadline (default: --deadline less the boot's allowance)")
    ap.add_argument("--fixture", action="store_true", help="exit 0 once the guest finished (ctest fixture)")
    ap.add_argument("--gzip", action="store_true", help="gzip the initramfs (smaller, slower to boot)")
    ap.add_argument("--add-suite", action="append", metavar="'NAME TIMEOUT ARGV0 [ARG]...'",
                    help="an extra guest suite, by hand (a deliberately hanging one, say)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only this suite (repeatable; with --add-suite, the added ones)")
    ap.add_argument("--show", metavar="SUITE", help="print SUITE's guest result (needs --results)")
    args = ap.parse_args()
    if args.show:
        if not args.results:
            ap.error("--show needs --results")
        return show(args)
    if not args.build_dir:
        ap.error("--build-dir is required")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
