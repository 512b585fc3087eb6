# The raw records' round trip: the tool's own encoder
# (tools/default/raw_records.cc) -> libprotobuf and python3's protobuf
# readers (src/profile/records.cc, remora_raw_pb2).
if(TARGET remora_profile)
  add_executable(profile_records_test ${CMAKE_CURRENT_SOURCE_DIR}/records_test.cc
    ${PROJECT_SOURCE_DIR}/tools/default/raw_records.cc)
  target_include_directories(profile_records_test PRIVATE ${PROJECT_SOURCE_DIR}/tools/default)
  target_compile_definitions(profile_records_test PRIVATE REMORA_PROTO_PYTHON_DIR="${REMORA_PROTO_PYTHON_DIR}"
    REMORA_PROTO_PYTHON="${REMORA_PROTO_PYTHON}")
  target_link_libraries(profile_records_test PRIVATE remora_profile GTest::gtest GTest::gtest_main remora_warnings
    ${CMAKE_DL_LIBS})
  add_test(NAME profile_records_test COMMAND profile_records_test)
  set_tests_properties(profile_records_test PROPERTIES LABELS profile TIMEOUT 60)
endif()
