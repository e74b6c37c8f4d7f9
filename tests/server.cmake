# tests/server.cmake: kcached's integration tests (test_server: the real
# binary on a free loopback port, spoken to with libcurl) and kc_testsrv, the
# helper that starts it, for other modules' integration tests.
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_library(kc_testsrv STATIC ${CMAKE_CURRENT_LIST_DIR}/testsrv.c)
target_include_directories(kc_testsrv PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(kc_testsrv PUBLIC KCACHED_BIN="$<TARGET_FILE:kcached>")
target_link_libraries(kc_testsrv PUBLIC PkgConfig::CURL)
add_dependencies(kc_testsrv kcached)

add_executable(test_server ${CMAKE_CURRENT_LIST_DIR}/test_server.c)
target_compile_definitions(test_server PRIVATE KCACHED_BIN="$<TARGET_FILE:kcached>")
target_link_libraries(test_server PRIVATE kc_testsrv kc_schema PkgConfig::CMOCKA
                      PkgConfig::CURL PkgConfig::JANSSON)
add_test(NAME server COMMAND test_server)
# Starts a dozen servers; the sanitizer build is slower.
set_tests_properties(server PROPERTIES TIMEOUT 600)
