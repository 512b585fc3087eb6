# Remora: top-level entry points. On a fresh Debian 12 machine (as root, or
# with sudo), `make demo` and `make test` install what is missing, configure,
# build and run.
#
#   make deps    install the Debian packages the build and the demo need (apt-get; nothing if all present)
#   make test-deps  the same, and what only the tests need (their real programs, Slurm, the arm64 guest)
#   make         configure and build into $(BUILD_DIR) (RelWithDebInfo)
#   make test    build (and the aarch64 cross build), then run every test with ctest,
#                the aarch64 guest's suites included (aarch64.*)
#   make test-aarch64  cross-build $(AARCH64_BUILD_DIR), boot it in qemu-system-aarch64, run and
#                report its suites (tests/aarch64/run_guest.py)
#   make demo    build, then `remora attach` (the default tool) on the bundled sample service
#   make bench   build, then run remora-bench-call and remora-bench-attach and print their results
#   make bench-aarch64  the same two inside the aarch64 guest
#   make soak    build, then bench/soak_real.py: 1,000 attach/detach cycles and 1,000 with --unload
#                on redis, PostgreSQL, nginx, a JVM, node and python3 under load (installs
#                $(SOAK_PACKAGES) first; SOAK_ARGS="--cycles 20 --programs redis,nginx" runs it small)
#   make format  clang-format every C/C++ source in place
#   make clean   remove the build trees
#
# Developer builds use the presets instead: cmake --preset dev (Debug,
# warnings as errors, sanitizers) then ctest --preset dev.

BUILD_DIR  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

# What the build and `make demo` need...
BUILD_PACKAGES := build-essential cmake pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
                  libunwind-dev python3 binutils procps libseccomp-dev libdw-dev libelf-dev libprotobuf-dev \
                  protobuf-compiler python3-protobuf nlohmann-json3-dev zlib1g-dev
# ...and what only the tests need: their real programs, the container,
# Slurm and MPI fixtures, and the emulated arm64 guest with its cross
# toolchain (`make test` installs both lists; `make demo` the first only).
TEST_PACKAGES := python3-pytest util-linux mount musl-tools dwz libc6-dbg redis-server redis-tools nginx-light \
                 openjdk-17-jdk-headless qemu-system-arm gcc-aarch64-linux-gnu g++-aarch64-linux-gnu \
                 libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross slurm-wlm munge mpich libmpich-dev podman runc
# The soak's programs (make soak), apart from the lists above: make test and
# make demo do without PostgreSQL.
SOAK_PACKAGES := postgresql redis-server redis-tools nginx-light openjdk-17-jdk-headless nodejs python3
# The aarch64 cross build's libraries, from Debian's arm64 architecture
# (multiarch): apt must know arm64 for them, and for the guest's kernel and
# busybox, which tests/aarch64/run_guest.py fetches with apt-get download.
ARM64_PACKAGES := libgtest-dev:arm64 libgmock-dev:arm64 libunwind-dev:arm64 libseccomp-dev:arm64 \
                  liblzma-dev:arm64

AARCH64_BUILD_DIR ?= build-aarch64
# Release: no debug info to compile or to carry into the guest's initramfs
# (the test programs keep their own -O2 -g).
AARCH64_BUILD_TYPE ?= Release

.PHONY: all deps test-deps install-packages configure build test demo bench format clean aarch64-configure \
        aarch64-build test-aarch64 bench-aarch64 soak-deps soak

all: build

# apt-get runs only when a package is missing, and updates its lists first.
# A name without :arch means the native one (or all): with arm64 added, plain
# `dpkg -s libgtest-dev` no longer answers for amd64 alone.
deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(BUILD_PACKAGES)"

test-deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(BUILD_PACKAGES) $(TEST_PACKAGES) $(ARM64_PACKAGES)"

