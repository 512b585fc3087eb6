#!/usr/bin/env bash
# The install test (tests/install/CMakeLists.txt). What a user does after
# `cmake --install`, checked end to end against a temporary prefix:
#
#   1. cmake --install BUILD --prefix TMP/prefix; the expected files are there
#      (programs, libraries with their SONAME links, headers, package files,
#      Python package, docs).
#   2. examples/tool builds against it with find_package (CMAKE_PREFIX_PATH)
#      and, from a copy, with its Makefile (PKG_CONFIG_PATH + pkg-config).
#   3. A C API program builds against it with pkg-config --cflags --libs and
#      with find_package(remora 0.1) + remora::remora.
#   4. The example tool is attached to a running process (tests/install/
#      thread_spawner.c, which starts a short-lived thread every 100 ms):
#      with the installed `remora attach` (when the CLI has it), with both C
#      API programs, and with the installed Python package (Python 3.11+).
#      Each attach must leave a complete report naming the process, its
#      session number, samples, a resident size and created threads; the
#      installed agent must be the one mapped; the target must exit cleanly.
#
# Everything lives in one temporary directory, removed at the end (kept with
# KEEP=1); the target is killed on any exit.
set -euo pipefail

usage() { echo "usage: $0 --build DIR --source DIR --libdir DIR --cmake CMAKE --spawner PATH" >&2; exit 2; }
BUILD= SOURCE= LIBDIR= CMAKE=cmake SPAWNER=
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2 ;; --source) SOURCE=$2 ;; --libdir) LIBDIR=$2 ;;
    --cmake) CMAKE=$2 ;; --spawner) SPAWNER=$2 ;; *) usage ;;
  esac
  shift 2
done
[[ -n $BUILD && -n $SOURCE && -n $LIBDIR && -n $SPAWNER ]] || usage

