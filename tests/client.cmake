# tests/client.cmake: libkcache and the kcache CLI (test_client, cmocka):
# unit tests, and end-to-end tests against the real kcached (kc_testsrv from
# tests/server.cmake) with real NVRTC builds of tests/kernels. NVRTC tests
# skip without the toolkit, and fail with CI=true.
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

add_executable(test_client ${CMAKE_CURRENT_LIST_DIR}/test_client.c)
# kc_gpu and libcurl are used here directly (kc_client keeps them PRIVATE).
target_link_libraries(test_client PRIVATE kc_client kc_gpu kc_testsrv
  PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::ZSTD Threads::Threads)
target_compile_definitions(test_client PRIVATE
  KC_TEST_KERNELS="${CMAKE_CURRENT_LIST_DIR}/kernels"
  KCACHE_BIN="$<TARGET_FILE:kcache>"
  KC_FAKE_NVRTC="$<TARGET_FILE:gpu_fake_nvrtc>")
add_dependencies(test_client kcache gpu_fake_nvrtc)
add_test(NAME client COMMAND test_client)
# A dozen NVRTC builds and a few servers; the sanitizer build is slower.
set_tests_properties(client PROPERTIES TIMEOUT 300)
