#!/usr/bin/env bash
# `make demo`: remora call on the bundled sample service.
#
# Starts build/bin/remora-sample-service in the background, shows its
# heartbeat and RSS, makes it call malloc_trim(0), getpid() and
# write(1, "hello from remora\n", 18) through `remora call`, shows that it is
# still healthy (heartbeat goes on, errors=0, its blocked pipe reader was not
# woken), and stops it. The service is stopped (and its log removed) however
# this script ends.
#
# Usage: examples/sample-service/demo.sh [BUILD_DIR]   (default: build)
set -euo pipefail

build_dir=${1:-build}
remora=$build_dir/bin/remora
service=$build_dir/bin/remora-sample-service
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
# remora_call ARGS...: show and run `remora call ARGS...`; its output stays in $out.
out=
remora_call() {
  print_cmd "$remora" call "$@"
  out=$("$remora" call "$@")
  echo "$out"
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

step "Start the sample service (8 threads: hashing, sorting, file I/O, a contended mutex, malloc churn, a reader blocked on a pipe)"
# >> (O_APPEND): the service and the remote write() below share this file.
"$service" >>"$log" 2>&1 &
pid=$!
wait_for '^sample-service pid [0-9]+ ready' 10
wait_for '^heartbeat: .* t=2s' 10
cat "$log"
echo "threads: $(cat /proc/$pid/task/*/comm | tr '\n' ' ')"

step "Before: RSS of pid $pid"
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

step "The service is still healthy: the heartbeat goes on, errors=0, pipe_reads=0"
seen=$(heartbeats)
wait_for "^heartbeat: .* t=$((seen + 2))s" 10
tail -n 3 "$log"
last=$(grep '^heartbeat:' "$log" | tail -n 1)
[[ $last == *" errors=0 "* ]] || die "the service reports errors: $last"
[[ $last == *" pipe_reads=0 "* ]] || die "the blocked pipe reader was woken: $last"

step "Stop the service"
kill -TERM "$pid"
wait "$pid" && status=0 || status=$?
pid=
tail -n 2 "$log"
[[ $status -eq 0 ]] || die "the service exited with status $status"
printf '\n%sdemo: OK%s\n' "$bold" "$plain"
