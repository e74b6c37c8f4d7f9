# tests/store.cmake: store/ unit tests (test_store: cmocka, one temporary
# directory per test, a SIGKILLed writer, threads, a 256 MiB blob) and the
# store benchmark (bench_store: built, not run by ctest; see its header).
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

add_executable(test_store ${CMAKE_CURRENT_LIST_DIR}/test_store.c)
target_link_libraries(test_store PRIVATE kc_store kc_schema PkgConfig::CMOCKA
                      Threads::Threads)
add_test(NAME store COMMAND test_store)
# ~30-60 s normally (a 256 MiB blob, a crash loop, sleeps for LRU order);
# the sanitizer build is 2-3x slower.
set_tests_properties(store PROPERTIES TIMEOUT 600)

add_executable(bench_store ${CMAKE_CURRENT_LIST_DIR}/bench/bench_store.c)
target_link_libraries(bench_store PRIVATE kc_store kc_schema)

# test_store_kv: the store's RESP keys (store/kv*.c): values, dedup,
# expiry, SCAN and glob, eviction under both limits, a SIGKILLed writer,
# the scrub. ~10 s.
add_executable(test_store_kv ${CMAKE_CURRENT_LIST_DIR}/test_store_kv.c)
# `test_store_kv s3` (store_kv_s3): write- and read-through against the
# real RGW of tests/s3.cmake (kc_testrgw); skipped (77) where it cannot run.
target_link_libraries(test_store_kv PRIVATE kc_store kc_schema kc_testrgw
                      PkgConfig::CMOCKA Threads::Threads)
add_test(NAME store_kv COMMAND test_store_kv)
set_tests_properties(store_kv PROPERTIES TIMEOUT 300)
add_test(NAME store_kv_s3 COMMAND test_store_kv s3)
set_tests_properties(store_kv_s3 PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
