#!/usr/bin/env bash
# `make demo`: attach Remora's default tool to the bundled sample service.
#
# Starts build/bin/remora-sample-service in the background (threads hashing,
# sorting, doing file I/O, contending on a mutex, churning malloc, and one
# blocked on a pipe), runs `remora attach -p PID -d 3000` (a live progress
# line on a terminal), which detaches after 3 s and prints the tool's summary
# (hottest functions, slowest traced calls) and names its output files; then
# shows that the service is still healthy (heartbeat goes on, errors=0, its
# blocked pipe reader was not woken) and stops it. The service is stopped
# (and its log removed) however this script ends; the tool's output stays in
# BUILD_DIR/demo-output.
#
# Until the default tool (libremora-tool.so) is built, the demo falls back to
# `remora call` (malloc_trim, getpid, write) on the same service.
#
# Usage: examples/sample-service/demo.sh [BUILD_DIR]   (default: build)
set -euo pipefail

build_dir=${1:-build}
remora=$build_dir/bin/remora
service=$build_dir/bin/remora-sample-service
tool=$build_dir/lib/libremora-tool.so
for f in "$remora" "$service"; do
  [[ -x $f ]] || { echo "demo: $f is missing; run 'make' first" >&2; exit 1; }
done

log=$(mktemp -t remora-demo.XXXXXX)
pid=
cleanup() {
  local rc=$?
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    # Give it 5 s to stop cleanly, then make sure.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  [[ -n $pid ]] && wait "$pid" 2>/dev/null || true
  rm -f "$log"
  if [[ $rc -ne 0 ]]; then echo "demo: FAILED (exit $rc)" >&2; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -t 1 ]]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$plain"; }
# print_cmd CMD...: print the command as one could paste it into a shell.
print_cmd() {
  local line='$' a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=+-]+$ ]]; then line+=" $a"; else line+=" \"${a//\"/\\\"}\""; fi
  done
  printf '%s\n' "$line"
}
die() { echo "demo: $*" >&2; exit 1; }

# wait_for PATTERN SECONDS: until the service log has a line matching PATTERN.
wait_for() {
  local deadline=$((SECONDS + $2))
  until grep -Eq -- "$1" "$log"; do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; die "the service exited"; }
    ((SECONDS < deadline)) || { cat "$log" >&2; die "timed out waiting for /$1/"; }
    sleep 0.1
  done
}
heartbeats() { grep -c '^heartbeat:' "$log" || true; }
rss() { awk '/^VmRSS:/ { print $2, $3 }' "/proc/$pid/status"; }

start_service() {
  step "Start the sample service (8 threads: hashing, sorting, file I/O, a contended mutex, malloc churn, a reader blocked on a pipe)"
  # >> (O_APPEND): the service and a remote write() share this file.
  "$service" >>"$log" 2>&1 &
  pid=$!
  wait_for '^sample-service pid [0-9]+ ready' 10
  wait_for '^heartbeat: .* t=2s' 10
  cat "$log"
  echo "threads: $(cat /proc/$pid/task/*/comm | tr '\n' ' ')"
}

healthy() {
  step "The service is still healthy: the heartbeat goes on, errors=0, pipe_reads=0"
  local seen
  seen=$(heartbeats)
  wait_for "^heartbeat: .* t=$((seen + 2))s" 10
  tail -n 3 "$log"
  local last
  last=$(grep '^heartbeat:' "$log" | tail -n 1)
  [[ $last == *" errors=0 "* ]] || die "the service reports errors: $last"
  [[ $last == *" pipe_reads=0 "* ]] || die "the blocked pipe reader was woken: $last"
}

stop_service() {
  step "Stop the service"
  kill -TERM "$pid"
  local status
  wait "$pid" && status=0 || status=$?
  pid=
  tail -n 2 "$log"
  [[ $status -eq 0 ]] || die "the service exited with status $status"
}

# --- with the default tool: remora attach -----------------------------------
attach_demo() {
  local out_dir=$build_dir/demo-output
  rm -rf "$out_dir"
  mkdir -p "$out_dir"
  out_dir=$(cd "$out_dir" && pwd)

  start_service

  step "Attach the default tool to pid $pid for 3 s: sample stacks, trace libc calls, then detach"
  print_cmd remora attach -p "$pid" -d 3000 -e "REMORA_OUTPUT_PATH=$out_dir"
  # stdout stays the terminal (if it is one), for the live progress line.
  "$remora" attach -p "$pid" -d 3000 -e "REMORA_OUTPUT_PATH=$out_dir" ||
    die "remora attach failed (exit $?)"

  # The tool left its raw records (profile.remora); remora rendered these
  # files from them and printed the summary: check they are all there.
  local dir
  dir=$(find "$out_dir" -mindepth 1 -maxdepth 1 -type d -name "*-$pid-s1-*" | head -n 1)
  [[ -n $dir ]] || die "no output directory for pid $pid under $out_dir"
  for f in profile.remora summary.txt trace.perfetto profile.pb.gz trace.json flamegraph.svg folded.txt stats.csv; do
    [[ -s $dir/$f ]] || die "$dir/$f is missing or empty"
  done
  grep -q '^Hottest functions' "$dir/summary.txt" || die "summary.txt has no hottest functions"
  grep -q '^Slowest traced calls' "$dir/summary.txt" || die "summary.txt has no slowest calls"

  step "The agent's view, read without stopping a thread"
  print_cmd remora status -p "$pid"
  "$remora" status -p "$pid"

  healthy
  stop_service
  printf '\nThe output stays in %s (open flamegraph.svg in a browser, trace.perfetto in ui.perfetto.dev,\nprofile.pb.gz with go tool pprof; render again with: remora report DIR).\n' "$dir"
}

# --- fallback: remora call ---------------------------------------------------
out=
remora_call() {
  print_cmd remora call "$@"
  out=$("$remora" call "$@")
  echo "$out"
}

call_demo() {
  start_service

  step "Before: RSS of pid $pid"
  local rss_before rss_after
  rss_before=$(rss)
  echo "VmRSS: $rss_before"

  step "Make one of its threads call malloc_trim(0): give freed heap memory back to the kernel"
  remora_call -p "$pid" malloc_trim 0
  # 1: memory was released (the 64 MiB freed at start are there to release).
  [[ $out == *"malloc_trim(0) = 1 "* ]] || die "malloc_trim(0) did not return 1"

  step "After: RSS of pid $pid"
  rss_after=$(rss)
  echo "VmRSS: $rss_after   (was $rss_before)"
  ((${rss_after% *} < ${rss_before% *})) || die "RSS did not shrink"

  step "More calls: getpid(), and write(1, ...) into the service's own stdout"
  remora_call -p "$pid" --ret int getpid
  [[ $out == *"getpid() = $pid "* ]] || die "getpid() did not return $pid"
  remora_call -p "$pid" libc.so.6:write 1 "hello from remora\n" 18
  [[ $out == *") = 18 "* ]] || die "write() did not return 18"
  wait_for '^hello from remora$' 5
  echo "service log now holds: $(grep -m1 '^hello from remora$' "$log")"

  healthy
  stop_service
}

if [[ -f $tool ]]; then
  attach_demo
else
  echo "demo: note: the default tool $tool is not built yet;" \
    "showing 'remora call' instead of 'remora attach'."
  call_demo
fi
printf '\n%sdemo: OK%s\n' "$bold" "$plain"
