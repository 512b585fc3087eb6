# The symboliser's tests (src/profile/symbolize.h), label "profile": real
# processes running a fixture library built -O2 -g, plus copies of it made
# here with the system's objcopy, as distributions ship them:
#   symfx/full/libsymfx.so     the build with its DWARF
#   symfx/bid/libsymfx.so      stripped (--strip-debug); its debug file at
#                              symfx/debug/.build-id/xx/rest.debug
#   symfx/link/libsymfx.so     stripped, with a .gnu_debuglink to the
#                              libsymfx.debug next to it
#   symfx/nolink/libsymfx.so   a build without a build ID, stripped, its
#                              .gnu_debuglink's CRC the only proof; next to
#                              it, libsymfx.debug
#   symfx/badcrc/libsymfx.so   the same, but its libsymfx.debug replaced by
#                              another build's (the CRC differs)
#   symfx/altbid/libsymfx.so   the other build, stripped; its debug file in
#                              symfx/altdebug/.build-id/xx/rest.debug
#   symfx/dwzdebug/            the main build's debug file after dwz (when
#                              dwz is installed), with its common file
#   symfx/alt/libsymfx.so      another build (own build ID, the noinline
#                              function renamed): the replaced file, and the
#                              container's copy
# Included from tests/profile/CMakeLists.txt.

if(NOT TARGET remora_profile)
  return()
endif()

set(_symfx ${CMAKE_CURRENT_BINARY_DIR}/symfx)
# A fixed build ID, so that the build-id path is known here.
set(_symfx_build_id 5ef1c0de0b5e55ed5ca1ab1e0ddba11c0ffee042)
string(SUBSTRING ${_symfx_build_id} 0 2 _bid_dir)
string(SUBSTRING ${_symfx_build_id} 2 -1 _bid_rest)
set(_symfx_alt_build_id a17b0000c0ffee5ef1c0de0b5e55ed5ca1ab1e01)
string(SUBSTRING ${_symfx_alt_build_id} 0 2 _alt_bid_dir)
string(SUBSTRING ${_symfx_alt_build_id} 2 -1 _alt_bid_rest)

foreach(v full alt nobid)
  add_library(remora_symfx_${v} SHARED ${CMAKE_CURRENT_SOURCE_DIR}/sym_fixture_lib.cc)
  # Fixed flags whatever the build type: the tests expect an inline chain.
  target_compile_options(remora_symfx_${v} PRIVATE -O2 -g)
  target_link_libraries(remora_symfx_${v} PRIVATE remora_warnings_only)
  set_target_properties(remora_symfx_${v} PROPERTIES OUTPUT_NAME symfx LIBRARY_OUTPUT_DIRECTORY ${_symfx}/${v})
endforeach()
target_link_options(remora_symfx_full PRIVATE -Wl,--build-id=0x${_symfx_build_id})
target_compile_definitions(remora_symfx_alt PRIVATE SYMFX_ALT)
target_link_options(remora_symfx_alt PRIVATE -Wl,--build-id=0x${_symfx_alt_build_id})
target_link_options(remora_symfx_nobid PRIVATE -Wl,--build-id=none)

find_program(REMORA_OBJCOPY objcopy REQUIRED)
# The custom command runs in symfx/link, which must exist before it starts.
file(MAKE_DIRECTORY ${_symfx}/bid ${_symfx}/debug/.build-id/${_bid_dir} ${_symfx}/link)
set(_symfx_copies ${_symfx}/bid/libsymfx.so ${_symfx}/debug/.build-id/${_bid_dir}/${_bid_rest}.debug
                  ${_symfx}/link/libsymfx.so ${_symfx}/link/libsymfx.debug)
add_custom_command(
  OUTPUT ${_symfx_copies}
  COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_full>
          ${_symfx}/debug/.build-id/${_bid_dir}/${_bid_rest}.debug
  COMMAND ${REMORA_OBJCOPY} --strip-debug $<TARGET_FILE:remora_symfx_full> ${_symfx}/bid/libsymfx.so
  COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_full> ${_symfx}/link/libsymfx.debug
  # --add-gnu-debuglink reads the debug file (for its CRC) from the current directory.
  COMMAND ${REMORA_OBJCOPY} --strip-debug --add-gnu-debuglink=libsymfx.debug $<TARGET_FILE:remora_symfx_full>
          ${_symfx}/link/libsymfx.so
  WORKING_DIRECTORY ${_symfx}/link
  DEPENDS remora_symfx_full
  COMMENT "symboliser fixtures: stripped copies with separate debug info"
  VERBATIM)
# The other build stripped, its debug file in a tree laid out as
# /usr/lib/debug is: the container's own debug files.
set(_symfx_alt_copies ${_symfx}/altbid/libsymfx.so
                      ${_symfx}/altdebug/.build-id/${_alt_bid_dir}/${_alt_bid_rest}.debug)
