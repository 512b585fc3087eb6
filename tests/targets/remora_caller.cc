// remora_caller PID: a controller that loops remote calls of remora_probe
// into process PID until it is killed. The controller-death test SIGKILLs it
// at random instants, so every phase of a call (open, seize, scratch set-up,
// the call itself, release, close) gets interrupted sooner or later.
//
// It cycles through the target's threads (re-read from /proc/PID/task at
// every reopen) and reopens its Target every 16 calls. Prints "calling" once
// the first call has succeeded. Exits 1 with a message on stderr if a call
// fails: the test then sees an exit status instead of SIGKILL.
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "remote/target.h"

namespace {

std::vector<pid_t> tasks(pid_t pid) {
  std::vector<pid_t> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] >= '1' && e->d_name[0] <= '9') out.push_back(static_cast<pid_t>(atoi(e->d_name)));
    closedir(d);
  }
  return out;
}

[[noreturn]] void die(const std::string& what, const remora::Error& e) {
  fprintf(stderr, "remora_caller: %s: %s\n", what.c_str(), e.to_string().c_str());
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  using remora::remote::CallArg;
  if (argc != 2) {
    fprintf(stderr, "usage: remora_caller PID\n");
    return 2;
  }
  pid_t pid = static_cast<pid_t>(atoi(argv[1]));
  bool announced = false;
  for (uint64_t i = 0;; ++i) {
    auto opened = remora::remote::Target::open(pid);
    if (!opened.ok()) die("open", opened.error());
    auto target = std::move(opened).value();
    auto fn = target->find_symbol("", "remora_probe");
    if (!fn.ok()) die("find_symbol", fn.error());
    std::vector<pid_t> tids = tasks(pid);
    for (int k = 0; k < 16; ++k, ++i) {
      remora::remote::CallOptions opts;
      // Every other call lets Remora choose; the others name each thread in turn.
      if (k % 2 == 1 && !tids.empty()) opts.tid = tids[(i / 2) % tids.size()];
      CallArg args[2] = {CallArg::integer(i), CallArg::integer(7)};
      auto r = target->call(*fn, args, opts);
      if (!r.ok()) {
        if (r.error().code() == remora::Errc::kNoSuchProcess && opts.tid != 0) continue;  // thread gone
        die("call " + std::to_string(i), r.error());
      }
      if (r->value != i * 31 + 7) {
        fprintf(stderr, "remora_caller: call %llu returned %llu\n", (unsigned long long)i,
                (unsigned long long)r->value);
        return 1;
      }
      if (!announced) {
        printf("calling\n");
        fflush(stdout);
        announced = true;
      }
    }
    auto c = target->close();
    if (!c.ok()) die("close", c.error());
  }
}
