// The Slurm fan-out's pure parts: job names, scontrol's records, which
// processes are ranks, a rank's identity, clock samples and the wire.
#include "cli/slurm_job.h"

#include <gtest/gtest.h>

#include <string>

namespace remora::cli::slurm {
namespace {

using namespace std::string_literals;

TEST(SlurmJobSpec, AcceptsJobsStepsAndArrayTasks) {
  struct Case {
    const char* text;
    const char* job;
    const char* step;
  } cases[] = {{"1234", "1234", ""},
               {"1234.0", "1234", "0"},
               {"1234.batch", "1234", "batch"},
               {"1234.extern", "1234", "extern"},
               {"1234_7", "1234_7", ""},
               {"1234_7.12", "1234_7", "12"}};
  for (const auto& c : cases) {
    auto s = parse_job_spec(c.text);
    ASSERT_TRUE(s) << c.text;
    EXPECT_EQ(s->job, c.job);
    EXPECT_EQ(s->step, c.step);
    EXPECT_EQ(s->text(), c.text);
  }
  for (const char* bad : {"", "abc", "12a", "1234.", ".0", "1234.x", "12_", "_3", "1234.0.1", "-1", "12 34"})
    EXPECT_FALSE(parse_job_spec(bad)) << bad;
  auto e = parse_job_spec("job7");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("JOBID.STEP"), std::string::npos);
}

TEST(SlurmShowJob, ReadsTheFieldsRemoraDecidesOn) {
  const std::string text =
      "JobId=42 JobName=train run UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=1 "
      "JobState=RUNNING Reason=None Dependency=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=4 "
      "NumTasks=4 Command=/home/alice/my job.sh WorkDir=/home/alice\n";
  auto j = parse_show_job(text, "42");
  ASSERT_TRUE(j);
  EXPECT_EQ(j->id, "42");
  EXPECT_EQ(j->name, "train run");
  EXPECT_EQ(j->user, "alice");
  EXPECT_EQ(j->uid, 1000u);
  EXPECT_EQ(j->state, "RUNNING");
  EXPECT_EQ(j->node_list, "n[1-2]");
  EXPECT_EQ(j->num_nodes, 2);
  EXPECT_EQ(j->num_tasks, 4);

  auto missing = parse_show_job("slurm_load_jobs error: Invalid job id specified\n", "99");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Errc::kNoSuchProcess);
  EXPECT_NE(missing.error().message().find("job 99"), std::string::npos);
  EXPECT_FALSE(parse_show_job("", "1"));

  auto pending = parse_show_job("JobId=7 UserId=root(0) JobState=PENDING NodeList=(null) NumNodes=1", "7");
  ASSERT_TRUE(pending);
  EXPECT_EQ(pending->node_list, "");
  EXPECT_EQ(pending->uid, 0u);
}

TEST(SlurmListpids, ParsesAndSelectsTheRanks) {
  const std::string text =
      "PID      JOBID    STEPID   LOCALID GLOBALID\n"
      "100      42       batch    0       0\n"
      "101      42       batch    -       -\n"
      "200      42       0        1       3\n"
      "201      42       0        0       2\n"
      "202      42       0        -       -\n"
      "300      42       1        0       0\n"
      "400      42       extern   0       0\n"
      "500      42       2        0       1\n"
      "garbage line\n";
  auto listed = parse_listpids(text);
  ASSERT_EQ(listed.size(), 8u);
  EXPECT_EQ(listed[0].pid, 100);
  EXPECT_EQ(listed[1].local_id, -1);
  EXPECT_EQ(listed[2].global_id, 3);

  auto pids = [](const std::vector<ListedPid>& v) {
    std::vector<pid_t> out;
    for (const auto& p : v) out.push_back(p.pid);
    return out;
  };
  // Every numbered step but remora's own (2), in rank order; helpers left out.
  EXPECT_EQ(pids(select_ranks(listed, "", "2")), (std::vector<pid_t>{201, 200, 300}));
  EXPECT_EQ(pids(select_ranks(listed, "0", "2")), (std::vector<pid_t>{201, 200}));
  EXPECT_EQ(pids(select_ranks(listed, "batch", "2")), (std::vector<pid_t>{100}));
  EXPECT_EQ(pids(select_ranks(listed, "7", "2")), (std::vector<pid_t>{}));
  // Only the script runs (no srun inside): its batch step.
  auto batch_only = parse_listpids("100 42 batch 0 0\n101 42 batch - -\n400 42 extern 0 0\n500 42 3 0 0\n");
  EXPECT_EQ(pids(select_ranks(batch_only, "", "3")), (std::vector<pid_t>{100}));
}

