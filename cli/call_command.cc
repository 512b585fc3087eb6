// `remora call`: makes one thread of a running process call a function and
// return, then prints the result. The engine (remote::Target) does the work
// and the checks; this file only turns the command line into a call and the
// outcome into a line of output and an exit code.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/call_args.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/common_options.h"
#include "cli/exit_codes.h"
#include "remote/target.h"

namespace remora::cli {
namespace {

// x86_64 and aarch64 both pass six integer arguments in registers; the engine
// refuses more, but saying so before touching the target is kinder.
constexpr size_t kMaxArgs = 6;

struct CallCommandOptions {
  pid_t pid = 0;
  pid_t tid = 0;
  long timeout_ms = 5000;
  std::string ret = "long";
  std::vector<std::string> words;  // [LIB:]SYMBOL [ARG...], verbatim
};

int run_call(const CallCommandOptions& o, const std::vector<std::string>& words) {
  if (words.empty()) {
    print_error("missing SYMBOL (usage: remora call -p PID [LIB:]SYMBOL [ARG...]; see remora call --help)");
    return to_int(ExitCode::kUsage);
  }
  auto spec = parse_symbol_spec(words[0]);
  if (!spec) return fail(spec.error());
  if (words.size() - 1 > kMaxArgs) {
    print_error("at most " + std::to_string(kMaxArgs) + " arguments can be passed, got " +
                std::to_string(words.size() - 1));
    return to_int(ExitCode::kUsage);
  }
  auto ret = parse_return_type(o.ret);
  if (!ret) return fail(ret.error());

  std::vector<ParsedArg> parsed;
  std::vector<remote::CallArg> args;
  for (size_t i = 1; i < words.size(); ++i) {
    auto a = parse_call_arg(words[i]);
    if (!a) return fail(a.error());
    args.push_back(a->kind == ParsedArg::Kind::kString ? remote::CallArg::string(a->text)
                                                       : remote::CallArg::integer(a->value));
    parsed.push_back(std::move(*a));
  }

  auto target = remote::Target::open(o.pid);
  if (!target) return fail(target.error());

  remote::CallOptions call_opts;
  call_opts.tid = o.tid;
  call_opts.timeout = std::chrono::milliseconds(o.timeout_ms);
  auto report = (*target)->call_symbol(spec->library, spec->symbol, args, call_opts);
  // Close explicitly (the destructor would too, silently): a scratch mapping
  // left behind means the process is not exactly as it was, and the user
  // should hear about it.
  auto closed = (*target)->close();
  if (!report) return fail(report.error());
  std::printf(
      "%s\n",
      format_result(describe_call(*spec, parsed), report->value, *ret, report->tid, report->stopped).c_str());
  std::fflush(stdout);
  if (!closed) return fail(std::move(closed).error().with_context("close session"));
  return to_int(ExitCode::kOk);
}

}  // namespace

void add_call_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<CallCommandOptions>();
  CLI::App* sub =
      root.add_subcommand("call", "Make one thread of a running process call a function and return");
  // Everything from SYMBOL on is the call, taken verbatim: "-1" is an
  // argument there, not an option. So options go before SYMBOL.
  add_verbatim_words(sub, opts->words, "[LIB:]SYMBOL [ARG...]");
  add_pid_option(sub, opts->pid, "Process to call into");
  sub->add_option("-T,--tid", opts->tid, "Thread to use (default: Remora picks one blocked in a system call)")
      ->check(CLI::PositiveNumber);
  add_timeout_option(sub, opts->timeout_ms, "Deadline for the whole call, in milliseconds");
  sub->add_option("-r,--ret", opts->ret, "How to print the return value: long, int, ptr or void")
      ->capture_default_str()
      ->check(CLI::IsMember({"long", "int", "ptr", "pointer", "void"}));
  sub->footer(
      "Positional:\n"
      "  [LIB:]SYMBOL  function to call. LIB is a path, a soname (libc.so.6) or a basename\n"
      "                prefix (libc); without LIB the executable, then every library is searched.\n"
      "  ARG...        up to 6 arguments: an integer (42, -1, 0x7f) or else a string, copied into\n"
      "                the target and passed by address; s:TEXT forces a string. Strings take C\n"
      "                escapes (\\n \\t \\0 \\\\ \\\" \\xHH).\n"
      "\n"
      "Prints: CALL = DECIMAL (HEX)  [thread TID, stopped MICROSECONDS us]\n"
      "\n"
      "Examples:\n"
      "  remora call -p 4242 malloc_trim 0\n"
      "  remora call -p 4242 libc.so.6:write 1 \"hello from remora\\n\" 18\n"
      "  remora call -p 4242 -T 4250 --ret int getpid\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, &dispatch] { dispatch.run = [opts] { return run_call(*opts, opts->words); }; });
}

}  // namespace remora::cli
