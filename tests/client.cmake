# tests/client.cmake: libkcache and the kcache CLI (test_client, cmocka):
# unit tests, and end-to-end tests against the real kcached (kc_testsrv from
# tests/server.cmake) with real NVRTC builds of tests/kernels. NVRTC tests
# skip without the toolkit, and fail with CI=true.
#   client        test_client.c: libkcache and the CLI, unit and end to end
#   client_warm   test_client_warm.c: warm and get at their edges
#   client_materialize  test_client_materialize.c: file modes (the umask
#                 read, never set), --out directories, the offer back
#   suggest       test_suggest.c: the bucket suggestion's dynamic programme
#                 against brute force
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

# The CLI's warm and get at their edges (stalled and endless servers, --out
# files, a warm's threads and connections): tests/test_client_warm.c.
add_executable(test_client_warm ${CMAKE_CURRENT_LIST_DIR}/test_client_warm.c)
target_link_libraries(test_client_warm PRIVATE kc_client kc_testsrv
  PkgConfig::CMOCKA Threads::Threads)
target_compile_definitions(test_client_warm PRIVATE
  KCACHE_BIN="$<TARGET_FILE:kcache>")
# libkcache's threads are counted through pthread_create (a small warm
# must start none).
target_link_options(test_client_warm PRIVATE -Wl,--wrap=pthread_create)
add_dependencies(test_client_warm kcache kcached)
add_test(NAME client_warm COMMAND test_client_warm)
set_tests_properties(client_warm PROPERTIES TIMEOUT 300)

# What libkcache leaves on disk around --out, and the offer back of
# hit-local bundles: tests/test_client_materialize.c. umask(2) is counted
# through the wrap (the library must never set it).
add_executable(test_client_materialize
  ${CMAKE_CURRENT_LIST_DIR}/test_client_materialize.c)
target_link_libraries(test_client_materialize PRIVATE kc_client kc_testsrv
  PkgConfig::CMOCKA Threads::Threads)
target_link_options(test_client_materialize PRIVATE -Wl,--wrap=umask)
add_dependencies(test_client_materialize kcached)
add_test(NAME client_materialize COMMAND test_client_materialize)
set_tests_properties(client_materialize PROPERTIES TIMEOUT 120)

# ---- suggest ----
# The bucket suggestion's dynamic programme against brute force.
add_executable(test_suggest ${CMAKE_CURRENT_LIST_DIR}/test_suggest.c)
target_link_libraries(test_suggest PRIVATE kc_client PkgConfig::CMOCKA)
add_test(NAME suggest COMMAND test_suggest)
