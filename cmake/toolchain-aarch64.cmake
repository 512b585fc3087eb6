# Cross toolchain for aarch64 Debian 12 hosts (issue 14): the GNU cross
# compilers (gcc/g++-aarch64-linux-gnu) and Debian's arm64 multiarch packages
# (libgtest-dev:arm64, libunwind-dev:arm64, libseccomp-dev:arm64 ...).
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake
#
# The result runs in the qemu-system-aarch64 guest of tests/aarch64 (the
# test programs that it builds cannot run here: qemu-user has no ptrace).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_ASM_COMPILER aarch64-linux-gnu-gcc)
# The multiarch triplet: find_library/find_package look in
# <prefix>/lib/aarch64-linux-gnu, where the :arm64 packages install, and
# src/attach names the loader's library directories by it.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Headers and libraries come from the cross prefix (libc6-dev-arm64-cross,
# libstdc++-12-dev-arm64-cross) and the multiarch directories (the :arm64
# packages) only; programs (cmake, python3, protoc) are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# No x86_64 library may satisfy a search: the host's own triplet directory
# and its unqualified /usr/lib hold amd64 objects.
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)

# pkg-config (libunwind-generic, libseccomp) answers for arm64.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# tests/aarch64: the cross build is the guest's.
set(REMORA_GUEST_SUITE ON CACHE BOOL "build the suites that run in the aarch64 guest (tests/aarch64)")
