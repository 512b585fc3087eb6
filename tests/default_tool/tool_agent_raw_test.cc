// The default tool loaded by the real agent, in-process, checked on the raw
// records it leaves (profile.remora), decoded here with a few lines of
// protobuf wire format: no renderer (src/profile), no python. So it runs
// where those are not built, the aarch64 guest among them, and checks what
// is architecture-specific in the tool: the sampler's registers from the
// signal's ucontext, the unwinder past a leaf function (on aarch64 its
// return address is only in the link register), and the tracer's GOT
// patching of the program's PLT calls (read, write).
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "agent_entry.h"
#include "workload.h"

namespace fs = std::filesystem;

namespace {

// One field of a protobuf message: its number, wire type and value (the
// varint, or the bytes of a length-delimited field).
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;
  std::string_view bytes;
};

class WireReader {
 public:
  explicit WireReader(std::string_view msg) : p_(msg.data()), end_(msg.data() + msg.size()) {}
  // The next field; false at the end or on malformed input (then ok() is false).
  bool next(Field* f) {
    if (p_ == end_ || !ok_) return false;
    uint64_t key = varint();
    f->number = static_cast<uint32_t>(key >> 3);
    f->wire_type = static_cast<uint32_t>(key & 7);
    switch (f->wire_type) {
      case 0: f->varint = varint(); break;
      case 1: skip(8); break;
      case 5: skip(4); break;
      case 2: {
        uint64_t n = varint();
        if (!ok_ || n > static_cast<uint64_t>(end_ - p_)) return ok_ = false;
        f->bytes = std::string_view(p_, n);
        p_ += n;
        break;
      }
      default: return ok_ = false;
    }
    return ok_;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      auto b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok_ = false;
    return 0;
  }
  bool at_end() const { return p_ == end_; }
  bool ok() const { return ok_; }

 private:
  void skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n)
      ok_ = false;
    else
      p_ += n;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

// What the checks need of a Session (src/profile/proto/remora_raw.proto).
struct RawSession {
  std::vector<std::vector<uint64_t>> stacks;  // Session.stacks (15): Stack.pcs (1)
  std::map<uint64_t, uint64_t> weights;       // Session.stack_weights (16): stack (2) -> samples (3)
  std::map<std::string, uint64_t> calls;      // Session.func_stats (19): name (1) -> calls (2)
  uint64_t samples_total = 0;                 // 25
  uint64_t patched_slots = 0;                 // 29
  std::vector<std::string> warnings;          // 30
};

std::vector<uint64_t> stack_pcs(std::string_view msg, bool* ok) {
  std::vector<uint64_t> pcs;
  WireReader r(msg);
  Field f;
  while (r.next(&f)) {
    if (f.number != 1) continue;
    if (f.wire_type == 0) pcs.push_back(f.varint);
    if (f.wire_type != 2) continue;
    WireReader packed(f.bytes);
    while (!packed.at_end() && packed.ok()) pcs.push_back(packed.varint());
    *ok = *ok && packed.ok();
  }
  *ok = *ok && r.ok();
  return pcs;
}

bool decode_session(std::string_view msg, RawSession* s) {
  WireReader r(msg);
  Field f;
  bool ok = true;
  while (r.next(&f)) {
    if (f.number == 15 && f.wire_type == 2) s->stacks.push_back(stack_pcs(f.bytes, &ok));
    if (f.number == 19 && f.wire_type == 2) {
      WireReader fr(f.bytes);
      Field g;
      std::string name;
      uint64_t calls = 0;
      while (fr.next(&g)) {
        if (g.number == 1 && g.wire_type == 2) name = std::string(g.bytes);
        if (g.number == 2 && g.wire_type == 0) calls = g.varint;
      }
      ok = ok && fr.ok();
      s->calls[name] += calls;
    }
    if (f.number == 16 && f.wire_type == 2) {
      WireReader wr(f.bytes);
      Field g;
      uint64_t stack = 0, samples = 0;
      while (wr.next(&g)) {
        if (g.number == 2 && g.wire_type == 0) stack = g.varint;
        if (g.number == 3 && g.wire_type == 0) samples = g.varint;
      }
      ok = ok && wr.ok();
      s->weights[stack] += samples;
    }
    if (f.number == 25 && f.wire_type == 0) s->samples_total = f.varint;
    if (f.number == 29 && f.wire_type == 0) s->patched_slots = f.varint;
    if (f.number == 30 && f.wire_type == 2) s->warnings.emplace_back(f.bytes);
  }
  return ok && r.ok();
}