TEST(SlurmRankIdentity, ComesFromTheProcesssEnvironment) {
  const std::string block =
      "PATH=/bin\0SLURM_PROCID=5\0SLURM_LOCALID=1\0SLURMD_NODENAME=n2\0SLURM_JOB_ID=42\0SLURM_STEP_ID=0\0"
      "SLURM_PROCIDX=9\0BROKEN\0"s;
  auto r = rank_from_environ(block);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.node, "n2");
  EXPECT_EQ(r.job, "42");
  EXPECT_EQ(r.step, "0");
  auto none = rank_from_environ("HOME=/root\0SLURM_PROCID=x\0"s);
  EXPECT_EQ(none.rank, -1);
  EXPECT_EQ(none.local_rank, -1);
  EXPECT_EQ(none.node, "");
}

TEST(SlurmClock, TakesTheMidpointAndTheShortestRoundTrip) {
  // Node 5 s ahead; the answer read 400 ns into a 1000 ns round trip.
  auto s = clock_sample(1000, 5'000'001'400, 2000);
  EXPECT_EQ(s.offset_ns, 5'000'000'000 - 100);
  EXPECT_EQ(s.uncertainty_ns, 500u);
  EXPECT_EQ(s.node_mono_ns, 5'000'001'400u);
  // A node behind the front: negative offset.
  auto behind = clock_sample(10'000, 4'000, 10'010);
  EXPECT_EQ(behind.offset_ns, -6'005);
  EXPECT_EQ(behind.uncertainty_ns, 5u);
  EXPECT_FALSE(best_sample({}));
  auto best = best_sample(
      {clock_sample(0, 100, 1000), clock_sample(2000, 2100, 2100), clock_sample(3000, 3100, 9000)});
  ASSERT_TRUE(best);
  EXPECT_EQ(best->uncertainty_ns, 50u);
}

TEST(SlurmWire, ReassemblesEventsAndFilesFromAnyPieces) {
  const std::string file = "bin\0ary\nwith {\"ev\":1}\n"s;
  const std::string stream =
      "{\"ev\":\"hello\",\"node\":\"n1\"}\n"
      "srun: warning: something of srun's own\n"
      "{\"ev\":\"file\",\"path\":\"a/b\",\"size\":" +
      std::to_string(file.size()) + "}\n" + file +
      "{\"ev\":\"file\",\"path\":\"empty\",\"size\":0}\n"
      "{\"ev\":\"done\"}\n";
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, stream.size()}) {
    EventReader r;
    std::vector<EventReader::Event> got;
    for (size_t i = 0; i < stream.size(); i += piece) {
      r.feed(std::string_view(stream).substr(i, piece));
      while (auto e = r.next()) got.push_back(*e);
    }
    ASSERT_EQ(got.size(), 5u) << "piece " << piece;
    EXPECT_EQ(got[0].json, "{\"ev\":\"hello\",\"node\":\"n1\"}");
    EXPECT_EQ(got[1].json, "");
    EXPECT_EQ(got[1].payload, "srun: warning: something of srun's own");
    EXPECT_EQ(got[2].payload, file);
    EXPECT_EQ(got[3].payload, "");
    EXPECT_NE(got[3].json.find("empty"), std::string::npos);
    EXPECT_EQ(got[4].json, "{\"ev\":\"done\"}");
    EXPECT_EQ(r.pending(), 0u);
  }
  // A cut-off file stays pending; an impossible size is not trusted.
  EventReader cut;
  cut.feed("{\"ev\":\"file\",\"size\":10}\nabc");
  EXPECT_FALSE(cut.next());
  EXPECT_GT(cut.pending(), 0u);
  EventReader huge;
  huge.feed("{\"ev\":\"file\",\"size\":99999999999}\n{\"ev\":\"done\"}\n");
  auto e = huge.next();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->json, "");
  e = huge.next();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->json, "{\"ev\":\"done\"}");
  EXPECT_FALSE(payload_size("{\"ev\":\"file\",\"size\":-1}"));
  EXPECT_EQ(payload_size("{\"ev\":\"rank\"}"), 0u);
}

TEST(SlurmWire, FilePathsStayUnderTheJobDirectory) {
  for (const char* ok : {"a", "n1/x-1-s1-2026/trace.perfetto", "a.b/c..d"})
    EXPECT_TRUE(safe_relative_path(ok)) << ok;
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../b", "a//b", "a/", "./a", "a/."})
    EXPECT_FALSE(safe_relative_path(bad)) << bad;
  EXPECT_FALSE(safe_relative_path(std::string_view("a\0b", 3)));
}

TEST(SlurmNodeList, ExpandsHostlists) {
  auto v = expand_node_list("n[1-3],gpu[07-08,10],login");
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (std::vector<std::string>{"n1", "n2", "n3", "gpu07", "gpu08", "gpu10", "login"}));
  auto s = expand_node_list("rack[1-2]-a");
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (std::vector<std::string>{"rack1-a", "rack2-a"}));
  EXPECT_EQ(*expand_node_list("n1"), (std::vector<std::string>{"n1"}));
  for (const char* bad : {"n[1-", "n[3-1]", "n[a]", "n[1-2][3-4]"})
    EXPECT_FALSE(expand_node_list(bad)) << bad;
}

}  // namespace
}  // namespace remora::cli::slurm
