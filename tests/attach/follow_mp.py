#!/usr/bin/env python3
"""Target of Follow.PythonMultiprocessingFork (follow_test.cc): python3's
multiprocessing with the fork start method. Line protocol on stdin/stdout:

  -> "ready PID"
  "fork"   starts a worker process (fork, no exec); reply "forked PID" once it answered a first request
  "ask I"  one request to worker I; reply "served PID" or "error WHY"
  "quit"   stops the workers, reply "bye"
"""
import multiprocessing
import os
import sys


def worker(conn):
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg == "stop":
            return
        conn.send(("pid", os.getpid(), msg))


def ask(w, conn):
    conn.send("req")
    if not conn.poll(20):
        return "error no answer from %d" % w.pid
    reply = conn.recv()
    if reply[0] != "pid" or reply[1] != w.pid:
        return "error unexpected answer %r" % (reply,)
    return "served %d" % w.pid


def main():
    ctx = multiprocessing.get_context("fork")
    workers = []
    print("ready %d" % os.getpid(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "fork":
            ours, theirs = ctx.Pipe()
            w = ctx.Process(target=worker, args=(theirs,), daemon=True)
            w.start()
            theirs.close()
            workers.append((w, ours))
            answer = ask(w, ours)
            print("forked %d" % w.pid if answer.startswith("served") else answer, flush=True)
        elif words[0] == "ask":
            w, conn = workers[int(words[1])]
            print(ask(w, conn), flush=True)
        elif words[0] == "quit":
            for w, conn in workers:
                conn.send("stop")
                conn.close()
            for w, conn in workers:
                w.join(10)
            print("bye", flush=True)
            return 0
        else:
            print("error unknown command %r" % line.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