// A GOT slot the tool patched (remora_default_tool_debug_slots).
struct Slot {
  void** slot;
  void* original;
  void* wrapper;
  std::string function, object;
};

std::vector<Slot> patched_slots() {
  std::vector<Slot> out;
  // The agent loaded the tool RTLD_LOCAL: reach it through its own handle.
  void* tool = dlopen(REMORA_TOOL_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (tool == nullptr) return out;
  using Cb = void (*)(void*, void**, void*, void*, const char*, const char*);
  auto debug_slots = reinterpret_cast<int (*)(Cb, void*)>(dlsym(tool, "remora_default_tool_debug_slots"));
  if (debug_slots != nullptr)
    debug_slots(
        [](void* ctx, void** slot, void* original, void* wrapper, const char* fn, const char* obj) {
          static_cast<std::vector<Slot>*>(ctx)->push_back({slot, original, wrapper, fn, obj});
        },
        &out);
  dlclose(tool);
  return out;
}

// pread() is called from here only after the attach: with lazy binding (the
// default link) its GOT slot is still unresolved when the tool patches it,
// pointing into this program (aarch64: at PLT0; x86_64: at its PLT entry).
__attribute__((noinline)) ssize_t first_pread(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[16];
  ssize_t n = pread(fd, buf, sizeof buf, 0);
  close(fd);
  return n;
}

const void* object_of(uint64_t pc) {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0) return nullptr;
  return info.dli_fbase;
}