install-packages:
	@missing=""; native=$$(dpkg --print-architecture); \
	for p in $(PACKAGES); do \
	  case $$p in *:*) want=$${p##*:};; *) want=$$native;; esac; \
	  dpkg-query -W -f='$${db:Status-Abbrev} $${Architecture}\n' $$p 2>/dev/null | grep -Eq "^ii +($$want|all)$$" || \
	    missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  echo "deps: installing$$missing"; \
	  case "$$missing" in *:arm64*) \
	    if ! dpkg --print-foreign-architectures | grep -qx arm64; then \
	      echo "deps: adding the arm64 architecture (dpkg --add-architecture arm64)"; \
	      $$sudo dpkg --add-architecture arm64 || exit 1; \
	    fi;; \
	  esac; \
	  $$sudo apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends $$missing; \
	fi

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DREMORA_AARCH64_BUILD_DIR=$(abspath $(AARCH64_BUILD_DIR))

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The aarch64 suites run in a qemu-system-aarch64 guest (qemu-user cannot
# ptrace): the host's ctest boots it (aarch64.guest) once this is built.
aarch64-configure: test-deps
	cmake -S . -B $(AARCH64_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(AARCH64_BUILD_TYPE) \
	  -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/toolchain-aarch64.cmake

aarch64-build: aarch64-configure
	cmake --build $(AARCH64_BUILD_DIR) -j$(JOBS)

test-aarch64: aarch64-build
	/usr/bin/python3 -B tests/aarch64/run_guest.py --build-dir $(AARCH64_BUILD_DIR)

# remora-bench-call and remora-bench-attach inside the guest (emulated:
# compare ratios to the guest's own ptrace floor, not absolute times).
bench-aarch64: aarch64-build
	cmake --build $(AARCH64_BUILD_DIR) -j$(JOBS) --target remora-bench-call remora-bench-attach
	/usr/bin/python3 -B tests/aarch64/run_guest.py --build-dir $(AARCH64_BUILD_DIR) \
	  --results $(AARCH64_BUILD_DIR)/guest/bench \
	  --add-suite "bench_call 900 $(abspath $(AARCH64_BUILD_DIR))/bin/remora-bench-call -n 300 --warmup 20" \
	  --add-suite "bench_attach 900 $(abspath $(AARCH64_BUILD_DIR))/bin/remora-bench-attach \
	    $(abspath $(AARCH64_BUILD_DIR))/lib/libremora-agent.so $(abspath $(AARCH64_BUILD_DIR))/lib/libremora-hook-tool-a.so 5" \
	  --only bench_call --only bench_attach

test: test-deps build aarch64-build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j2

demo: build
	examples/sample-service/demo.sh $(BUILD_DIR)

bench: build
	$(BUILD_DIR)/bin/remora-bench-call
	$(BUILD_DIR)/bin/remora-bench-attach $(BUILD_DIR)/lib/libremora-agent.so $(BUILD_DIR)/lib/libremora-hook-tool-a.so

# As deps does, for the soak's own list (native packages only).
soak-deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(SOAK_PACKAGES)"

# Not part of make test: 2.5 hours on 2 CPUs shared with other builds, each
# cycle 0.1-2 s (docs/benchmarks.md); SOAK_ARGS="--cycles 100" for a shorter
# one. As root: PostgreSQL's cluster runs as the postgres user.
SOAK_ARGS ?=
soak: build soak-deps
	/usr/bin/python3 -B bench/soak_real.py --remora $(BUILD_DIR)/bin/remora --work $(abspath $(BUILD_DIR))/bench/soak \
	  $(SOAK_ARGS)

# clang-format is not a build dependency; install it to use this target.
format:
	@command -v clang-format >/dev/null || { echo "format: clang-format not found (apt-get install clang-format)"; exit 1; }
	git ls-files -z -- '*.cc' '*.h' '*.cpp' '*.hpp' '*.c' | xargs -0 -r clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-dev build-release $(AARCH64_BUILD_DIR)
