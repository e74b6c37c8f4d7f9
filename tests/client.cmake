# tests/client.cmake: libkcache and the kcache CLI, one cmocka binary per
# area (test_client_<area>.c, ctest client_<area>) over kc_clienttest
# (clienttest.h: the fixture, the CLI runners, a fake kcached, helpers):
# unit tests, and end-to-end tests against the real kcached (kc_testsrv from
# tests/server.cmake) with real NVRTC builds of tests/kernels. NVRTC tests
# skip without the toolkit, and fail with CI=true.
#   client_keys     keys, the local cache, lookup split, materialize
#   client_cli      the CLI's usage errors, key, manifests, env and flags,
#                   verify
#   client_build    warm without a server; end to end against kcached
#                   (cold then remote, leases, deadline, tokens, HTTPS)
#   client_faults   a fake kcached that lies, stalls, resets, or answers
#                   garbage
#   client_hostile  an adversarial pass: cached files, floods, drips,
#                   lease squatters, symlinks
#   client_models   demand feedback, suggest, purge and models by name
#   client_fetch    a fetch's file-system cost, POST /v1/blobs/fetch, zstd
#   client_compat   the compatible-arch fallback (hit-compat)
#   client_warm     warm and get at their edges (stalled and endless
#                   servers, --out files, a warm's threads and connections)
#   client_materialize  file modes (the umask read, never set), --out
#                   directories, the offer back
#   suggest         test_suggest.c: the bucket suggestion's dynamic
#                   programme against brute force
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

# kc_gpu and libcurl are used here directly (kc_client keeps them PRIVATE).
add_library(kc_clienttest STATIC ${CMAKE_CURRENT_LIST_DIR}/clienttest.c)
target_include_directories(kc_clienttest PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(kc_clienttest PUBLIC kc_client kc_gpu kc_testsrv
  PkgConfig::CMOCKA PkgConfig::CURL Threads::Threads)
target_compile_definitions(kc_clienttest PUBLIC
  KC_TEST_KERNELS="${CMAKE_CURRENT_LIST_DIR}/kernels"
  KCACHE_BIN="$<TARGET_FILE:kcache>"
  KC_FAKE_NVRTC="$<TARGET_FILE:gpu_fake_nvrtc>")
add_dependencies(kc_clienttest kcache kcached gpu_fake_nvrtc)

foreach(area keys cli build faults hostile models fetch compat)
  add_executable(test_client_${area}
                 ${CMAKE_CURRENT_LIST_DIR}/test_client_${area}.c)
  target_link_libraries(test_client_${area} PRIVATE kc_clienttest)
  add_test(NAME client_${area} COMMAND test_client_${area})
  # NVRTC builds and a few servers each; the sanitizer build is slower.
  set_tests_properties(client_${area} PROPERTIES TIMEOUT 300)
endforeach()
target_link_libraries(test_client_fetch PRIVATE PkgConfig::ZSTD)

# The CLI's warm and get at their edges: tests/test_client_warm.c.
add_executable(test_client_warm ${CMAKE_CURRENT_LIST_DIR}/test_client_warm.c)
target_link_libraries(test_client_warm PRIVATE kc_clienttest)
# libkcache's threads are counted through pthread_create (a small warm
# must start none).
target_link_options(test_client_warm PRIVATE -Wl,--wrap=pthread_create)
add_test(NAME client_warm COMMAND test_client_warm)
set_tests_properties(client_warm PROPERTIES TIMEOUT 300)

# What libkcache leaves on disk around --out, and the offer back of
# hit-local bundles: tests/test_client_materialize.c. umask(2) is counted
# through the wrap (the library must never set it).
add_executable(test_client_materialize
  ${CMAKE_CURRENT_LIST_DIR}/test_client_materialize.c)
target_link_libraries(test_client_materialize PRIVATE kc_clienttest kc_client kc_testsrv
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
