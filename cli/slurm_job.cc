#include "cli/slurm_job.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <nlohmann/json.hpp>

namespace remora::cli::slurm {
namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

template <typename T>
std::optional<T> to_number(std::string_view s) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// scontrol's one-line record: "Key=value Key=value ..."; a value may hold
// spaces (Command=, Comment=, Reason=), so it runs up to the next " Key=".
std::string field(std::string_view text, std::string_view key) {
  std::string needle = std::string(key) + "=";
  size_t at = 0;
  for (;;) {
    at = text.find(needle, at);
    if (at == std::string_view::npos) return "";
    if (at == 0 || std::isspace(static_cast<unsigned char>(text[at - 1]))) break;
    at += needle.size();
  }
  size_t v = at + needle.size();
  size_t end = v;
  while (end < text.size() && text[end] != '\n') {
    if (text[end] == ' ') {
      // A following "Word=" starts the next field.
      size_t k = end + 1;
      while (k < text.size() && (std::isalnum(static_cast<unsigned char>(text[k])) || text[k] == ':' ||
                                 text[k] == '/' || text[k] == '_'))
        ++k;
      if (k > end + 1 && k < text.size() && text[k] == '=') break;
    }
    ++end;
  }
  return std::string(text.substr(v, end - v));
}

}  // namespace

Result<JobSpec> parse_job_spec(std::string_view text) {
  auto bad = [&] {
    return Error(Errc::kInvalidArgument, "'" + std::string(text) +
                                             "' is not a Slurm job: give JOBID or JOBID.STEP (1234, 1234.0, "
                                             "1234.batch, 1234_7 for an array task), as squeue lists it");
  };
  JobSpec s;
  std::string_view job = text, step;
  if (size_t dot = text.find('.'); dot != std::string_view::npos) {
    job = text.substr(0, dot);
    step = text.substr(dot + 1);
    if (!all_digits(step) && step != "batch" && step != "extern") return bad();
  }
  if (size_t us = job.find('_'); us != std::string_view::npos) {
    if (!all_digits(job.substr(0, us)) || !all_digits(job.substr(us + 1))) return bad();
  } else if (!all_digits(job)) {
    return bad();
  }
  s.job = std::string(job);
  s.step = std::string(step);
  return s;
}

Result<JobInfo> parse_show_job(std::string_view text, const std::string& job) {
  if (text.find("Invalid job id") != std::string_view::npos)
    return Error(Errc::kNoSuchProcess, "Slurm has no job " + job +
                                           " (scontrol: invalid job id); squeue lists "
                                           "the running ones");
  JobInfo j;
  j.id = field(text, "JobId");
  if (j.id.empty()) return Error(Errc::kParse, "scontrol show job " + job + " printed no job record");
  j.name = field(text, "JobName");
  j.state = field(text, "JobState");
  // "UserId=alice(1000)"
  std::string user = field(text, "UserId");
  if (size_t open = user.find('('); open != std::string::npos && user.back() == ')') {
    j.user = user.substr(0, open);
    if (auto uid = to_number<uid_t>(std::string_view(user).substr(open + 1, user.size() - open - 2)))
      j.uid = *uid;
  } else {
    j.user = user;
  }
  j.node_list = field(text, "NodeList");
  if (j.node_list == "(null)") j.node_list.clear();
  j.num_nodes = to_number<int>(field(text, "NumNodes")).value_or(0);
  j.num_tasks = to_number<int>(field(text, "NumTasks")).value_or(0);
  return j;
}

std::vector<ListedPid> parse_listpids(std::string_view text) {
  std::vector<ListedPid> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string_view line =
        text.substr(start, nl == std::string_view::npos ? text.size() - start : nl - start);
    start = nl == std::string_view::npos ? text.size() : nl + 1;
    auto w = words(line);
    if (w.size() != 5) continue;  // the header, blank lines
    auto pid = to_number<pid_t>(w[0]);
    if (!pid || *pid <= 0) continue;
    ListedPid p;
    p.pid = *pid;
    p.job = std::string(w[1]);
    p.step = std::string(w[2]);
    p.local_id = to_number<int>(w[3]).value_or(-1);
    p.global_id = to_number<int>(w[4]).value_or(-1);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<ListedPid> select_ranks(const std::vector<ListedPid>& listed, std::string_view step,
                                    std::string_view own_step) {
  auto tasks_of = [&](auto&& wanted) {
    std::vector<ListedPid> out;
    for (const auto& p : listed)
      if (p.local_id >= 0 && wanted(p.step)) out.push_back(p);
    return out;
  };
  std::vector<ListedPid> out;
  if (!step.empty()) {
    out = tasks_of([&](const std::string& s) { return s == step; });
  } else {
    out = tasks_of([&](const std::string& s) { return all_digits(s) && s != own_step; });
    if (out.empty()) out = tasks_of([](const std::string& s) { return s == "batch"; });
  }
  std::sort(out.begin(), out.end(), [](const ListedPid& a, const ListedPid& b) {
    return std::tie(a.step, a.global_id, a.pid) < std::tie(b.step, b.global_id, b.pid);
  });
  return out;
}

RankIdentity rank_from_environ(std::string_view block) {
  RankIdentity r;
  size_t start = 0;
  while (start < block.size()) {
    size_t end = block.find('\0', start);
    if (end == std::string_view::npos) end = block.size();
    std::string_view kv = block.substr(start, end - start);
    start = end + 1;
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "SLURM_PROCID")
      r.rank = to_number<int>(v).value_or(-1);
    else if (k == "SLURM_LOCALID")
      r.local_rank = to_number<int>(v).value_or(-1);
    else if (k == "SLURMD_NODENAME")
      r.node = std::string(v);
    else if (k == "SLURM_JOB_ID")
      r.job = std::string(v);
    else if (k == "SLURM_STEP_ID")
      r.step = std::string(v);
  }
  return r;
}

