# The writers (src/profile/writers.h) from hand-made profiles: each output is
# written into a temporary directory and read back by check_formats.py with
# python3's own strict readers (json, xml.etree, csv, gzip) and the modules
# protoc generates from the project's .proto files (python3-protobuf).
#
#   cmake --build build -j2 --target profile_writers_test && ctest --test-dir build -R profile.writers
if(NOT TARGET remora_profile)
  message(STATUS "remora_profile not defined: the writers' tests are not built")
  return()
endif()
add_executable(profile_writers_test ${CMAKE_CURRENT_SOURCE_DIR}/writers_test.cc)
target_link_libraries(profile_writers_test PRIVATE remora_profile GTest::gtest GTest::gtest_main remora_warnings)
target_compile_definitions(profile_writers_test PRIVATE
  REMORA_CHECK_FORMATS="${CMAKE_CURRENT_SOURCE_DIR}/check_formats.py"
  REMORA_PROTO_PYTHON_DIR="${REMORA_PROTO_PYTHON_DIR}")
add_dependencies(profile_writers_test remora_proto_python)
gtest_add_tests(TARGET profile_writers_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/writers_test.cc
  TEST_PREFIX "profile.writers." TEST_LIST _writers_tests)
set_tests_properties(${_writers_tests} PROPERTIES TIMEOUT 60 LABELS profile)
