# The merge of a Slurm job's ranks (src/profile/merge.h, job.h): hand-made
# profiles rendered by the writers into a job directory, merged, and the
# merged files decoded by libprotobuf, zlib and check_merged.py (python3's
# protobuf).
#
#   cmake --build build -j2 --target profile_merge_test && ctest --test-dir build -R profile_merge_test
if(NOT TARGET remora_profile)
  message(STATUS "remora_profile not defined: the merge's tests are not built")
  return()
endif()
add_executable(profile_merge_test ${CMAKE_CURRENT_SOURCE_DIR}/merge_test.cc)
target_link_libraries(profile_merge_test PRIVATE remora_profile GTest::gtest GTest::gtest_main remora_warnings)
target_compile_definitions(profile_merge_test PRIVATE
  REMORA_CHECK_MERGED="${CMAKE_CURRENT_SOURCE_DIR}/check_merged.py"
  REMORA_PROTO_PYTHON_DIR="${REMORA_PROTO_PYTHON_DIR}"
  REMORA_PROTO_PYTHON="${REMORA_PROTO_PYTHON}")
add_dependencies(profile_merge_test remora_proto_python)
add_test(NAME profile_merge_test COMMAND profile_merge_test)
set_tests_properties(profile_merge_test PROPERTIES LABELS profile TIMEOUT 60)
