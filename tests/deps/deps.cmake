# The deps tests (see CMakeLists.txt here). Registered once, from whichever
# directory includes this first.
get_property(_remora_deps_done GLOBAL PROPERTY REMORA_DEPS_TESTS_ADDED)
if(_remora_deps_done)
  return()
endif()
set_property(GLOBAL PROPERTY REMORA_DEPS_TESTS_ADDED TRUE)
set(_remora_deps_dir ${CMAKE_CURRENT_LIST_DIR})

find_package(Python3 COMPONENTS Interpreter)
find_program(REMORA_READELF readelf)
if(NOT Python3_Interpreter_FOUND OR NOT REMORA_READELF)
  message(STATUS "python3 or readelf not found: the deps checks are not registered")
  return()
endif()
if(NOT TARGET remora-agent OR NOT TARGET remora-tool)
  message(STATUS "remora-agent or remora-tool not built: the deps checks are not registered")
  return()
endif()

set(_remora_deps_check ${Python3_EXECUTABLE} -B ${_remora_deps_dir}/check_deps.py)
add_test(NAME deps_agent COMMAND ${_remora_deps_check} $<TARGET_FILE:remora-agent> --export "remora_agent_.*")
# libunwind stays NEEDED unless the tool was built with PIC static archives
# of it (REMORA_STATIC_LIBUNWIND, tools/default/CMakeLists.txt): let through
# by name, and printed as such.
get_property(_remora_static_unwind GLOBAL PROPERTY REMORA_TOOL_STATIC_LIBUNWIND)
set(_remora_unwind_allow "")
if(NOT _remora_static_unwind)
  set(_remora_unwind_allow --allow-needed
    "libunwind-${CMAKE_SYSTEM_PROCESSOR}.so.8=Debian's libunwind archives are not PIC: configure with REMORA_STATIC_LIBUNWIND=ON and PIC archives to link it in")
endif()
add_test(NAME deps_tool COMMAND ${_remora_deps_check} $<TARGET_FILE:remora-tool>
  --export "remora_configure" --export "remora_configure_attach" --export "remora_tool_quiesce"
  --export "remora_tool_release" --export "remora_default_tool_.*"
  ${_remora_unwind_allow})

add_library(remora_deps_bad SHARED ${_remora_deps_dir}/bad_lib.cc)
add_test(NAME deps_self_test COMMAND ${_remora_deps_check} $<TARGET_FILE:remora_deps_bad>
  --export "deps_bad_entry"
  --expect-fail "NEEDED libstdc++.so.6" --expect-fail "symbol(s) of libstdc++"
  --expect-fail "exports deps_bad_not_an_entry_point" --expect-fail "above the stated minimum")
set_tests_properties(deps_agent deps_tool deps_self_test PROPERTIES LABELS deps TIMEOUT 60)