TMP=$(mktemp -d "${TMPDIR:-/tmp}/remora-install-test.XXXXXX")
TMP=$(realpath "$TMP")
PREFIX=$TMP/prefix
TARGETS=()
cleanup() {
  local p
  for p in "${TARGETS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  if [[ ${KEEP:-0} == 1 ]]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# run LOG CMD...: runs CMD with its output in LOG, shown only on failure.
run() {
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$* (log above)"
  fi
}

# No agent or library from the environment: the installed tree must find its own.
unset REMORA_AGENT_PATH REMORA_LIBRARY REMORA_TOOL_PATH LD_LIBRARY_PATH PKG_CONFIG_PATH

step "cmake --install $BUILD --prefix $PREFIX"
run "$TMP/install.log" "$CMAKE" --install "$BUILD" --prefix "$PREFIX"
LIB=$PREFIX/$LIBDIR
for f in bin/remora "$LIBDIR/libremora-agent.so" "$LIBDIR/libremora-tool.so" \
         "$LIBDIR/libremora.so" "$LIBDIR/libremora.so.0" \
         "$LIBDIR/librocprofiler-sdk-rocattach.so" "$LIBDIR/librocprofiler-sdk-rocattach.so.1" \
         include/remora/tool.h include/remora/remora.h include/remora/compat/tnfctl.h \
         include/rocattach.h include/rocprofiler-sdk-rocattach/rocattach.h \
         "$LIBDIR/cmake/remora/remoraConfig.cmake" "$LIBDIR/cmake/remora/remoraConfigVersion.cmake" \
         "$LIBDIR/pkgconfig/remora.pc" share/doc/remora/tool.md share/doc/remora/writing-a-tool.md \
         share/doc/remora/examples/tool/rss_sampler.c; do
  [[ -e $PREFIX/$f ]] || fail "not installed: $PREFIX/$f"
done
[[ -L $LIB/libremora.so && -L $LIB/libremora.so.0 ]] || fail "libremora.so and .so.0 must be symbolic links"
soname=$(objdump -p "$LIB/libremora.so" | awk '$1 == "SONAME" { print $2 }')
[[ $soname == libremora.so.0 ]] || fail "libremora.so has SONAME '$soname', want libremora.so.0"
PYINIT=$(find "$PREFIX" -path '*/remora/__init__.py' | head -n1)
[[ -n $PYINIT ]] || fail "the Python package (remora/__init__.py) is not installed"
PYDIR=$(dirname "$(dirname "$PYINIT")")
echo "installed; libdir $LIB, Python package in $PYDIR"

step "example tool with find_package (CMAKE_PREFIX_PATH=$PREFIX)"
run "$TMP/cmake-configure.log" "$CMAKE" -S "$SOURCE/examples/tool" -B "$TMP/tool-cmake" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
found=$(sed -n 's/^remora_DIR:PATH=//p' "$TMP/tool-cmake/CMakeCache.txt")
[[ $found == "$LIB/cmake/remora" ]] || fail "find_package(remora) found '$found', want $LIB/cmake/remora"
run "$TMP/cmake-build.log" "$CMAKE" --build "$TMP/tool-cmake"
TOOL_CMAKE=$TMP/tool-cmake/librss-sampler.so
[[ -f $TOOL_CMAKE ]] || fail "no $TOOL_CMAKE"
echo "built $TOOL_CMAKE"

step "example tool with its Makefile (PKG_CONFIG_PATH=$LIB/pkgconfig)"
cp -r "$SOURCE/examples/tool" "$TMP/tool-make"
rm -rf "$TMP/tool-make/build"*
export PKG_CONFIG_PATH=$LIB/pkgconfig
read -r cflags < <(pkg-config --cflags remora)
[[ $cflags == -I* && $(realpath "${cflags#-I}") == "$PREFIX/include" ]] ||
  fail "pkg-config --cflags remora gives '$cflags', want -I$PREFIX/include"
run "$TMP/make.log" make -C "$TMP/tool-make"
TOOL_MAKE=$TMP/tool-make/librss-sampler.so
[[ -f $TOOL_MAKE ]] || fail "no $TOOL_MAKE"
exported=$(nm -D --defined-only "$TOOL_MAKE" | awk '{ print $3 }' | sort | tr '\n' ' ')
[[ $exported == "remora_configure remora_configure_attach " ]] ||
  fail "the tool exports '$exported', want only remora_configure and remora_configure_attach"
echo "built $TOOL_MAKE"

step "C API program with pkg-config --cflags --libs, and with find_package + remora::remora"
# shellcheck disable=SC2046 # pkg-config's output is a list of words
run "$TMP/cc.log" cc -std=c11 -Wall -Wextra -o "$TMP/capi_attach_pc" "$SOURCE/tests/install/capi_attach.c" \
  $(pkg-config --cflags --libs remora) -Wl,-rpath,"$LIB"
run "$TMP/consumer-configure.log" "$CMAKE" -S "$SOURCE/tests/install/consumer" -B "$TMP/consumer" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
run "$TMP/consumer-build.log" "$CMAKE" --build "$TMP/consumer"
for p in "$TMP/capi_attach_pc" "$TMP/consumer/capi_attach"; do
  lib=$(ldd "$p" | awk '$1 == "libremora.so.0" { print $3 }')
  [[ $lib == "$LIB/libremora.so.0" ]] || fail "$p loads libremora.so.0 from '$lib', want $LIB"
done
echo "built both"

# start_target NAME: starts a thread_spawner, waits for its "ready" (10 s
# deadline) and sets TARGET_PID.
start_target() {
  local name=$1
  "$SPAWNER" "$TMP/$name.ready" >"$TMP/$name.out" 2>&1 &
  TARGET_PID=$!
  TARGETS+=("$TARGET_PID")
  for _ in $(seq 1 100); do
    [[ -s $TMP/$name.ready ]] && break
    kill -0 "$TARGET_PID" 2>/dev/null || fail "target $name exited early: $(cat "$TMP/$name.out")"
    sleep 0.1
  done
  [[ -s $TMP/$name.ready ]] || fail "target $name did not say ready within 10 s"
  echo "target $name: pid $TARGET_PID"
}
# stop_target NAME PID: SIGTERM; it must exit 0 (its threads all ran).
stop_target() {
  local name=$1 pid=$2 rc=0
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  cat "$TMP/$name.out"
  [[ $rc == 0 ]] || fail "target $name exited with $rc after the attaches"
}

# check_report FILE SESSION: the report of one attach, complete and plausible.
check_report() {
  local f=$1 session=$2
  [[ -f $f ]] || fail "no report $f"
  echo "--- $f"; cat "$f"
  field() { awk -v k="$1" '$1 == k { print $2 }' "$f"; }
  [[ $(head -n1 "$f") == "rss-sampler report" ]] || fail "$f: no header"
  [[ $(field pid) == "$TARGET_PID" ]] || fail "$f: pid $(field pid), want $TARGET_PID"
  [[ $(field session) == "$session" ]] || fail "$f: session $(field session), want $session"
  [[ $(field interval_ms) == 20 ]] || fail "$f: the interval set with the attach's environment was not used"
  (( $(field samples) >= 10 )) || fail "$f: only $(field samples) samples in 600+ ms at 20 ms"
  (( $(field rss_kib_min) > 0 && $(field rss_kib_max) >= $(field rss_kib_min) )) || fail "$f: implausible RSS"
  (( $(field threads_created) >= 2 )) || fail "$f: threads_created $(field threads_created), the target made ~6"
  ! grep -q '^error' "$f" || fail "$f: the tool reported an error"
}
ENV_ARGS=(RSS_SAMPLER_INTERVAL_MS=20)
attaches=0

# Target a: the tool built with CMake, attached by every client in turn (one
# agent, sessions 1, 2, ...: re-attaches need the same tool list).
step "target a"
start_target a
PID_A=$TARGET_PID
session=0
if "$PREFIX/bin/remora" --help 2>/dev/null | grep -Eq '^[[:space:]]+attach[[:space:]]'; then
  step "attach with the installed CLI: remora attach -t $TOOL_CMAKE"
  session=$((session + 1))
  run "$TMP/cli-attach.log" timeout 60 "$PREFIX/bin/remora" attach -p "$PID_A" -t "$TOOL_CMAKE" \
    --attach-children=false -d 700 -e "${ENV_ARGS[0]}" -e RSS_SAMPLER_OUTPUT="$TMP/report-cli.txt"
  cat "$TMP/cli-attach.log"
  check_report "$TMP/report-cli.txt" $session
  grep -qF "$LIB/libremora-agent.so" "/proc/$PID_A/maps" ||
    fail "the installed remora did not load the installed agent $LIB/libremora-agent.so: $(grep -F remora-agent "/proc/$PID_A/maps" | head -n1)"
else
  echo "NOTE: the installed remora has no 'attach' command; attaching with the C API only"
fi

step "attach with the installed libremora.so (find_package build)"
session=$((session + 1))
run "$TMP/capi-cmake.log" timeout 60 "$TMP/consumer/capi_attach" "$PID_A" "$TOOL_CMAKE" 700 \
  "${ENV_ARGS[@]}" RSS_SAMPLER_OUTPUT="$TMP/report-capi-cmake.txt"
check_report "$TMP/report-capi-cmake.txt" $session

PYTHON=$(command -v python3 || true)
if [[ -n $PYTHON ]] && "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  step "attach with the installed Python package (PYTHONPATH=$PYDIR, LD_LIBRARY_PATH=$LIB)"
  session=$((session + 1))
  run "$TMP/python.log" env PYTHONPATH="$PYDIR" LD_LIBRARY_PATH="$LIB" PYTHONDONTWRITEBYTECODE=1 \
    timeout 60 "$PYTHON" -c '
import sys, remora
pid, tool, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
assert remora.__file__.startswith(sys.argv[4]), remora.__file__
why = remora.attach(pid, tool, attach_duration_msec=700, attach_children=False,
                    env={"RSS_SAMPLER_INTERVAL_MS": "20", "RSS_SAMPLER_OUTPUT": out})
assert why == "duration", why
' "$PID_A" "$TOOL_CMAKE" "$TMP/report-python.txt" "$PYDIR"
  check_report "$TMP/report-python.txt" $session
else
  echo "NOTE: no python3 3.11+; the Python package was installed but not tried"
fi
attaches=$((attaches + session))

# Target b: the tool built with the Makefile, attached by the pkg-config
# build of the C API program.
step "target b: attach the Makefile-built tool with the installed libremora.so (pkg-config build)"
start_target b
PID_B=$TARGET_PID
run "$TMP/capi-pc.log" timeout 60 "$TMP/capi_attach_pc" "$PID_B" "$TOOL_MAKE" 700 \
  "${ENV_ARGS[@]}" RSS_SAMPLER_OUTPUT="$TMP/report-capi-pc.txt"
check_report "$TMP/report-capi-pc.txt" 1
grep -qF "$LIB/libremora-agent.so" "/proc/$PID_B/maps" ||
  fail "libremora.so did not load the agent next to it, $LIB/libremora-agent.so"
attaches=$((attaches + 1))

step "targets exit cleanly"
stop_target a "$PID_A"
stop_target b "$PID_B"
TARGETS=()
echo
echo "PASS: install, example tool (find_package + pkg-config), $attaches attaches"
