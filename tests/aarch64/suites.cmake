# The suites that run inside the aarch64 guest (tests/aarch64/CMakeLists.txt):
# one CMake list, read by both builds. The guest build (build-aarch64) puts
# those of them that exist as targets there into the guest's manifest; the
# host build registers one ctest entry aarch64.<suite> for each, which skips
# (saying why) while its suite is not built for aarch64 yet. Add a suite here
# when its port lands.
set(REMORA_GUEST_SUITES
  # Below the engine: they build today.
  base_test
  procfs_test
  elf_test
  arch_test
  aarch64_frame_test
  x86_64_xstate_test
  x86_64_frame_test
  remote_targets_test
  default_tool_unit_test
  # The default tool's unwinder (REMORA_TOOL_PORTED=ON).
  default_tool_unwind_test
  # The engine and above (REMORA_ENGINE_PORTED=ON; attach_test also
  # REMORA_TOOL_PORTED=ON). attach_test starts
  # /bin/sh, /usr/bin/env and /usr/bin/unshare: busybox's, in the guest.
  scratch_test
  seccomp_test
  remote_hostile_test
  remote_errors_test
  remote_lookup_test
  remote_controller_death_test
  remote_scratch_reclaim_test
  remote_musl_refusal_test
  control_test
  default_tool_agent_raw_test
  attach_test
  remora_capi_test
  remora_capi_rocattach_test
  remora_capi_c_headers_test
  # Needs the remora CLI, which the guest build leaves out (it renders
  # through src/profile): skipped, saying so, until the CLI builds without it.
  seccomp_engine_test)

# Each suite's deadline in the guest, in seconds (default 300): TCG runs
# 10 to 50 times slower than the host, and the init kills the suite's whole
# process group when it is reached. These are backstops for a guest up to
# 50 times slower (guest_init.c, kSuiteDeadlineScale): the init measures the
# guest against its host at boot and stretches them on a slower one, and
# passes the ratio to every suite (REMORA_TEST_TIME_SCALE), which stretches
# the tests' own deadlines and watchdogs (tests/harness/harness.h).
set(REMORA_GUEST_DEFAULT_TIMEOUT 300)
set(REMORA_GUEST_TIMEOUT_remote_hostile_test 900)
set(REMORA_GUEST_TIMEOUT_attach_test 1200)
set(REMORA_GUEST_TIMEOUT_remote_controller_death_test 600)
set(REMORA_GUEST_TIMEOUT_remote_scratch_reclaim_test 600)

# Environment a suite needs (as its host ctest entry sets it), KEY=VALUE
# items; generator expressions allowed (evaluated in the guest build).
# Fewer load/unload cycles per hostile target (tests/attach/unload_test.cc;
# 20 on the host): there remora_target_threads64's 64 threads alone keep both
# vCPUs busy (each wakes every 1-4 ms for work TCG runs some 70 times
# slower), so every process of the guest, the controller included, gets a
# fraction of a CPU and one cycle takes 2-5 s. Five cycles still show the
# mappings settle after the first.
# Likewise 60 attach/detach cycles per hostile target (300 on the host:
# tests/attach/hostile_cycles_test.cc), where remora_target_threads64 took
# 258 ms a cycle in the guest (78 s of its run at 300).
set(REMORA_GUEST_ENV_attach_test "REMORA_UNLOAD_CYCLES=5" "REMORA_ATTACH_CYCLES=60")
# The two longest suites run a quarter of the host's work in the guest (the
# host keeps its full counts): remote_hostile_test 250 calls per thread of
# every hostile target (1000 on the host; 160 s of a 2-vCPU TCG guest at
# 1000), remote_controller_death_test 50 killed controllers per target (200
# on the host; 131 s at 200). What the guest is for, the aarch64 port of
# every path (each register file restored, the cure after every kind of
# death), is reached within the first tens of calls and kills; the counts
# on the host are what hunts rare interleavings.
set(REMORA_GUEST_ENV_remote_hostile_test "REMORA_HOSTILE_CALLS=250")
set(REMORA_GUEST_ENV_remote_controller_death_test "REMORA_DEATH_ROUNDS=50")
# Likewise the callers killed mid-call in remote_scratch_reclaim_test: 12 in
# the guest (50 on the host; 35 s of the guest's run at 50).
set(REMORA_GUEST_ENV_remote_scratch_reclaim_test "REMORA_SCRATCH_KILLS=12")
set(REMORA_GUEST_ENV_remora_capi_test "REMORA_AGENT_PATH=$<TARGET_FILE:remora-agent>")
set(REMORA_GUEST_ENV_remora_capi_rocattach_test "REMORA_AGENT_PATH=$<TARGET_FILE:remora-agent>")
set(REMORA_GUEST_ENV_remora_capi_c_headers_test "REMORA_AGENT_PATH=$<TARGET_FILE:remora-agent>")
