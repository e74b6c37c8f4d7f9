add_executable(test_error test_error.c)
target_link_libraries(test_error PRIVATE kc_schema PkgConfig::CMOCKA)
add_test(NAME error COMMAND test_error)