add_custom_command(
  OUTPUT ${_symfx_alt_copies}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_symfx}/altbid ${_symfx}/altdebug/.build-id/${_alt_bid_dir}
  COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_alt>
          ${_symfx}/altdebug/.build-id/${_alt_bid_dir}/${_alt_bid_rest}.debug
  COMMAND ${REMORA_OBJCOPY} --strip-debug $<TARGET_FILE:remora_symfx_alt> ${_symfx}/altbid/libsymfx.so
  DEPENDS remora_symfx_alt
  COMMENT "symboliser fixtures: the other build, stripped"
  VERBATIM)
set(_symfx_crc_copies ${_symfx}/nolink/libsymfx.so ${_symfx}/nolink/libsymfx.debug ${_symfx}/badcrc/libsymfx.so
                      ${_symfx}/badcrc/libsymfx.debug)
file(MAKE_DIRECTORY ${_symfx}/nolink ${_symfx}/badcrc)
foreach(d nolink badcrc)
  set(_replace)
  if(d STREQUAL badcrc)
    # Another build's debug file under the linked name, after the CRC was taken.
    set(_replace COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_alt>
                 ${_symfx}/${d}/libsymfx.debug)
  endif()
  add_custom_command(
    OUTPUT ${_symfx}/${d}/libsymfx.so ${_symfx}/${d}/libsymfx.debug
    COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_nobid> ${_symfx}/${d}/libsymfx.debug
    COMMAND ${REMORA_OBJCOPY} --strip-debug --add-gnu-debuglink=libsymfx.debug $<TARGET_FILE:remora_symfx_nobid>
            ${_symfx}/${d}/libsymfx.so
    ${_replace}
    WORKING_DIRECTORY ${_symfx}/${d}
    DEPENDS remora_symfx_nobid remora_symfx_alt
    COMMENT "symboliser fixtures: a stripped copy without a build ID (${d})"
    VERBATIM)
endforeach()
# dwz, as Debian's -dbgsym packages are built: the main build's debug file
# shares DIEs (the inline functions' abstract instances) with the other
# build's through a common file its .gnu_debugaltlink names.
find_program(REMORA_DWZ dwz)
set(_symfx_dwz_copies)
if(REMORA_DWZ)
  set(_symfx_dwz_copies ${_symfx}/dwzdebug/.build-id/${_bid_dir}/${_bid_rest}.debug ${_symfx}/dwzdebug/common.debug)
  file(MAKE_DIRECTORY ${_symfx}/dwzwork ${_symfx}/dwzdebug/.build-id/${_bid_dir})
  add_custom_command(
    OUTPUT ${_symfx_dwz_copies}
    COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_full> a.debug
    COMMAND ${REMORA_OBJCOPY} --only-keep-debug $<TARGET_FILE:remora_symfx_alt> b.debug
    COMMAND ${REMORA_DWZ} -m ${_symfx}/dwzdebug/common.debug -M ${_symfx}/dwzdebug/common.debug a.debug b.debug
    COMMAND ${CMAKE_COMMAND} -E copy a.debug ${_symfx}/dwzdebug/.build-id/${_bid_dir}/${_bid_rest}.debug
    WORKING_DIRECTORY ${_symfx}/dwzwork
    DEPENDS remora_symfx_full remora_symfx_alt
    COMMENT "symboliser fixtures: debug files compressed with dwz"
    VERBATIM)
endif()
add_custom_target(remora_symfx_copies DEPENDS ${_symfx_copies} ${_symfx_alt_copies} ${_symfx_crc_copies}
                                              ${_symfx_dwz_copies})

add_executable(remora_sym_fixture ${CMAKE_CURRENT_SOURCE_DIR}/sym_fixture.c)
target_compile_options(remora_sym_fixture PRIVATE -O2 -g)
# Plain C: remora_warnings_only carries C++-only options.
target_compile_options(remora_sym_fixture PRIVATE -Wall -Wextra $<$<BOOL:${REMORA_WERROR}>:-Werror>)
target_link_libraries(remora_sym_fixture PRIVATE Threads::Threads ${CMAKE_DL_LIBS})

add_executable(symbolize_test ${CMAKE_CURRENT_SOURCE_DIR}/symbolize_test.cc)
target_link_libraries(symbolize_test PRIVATE remora_profile remora_test_harness GTest::gtest GTest::gtest_main
                                             remora_warnings)
add_dependencies(symbolize_test remora_symfx_full remora_symfx_alt remora_symfx_nobid remora_symfx_copies
                 remora_sym_fixture)
target_compile_definitions(symbolize_test PRIVATE
  SYMFX_PROGRAM="$<TARGET_FILE:remora_sym_fixture>"
  SYMFX_DIR="${_symfx}"
  SYMFX_SOURCE="${CMAKE_CURRENT_SOURCE_DIR}/sym_fixture_lib.cc"
  SYMFX_BUILD_ID="${_symfx_build_id}"
  SYMFX_ALT_BUILD_ID="${_symfx_alt_build_id}"
  SYMFX_DWZ=$<BOOL:${REMORA_DWZ}>)
gtest_add_tests(TARGET symbolize_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/symbolize_test.cc
                TEST_PREFIX "profile." TEST_LIST _symbolize_tests)
set_tests_properties(${_symbolize_tests} PROPERTIES TIMEOUT 60 LABELS profile)
