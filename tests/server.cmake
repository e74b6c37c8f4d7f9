# tests/server.cmake: kcached's integration tests, one binary per feature
# (test_server_<feature>.c, ctest server_<feature>: the real binary on a free
# loopback port, spoken to with libcurl) over kc_servertest (servertest.h),
# their shared helpers; and kc_testsrv (testsrv.h), the helper that starts
# kcached and speaks HTTP to it, for every module's integration tests.
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_library(kc_testsrv STATIC ${CMAKE_CURRENT_LIST_DIR}/testsrv.c)
target_include_directories(kc_testsrv PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(kc_testsrv PUBLIC KCACHED_BIN="$<TARGET_FILE:kcached>")
target_link_libraries(kc_testsrv PUBLIC kc_schema PkgConfig::CURL)
add_dependencies(kc_testsrv kcached)

add_library(kc_servertest STATIC ${CMAKE_CURRENT_LIST_DIR}/servertest.c)
target_link_libraries(kc_servertest PUBLIC kc_testsrv kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::JANSSON)

# blob: uploads, digests, limits, rot and the scrub; bundle: manifests,
# lookup, models; lease: leases; auth: the role matrix, token reload, TLS;
# ops: health, stats, metrics, restart, flags, logs, stop, timeouts.
foreach(feature blob bundle lease auth ops)
  add_executable(test_server_${feature}
                 ${CMAKE_CURRENT_LIST_DIR}/test_server_${feature}.c)
  target_link_libraries(test_server_${feature} PRIVATE kc_servertest)
  add_test(NAME server_${feature} COMMAND test_server_${feature})
endforeach()
# A few servers each, seconds here; the sanitizer build is slower.
set_tests_properties(server_blob server_bundle server_lease server_auth
                     server_ops PROPERTIES TIMEOUT 300)

# fetch: POST /v1/blobs/fetch, many blobs in one answer.
add_executable(test_server_fetch ${CMAKE_CURRENT_LIST_DIR}/test_server_fetch.c)
target_link_libraries(test_server_fetch PRIVATE kc_servertest PkgConfig::ZSTD)
add_test(NAME server_fetch COMMAND test_server_fetch)
set_tests_properties(server_fetch PROPERTIES TIMEOUT 300)
