// remora_scratch_kill_caller PID: a controller for the scratch-reclaim test.
// Opens a Target on PID and prints "opened"; on the line "go" from stdin it
// calls libc's usleep(3000) in the target, again and again, until it is
// SIGKILLed (the test kills it at a random instant, so most deaths fall in
// the middle of a call and leave its scratch mapping behind). Exits 1 with
// a message on stderr if anything fails first.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "remote/target.h"

namespace {

[[noreturn]] void die(const std::string& what, const remora::Error& e) {
  fprintf(stderr, "remora_scratch_kill_caller: %s: %s\n", what.c_str(), e.to_string().c_str());
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  using remora::remote::CallArg;
  if (argc != 2) {
    fprintf(stderr, "usage: remora_scratch_kill_caller PID\n");
    return 2;
  }
  pid_t pid = static_cast<pid_t>(atoi(argv[1]));
  auto opened = remora::remote::Target::open(pid);
  if (!opened.ok()) die("open", opened.error());
  auto target = std::move(opened).value();
  auto fn = target->find_symbol("libc.so.6", "usleep");
  if (!fn.ok()) die("find usleep", fn.error());
  printf("opened\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) return 0;  // the test gave up
  for (;;) {
    CallArg args[] = {CallArg::integer(3000)};
    auto r = target->call(*fn, args);
    if (!r.ok()) die("call usleep", r.error());
  }
}