TEST(DefaultToolUnderAgentRaw, SamplesUnwindAndTracedCalls) {
  const AgentEntry agent(REMORA_AGENT_PATH);
  ASSERT_TRUE(agent.ok()) << agent.error;
  const auto agent_attach = agent.attach;
  const auto agent_detach = agent.detach;

  char tmpl[] = "/tmp/remora-tool-agent-raw-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, out = dir + "/out";
  Workload w(dir);
  w.start();
  auto env = env_buffer({{"REMORA_OUTPUT_PATH", out}, {"REMORA_SAMPLE_HZ", "499"}});
  ASSERT_EQ(agent_attach(env.data(), REMORA_TOOL_PATH), 0);
  const std::vector<Slot> slots = patched_slots();
  const Slot* lazy_pread = nullptr;
  for (const auto& sl : slots) {
    const bool pread_slot = sl.function == "pread" || sl.function == "__pread_chk";
    if (pread_slot && sl.object == "[main]" &&
        object_of(reinterpret_cast<uint64_t>(sl.original)) ==
            object_of(reinterpret_cast<uint64_t>(&first_pread)))
      lazy_pread = &sl;
  }
  if (lazy_pread == nullptr)
    printf(
        "      SKIPPED the lazy-binding check: pread's slot in this program was not unresolved at the "
        "attach (%zu slots patched; a -z now link binds every slot at start-up)\n",
        slots.size());
  EXPECT_EQ(first_pread(REMORA_TOOL_PATH), 16) << "pread through a slot patched while unresolved";
  // Until workload_hash has had CPU time to be sampled in (its thread's CPU
  // clock drives the timer) after the collector learnt its stack (a
  // thread's samples before its first drain, every 100 ms, have no stack
  // copy): at least 1 s, at most 15 s (an emulated CPU runs the workload
  // tens of times slower).
  const uint64_t rounds_before = w.hash_rounds();
  for (int i = 0; i < 750 && (i < 50 || w.hash_rounds() - rounds_before < 400); ++i) {
    w.feed_pipe();
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, nullptr);
  }
  // Every slot points at its wrapper, a lazy one that a resolution in
  // flight at the patch overwrote too (the collector patches it again).
  for (const auto& sl : slots) EXPECT_EQ(*sl.slot, sl.wrapper) << sl.function << " in " << sl.object;
  ASSERT_EQ(agent_detach(), 0);
  EXPECT_EQ(w.stop_and_check(), "") << "the workload's own results under the tool";
  // Detach put the lazy slot back: unresolved as it was, never the wrapper.
  if (lazy_pread != nullptr) {
    EXPECT_EQ(*lazy_pread->slot, lazy_pread->original);
  }

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(out))  // not the ...-latest link to it
    if (!e.is_symlink() && e.is_directory() && fs::exists(e.path() / "profile.remora"))
      files.push_back(e.path() / "profile.remora");
  ASSERT_EQ(files.size(), 1u) << "one session directory with raw records under " << out;
  std::ifstream in(files[0], std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  RawSession s;
  ASSERT_TRUE(decode_session(buf.str(), &s)) << files[0] << " is not a well-formed Session message";
  for (const auto& warning : s.warnings) printf("      tool warning: %s\n", warning.c_str());

  EXPECT_GT(s.samples_total, 0u) << "no sample was taken";
  // The hot leaf, workload_hash: its extent ends where the next function
  // of its file begins (they are laid out in source order).
  const auto hash_lo = reinterpret_cast<uint64_t>(&workload_hash);
  const auto next = reinterpret_cast<uint64_t>(&workload_spin_for_ms);
  const uint64_t hash_hi = next > hash_lo ? next : hash_lo + 256;
  size_t leaf = 0, unwound = 0;
  for (const auto& pcs : s.stacks) {
    if (pcs.empty() || pcs[0] < hash_lo || pcs[0] >= hash_hi) continue;
    ++leaf;
    // Its caller is the workload's loop, in this program: a return address
    // the unwinder could only find through the leaf's return-address
    // register (aarch64's x30) or its stack slot (x86_64).
    if (pcs.size() >= 2 && object_of(pcs[1]) == object_of(hash_lo)) ++unwound;
  }
  printf(
      "      %zu stacks, %zu with workload_hash as the leaf, %zu of them unwound into its caller; "
      "%llu samples\n",
      s.stacks.size(), leaf, unwound, static_cast<unsigned long long>(s.samples_total));
  EXPECT_GT(leaf, 0u) << "no stack has workload_hash as its leaf";
  EXPECT_GT(unwound, 0u) << "no workload_hash stack was unwound into its caller";
  {
    // What the unwinder made of them, as offsets into their objects.
    for (size_t k = 0; k < s.stacks.size(); ++k) {
      const auto& pcs = s.stacks[k];
      if (pcs.empty() || pcs[0] < hash_lo || pcs[0] >= hash_hi) continue;
      std::string line = " (" + std::to_string(s.weights[k]) + " samples)";
      for (uint64_t pc : pcs) {
        Dl_info info{};
        const bool known = dladdr(reinterpret_cast<void*>(pc), &info) != 0;
        char one[256];
        snprintf(
            one, sizeof one, " %s+0x%llx", known && info.dli_fname ? info.dli_fname : "?",
            static_cast<unsigned long long>(known ? pc - reinterpret_cast<uint64_t>(info.dli_fbase) : pc));
        line += one;
      }
      printf("      workload_hash stack:%s\n", line.c_str());
    }
  }

  EXPECT_GT(s.patched_slots, 0u) << "no GOT slot was patched";
  EXPECT_GT(s.calls["read"], 0u) << "read() through the program's PLT was not traced";
  EXPECT_GT(s.calls["write"], 0u) << "write() through the program's PLT was not traced";
  if (lazy_pread != nullptr) {
    EXPECT_GT(s.calls["pread"], 0u) << "pread() through a lazily bound slot was not traced";
  }
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
