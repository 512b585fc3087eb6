// `remora report DIR...`: renders a default-tool session again from the raw
// records it left (DIR/profile.remora), like `perf report`: after installing
// debug symbols, with a newer remora, or for a session whose controller did
// not render it (--keep, the C API, a controller that died).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/renderer.h"
#include "cli/session_args.h"
#include "cli/session_support.h"

namespace remora::cli {
namespace {

struct ReportCommandOptions {
  std::vector<std::string> dirs;
  pid_t pid = 0;
};

// A job directory of `remora attach --slurm`: its ranks merged again (each
// rank was rendered on its own node, where its binaries are).
Result<void> report_job(const std::string& dir) {
  if (auto m = merge_job(dir); !m) return m;
  std::printf("==> %s\n", dir.c_str());
  std::ifstream summary(dir + "/summary.txt");
  std::string line;
  while (std::getline(summary, line)) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return {};
}

int run_report(const ReportCommandOptions& o) {
  int exit_code = 0;
  for (const auto& d : o.dirs) {
    if (::access((d + "/job.json").c_str(), F_OK) == 0) {
      if (auto r = report_job(d); !r && exit_code == 0) {
        print_error(r.error().to_string());
        exit_code = to_int(exit_code_for(r.error().code()));
      }
      continue;
    }
    OutputDir out;
    out.path = d;
    while (out.path.size() > 1 && out.path.back() == '/') out.path.pop_back();
    out.pid = output_dir_pid(out.path.substr(out.path.rfind('/') + 1));  // "<comm>-<pid>-s<n>-<stamp>"
    out.host_pid = o.pid;
    auto r = render_and_print(stdout, out);
    if (!r && exit_code == 0) {
      print_error(r.error().to_string());
      exit_code = to_int(exit_code_for(r.error().code()));
    }
  }
  return exit_code;
}

}  // namespace

void add_report_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<ReportCommandOptions>();
  CLI::App* sub = root.add_subcommand(
      "report", "Render a default-tool session's outputs (again) from the raw records in its directory");
  sub->add_option(
         "DIR", opts->dirs,
         "Session directories (each holds profile.remora), or job directories of remora attach --slurm "
         "(job.json: the ranks are merged again)")
      ->required();
  sub->add_option("-p,--pid", opts->pid,
                  "Collect the session again from the live process first, PID as this machine sees it");
  sub->footer(
      "Renders from DIR alone: the names recorded when the session ended (DIR/names.json,\n"
      "with each object's build ID), the perf map and thread ids kept there. The same files\n"
      "byte for byte later or on another machine, after the process and its binaries are\n"
      "gone; better where a debug file for a build ID became available (REMORA_DEBUG_PATH,\n"
      "/usr/lib/debug/.build-id), and summary.txt says so. Writes summary.txt,\n"
      "trace.perfetto, profile.pb.gz, flamegraph.svg, folded.txt, stats.csv and trace.json\n"
      "into DIR, replacing what was there.\n"
      "\n"
      "Example:\n"
      "  remora report remora-output/redis-server-4242-s1-20261201-101500\n"
      "  remora report remora-output/slurm-1234-20261203-170000   # a Slurm job: merged again\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, &dispatch] { dispatch.run = [opts] { return run_report(*opts); }; });
}

}  // namespace remora::cli
