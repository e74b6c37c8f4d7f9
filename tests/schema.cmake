# tests/schema.cmake: schema/ (and the error codes it carries):
#   error              test_error.c: the error table (message, wire code,
#                      HTTP status per code; numbers never move)
#   schema             test_schema.c (cmocka) over the good/bad examples of
#                      tests/schema_examples/ and the test vectors
#   schema_jsonschema  check_json_schema.py: the same examples through the
#                      JSON Schemas; both sides must agree
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

add_executable(test_schema ${CMAKE_CURRENT_LIST_DIR}/test_schema.c)
target_link_libraries(test_schema PRIVATE kc_schema PkgConfig::CMOCKA)
# The vectors and examples are read from the source tree.
target_compile_definitions(test_schema PRIVATE
  KC_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}")
add_test(NAME schema COMMAND test_schema ${CMAKE_CURRENT_LIST_DIR})

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME schema_jsonschema
    COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/check_json_schema.py
            ${PROJECT_SOURCE_DIR}/schema ${CMAKE_CURRENT_LIST_DIR}/schema_examples)
  # 77: python3-jsonschema is not installed (a failure when CI=true)
  set_tests_properties(schema_jsonschema PROPERTIES SKIP_RETURN_CODE 77)
endif()

add_executable(test_error test_error.c)
target_link_libraries(test_error PRIVATE kc_schema PkgConfig::CMOCKA)
add_test(NAME error COMMAND test_error)