ClockSample clock_sample(uint64_t front_sent_ns, uint64_t node_ns, uint64_t front_received_ns) {
  ClockSample s;
  s.node_mono_ns = node_ns;
  const uint64_t lo = std::min(front_sent_ns, front_received_ns),
                 hi = std::max(front_sent_ns, front_received_ns);
  const uint64_t mid = lo + (hi - lo) / 2;
  s.offset_ns = static_cast<int64_t>(node_ns - mid);
  s.uncertainty_ns = (hi - lo + 1) / 2;
  return s;
}

std::optional<ClockSample> best_sample(const std::vector<ClockSample>& samples) {
  if (samples.empty()) return std::nullopt;
  return *std::min_element(samples.begin(), samples.end(), [](const ClockSample& a, const ClockSample& b) {
    return a.uncertainty_ns < b.uncertainty_ns;
  });
}

void EventReader::feed(std::string_view bytes) {
  // Drop what was consumed before growing: the buffer holds at most one
  // event (a file) and a bit.
  if (pos_ > 0 && pos_ * 2 >= buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::optional<EventReader::Event> EventReader::next() {
  size_t nl = buf_.find('\n', pos_);
  if (nl == std::string::npos) return std::nullopt;
  std::string_view line(buf_.data() + pos_, nl - pos_);
  Event e;
  if (!line.empty() && line.front() == '{' && nlohmann::json::accept(line)) {
    auto size = payload_size(line);
    if (!size) {
      e.payload = std::string(line);  // announces an impossible file: shown, not trusted
    } else {
      if (buf_.size() - (nl + 1) < *size) return std::nullopt;  // the file is still coming
      e.json = std::string(line);
      e.payload = buf_.substr(nl + 1, *size);
      pos_ = nl + 1 + *size;
      return e;
    }
  } else {
    e.payload = std::string(line);
  }
  pos_ = nl + 1;
  return e;
}

std::optional<uint64_t> payload_size(std::string_view json_line) {
  auto j = nlohmann::json::parse(json_line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto ev = j.find("ev");
  if (ev == j.end() || !ev->is_string() || *ev != "file") return 0;
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_unsigned()) return std::nullopt;
  uint64_t n = size->get<uint64_t>();
  if (n > (uint64_t{1} << 32)) return std::nullopt;
  return n;
}

bool safe_relative_path(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view seg = path.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    start = end + 1;
  }
  return true;
}

Result<std::vector<std::string>> expand_node_list(std::string_view list) {
  std::vector<std::string> out;
  auto bad = [&] {
    return Error(Errc::kParse,
                 "cannot read the node list '" + std::string(list) + "' (scontrol show hostnames)");
  };
  size_t i = 0;
  while (i < list.size()) {
    size_t open = list.find('[', i), comma = list.find(',', i);
    if (comma != std::string_view::npos && (open == std::string_view::npos || comma < open)) {
      if (comma > i) out.emplace_back(list.substr(i, comma - i));
      i = comma + 1;
      continue;
    }
    if (open == std::string_view::npos) {
      out.emplace_back(list.substr(i));
      break;
    }
    size_t close = list.find(']', open);
    if (close == std::string_view::npos) return bad();
    std::string_view prefix = list.substr(i, open - i), inner = list.substr(open + 1, close - open - 1);
    size_t suffix_end = close + 1;
    while (suffix_end < list.size() && list[suffix_end] != ',') ++suffix_end;
    std::string_view suffix = list.substr(close + 1, suffix_end - close - 1);
    if (suffix.find('[') != std::string_view::npos) return bad();
    size_t s = 0;
    while (s <= inner.size()) {
      size_t e = inner.find(',', s);
      if (e == std::string_view::npos) e = inner.size();
      std::string_view part = inner.substr(s, e - s);
      size_t dash = part.find('-');
      std::string_view a = part.substr(0, dash),
                       b = dash == std::string_view::npos ? a : part.substr(dash + 1);
      auto lo = to_number<unsigned>(a), hi = to_number<unsigned>(b);
      if (!all_digits(a) || !all_digits(b) || !lo || !hi || *lo > *hi || *hi - *lo > 100000) return bad();
      for (unsigned n = *lo; n <= *hi; ++n) {
        std::string num = std::to_string(n);
        if (num.size() < a.size()) num.insert(0, a.size() - num.size(), '0');
        out.push_back(std::string(prefix) + num + std::string(suffix));
      }
      s = e + 1;
    }
    i = suffix_end + 1;
  }
  return out;
}

}  // namespace remora::cli::slurm
