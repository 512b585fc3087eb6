#!/usr/bin/env bash
# What a user sees from `remora` for help, version and bad command lines:
# exit codes (docs/cli.md) and the "remora: error:" format. Starts no target.
set -uo pipefail
remora=${1:?usage: cli_usage_test.sh PATH/TO/remora}
fails=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# expect CODE PATTERN(stdout+stderr, grep -E) -- ARGS...
expect() {
  local want=$1 pattern=$2
  shift 3
  timeout 10 "$remora" "$@" >"$out" 2>"$err"
  local got=$?
  if [[ $got -ne $want ]] || ! cat "$out" "$err" | grep -Eq -- "$pattern"; then
    echo "FAIL: remora $* -> exit $got (want $want), output must match /$pattern/:"
    sed 's/^/  | /' "$out" "$err"
    fails=$((fails + 1))
  else
    echo "ok:   remora $* -> $got"
  fi
}

expect 0 'Exit codes:'                      -- --help
expect 0 'call'                             -- --help
expect 0 '^[0-9]+\.[0-9]+\.[0-9]+'          -- --version
expect 0 '\[LIB:\]SYMBOL'                   -- call --help
expect 0 '  4  library not mapped'          -- call --help
expect 1 '^remora: error: '                 --
expect 1 '^remora: error: .*(pid|required)' -- call malloc_trim 0
expect 1 '^remora: error: missing SYMBOL'   -- call -p 1
expect 1 '^remora: error: missing SYMBOL'   -- call -p 1 --
expect 0 'Usage: remora call \[OPTIONS\] \[LIB:\]SYMBOL \[ARG\.\.\.\]' -- call --help
expect 1 '^remora: error: at most 6'        -- call -p 1 f 1 2 3 4 5 6 7
expect 1 '^remora: error: unknown escape'   -- call -p 1 puts 'bad\q'
expect 1 '^remora: error: '                 -- call -p 0 getpid
expect 1 '^remora: error: '                 -- call -p 1 --timeout 0 getpid
expect 1 '^remora: error: '                 -- call -p 1 --ret float getpid
expect 1 "^remora: error: unknown command 'nosuchcommand'" -- nosuchcommand
# pid_max is at most 2^22, so this pid never exists.
expect 2 '^remora: error: '                 -- call -p 2147483646 getpid

# attach, detach, status, run: their help and command-line errors. The live
# paths are tested by tests/cli/cli_test.py.
expect 0 'Usage: remora attach \[OPTIONS\]'   -- attach --help
expect 0 '13  not attached'                 -- detach --help
expect 0 'LISTENER'                         -- status --help
expect 0 'Usage: remora run \[OPTIONS\] \[--\] CMD \[ARG\.\.\.\]' -- run --help
expect 1 '^remora: error: .*pid'            -- attach
expect 1 '^remora: error: .*pid'            -- detach --tree
expect 1 '^remora: error: .*pid'            -- status
expect 1 '^remora: error: .*excludes'       -- attach -p 1 --keep -d 100
expect 1 '^remora: error: '                 -- attach -p 1 --attach-children=maybe
expect 1 '^remora: error: '                 -- attach -p 1 -d 0
expect 1 '^remora: error: missing CMD'      -- run
expect 1 '^remora: error: missing CMD'      -- run --no-tool --
expect 1 '^remora: error: .*NAME=VALUE'     -- attach -p 1 -e NOEQUALS
expect 2 '^remora: error: '                 -- status -p 2147483646
expect 2 '^remora: error: '                 -- detach -p 2147483646
expect 2 '^remora: error: '                 -- attach -p 2147483646 -t /bin/sh -d 10

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
