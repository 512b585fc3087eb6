"""A test target: a process tree that blocks until killed.

    python3 target_tree.py N

starts N children (each blocks reading its stdin), waits until each says it
is running, then prints one JSON line on stdout, {"pid": P, "children": [...]},
and blocks reading its own stdin. The test kills the whole process group.
"""

import json
import os
import subprocess
import sys

CHILD = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.buffer.read()"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(n)
    ]
    for c in children:
        if c.stdout.readline() != b"ready\n":
            sys.exit("a child did not start")
    sys.stdout.write(json.dumps({"pid": os.getpid(), "children": [c.pid for c in children]}) + "\n")
    sys.stdout.flush()
    sys.stdin.buffer.read()  # until the test closes the pipe or kills us


if __name__ == "__main__":
    main()
