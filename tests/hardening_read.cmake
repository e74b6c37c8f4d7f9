# tests/hardening_read.cmake: slow readers do not
# pin the store or exhaust its reader table; lookup answers are bounded;
# manifests have at most KC_MANIFEST_MAX_FILES files (test_server_slowread:
# the real kcached, the real store, the client library).
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_server_slowread
               ${CMAKE_CURRENT_LIST_DIR}/test_server_slowread.c)
target_link_libraries(test_server_slowread PRIVATE kc_servertest kc_client
                      kc_store PkgConfig::LMDB)
add_test(NAME server_slowread COMMAND test_server_slowread)
# Writes 340 MiB through a small store; slower under the sanitizers.
set_tests_properties(server_slowread PROPERTIES TIMEOUT 600)
