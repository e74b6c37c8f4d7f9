# tests/perf.cmake: the small-GET hot path: the access log that it
# formats cheaply, and the --access-log off|FILE flag (test_server_accesslog:
# the real kcached).
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_server_accesslog
               ${CMAKE_CURRENT_LIST_DIR}/test_server_accesslog.c)
target_link_libraries(test_server_accesslog PRIVATE kc_testsrv
                      PkgConfig::CMOCKA PkgConfig::CURL)
add_test(NAME server_accesslog COMMAND test_server_accesslog)
