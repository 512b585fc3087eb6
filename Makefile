# Remora: top-level entry points. On a fresh Debian 12 machine (as root, or
# with sudo), `make demo` and `make test` install what is missing, configure,
# build and run.
#
#   make deps    install missing Debian packages (apt-get; nothing if all present)
#   make         configure and build into $(BUILD_DIR) (RelWithDebInfo)
#   make test    build, then run every test with ctest
#   make demo    build, then `remora attach` (the default tool) on the bundled sample service
#   make bench   build, then run remora-bench-call and remora-bench-attach and print their results
#   make format  clang-format every C/C++ source in place
#   make clean   remove the build trees
#
# Developer builds use the presets instead: cmake --preset dev (Debug,
# warnings as errors, sanitizers) then ctest --preset dev.

BUILD_DIR  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

DEB_PACKAGES := build-essential cmake pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
                libunwind-dev python3 python3-pytest binutils util-linux mount procps libseccomp-dev \
                libdw-dev libelf-dev libprotobuf-dev protobuf-compiler python3-protobuf nlohmann-json3-dev \
                zlib1g-dev musl-tools dwz libc6-dbg redis-server redis-tools nginx-light

.PHONY: all deps configure build test demo bench format clean

all: build

# apt-get runs only when a package is missing, and updates its lists first.
deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  echo "deps: installing$$missing"; \
	  $$sudo apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends $$missing; \
	fi

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j2

demo: build
	examples/sample-service/demo.sh $(BUILD_DIR)

bench: build
	$(BUILD_DIR)/bin/remora-bench-call
	$(BUILD_DIR)/bin/remora-bench-attach $(BUILD_DIR)/lib/libremora-agent.so $(BUILD_DIR)/lib/libremora-hook-tool-a.so

# clang-format is not a build dependency; install it to use this target.
format:
	@command -v clang-format >/dev/null || { echo "format: clang-format not found (apt-get install clang-format)"; exit 1; }
	git ls-files -z -- '*.cc' '*.h' '*.cpp' '*.hpp' '*.c' | xargs -0 -r clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-dev build-release
