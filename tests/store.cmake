# tests/store.cmake: store/ unit tests, one cmocka binary per feature
# (test_store_<feature>.c, ctest store_<feature>; one temporary directory per
# test) over kc_storetest, their shared fixtures and helpers (storetest.h);
# and the store benchmark (bench_store: built, not run by ctest; see its
# header).
#   store_blob, store_bundle, store_evict, store_crash, store_concurrency,
#   store_scrub   the features below
#   store_kv      the store's RESP keys; store_kv_s3 the same against the RGW
#   store_limits  a lowered --max-bytes, manifests counted, the directory lock
#   store_zstd    blobs held zstd-compressed
#   store_models  warmup manifests' names: first holder, purge, the index
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

add_library(kc_storetest STATIC ${CMAKE_CURRENT_LIST_DIR}/storetest.c)
target_include_directories(kc_storetest PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(kc_storetest PUBLIC kc_store kc_schema PkgConfig::CMOCKA
                      Threads::Threads)

# blob: round trips, fd and streamed uploads, a 256 MiB blob; bundle: write-
# once, refcounts, GC, listings, stats; evict: LRU order, a full map, a tier
# with S3 down; crash: reopen, a SIGKILLed writer in a loop; concurrency:
# readers and writers on threads; scrub: verify and scrub find rot.
foreach(feature blob bundle evict crash concurrency scrub)
  add_executable(test_store_${feature}
                 ${CMAKE_CURRENT_LIST_DIR}/test_store_${feature}.c)
  target_link_libraries(test_store_${feature} PRIVATE kc_storetest)
  add_test(NAME store_${feature} COMMAND test_store_${feature})
endforeach()
# Each takes 0-5 s here (the 256 MiB blob and the sleeps for LRU order the
# longest); the sanitizer build and a loaded CI runner are several times slower.
set_tests_properties(store_bundle store_concurrency store_scrub
                     PROPERTIES TIMEOUT 300)
set_tests_properties(store_blob store_evict store_crash PROPERTIES TIMEOUT 600)

add_executable(bench_store ${CMAKE_CURRENT_LIST_DIR}/bench/bench_store.c)
target_link_libraries(bench_store PRIVATE kc_store kc_schema)

# test_store_kv: the store's RESP keys (store/kv*.c): values, dedup,
# expiry, SCAN and glob, eviction under both limits, a SIGKILLed writer,
# the scrub. ~10 s.
add_executable(test_store_kv ${CMAKE_CURRENT_LIST_DIR}/test_store_kv.c)
# `test_store_kv s3` (store_kv_s3): write- and read-through against the
# real RGW of tests/s3.cmake (kc_testrgw); skipped (77) where it cannot run.
target_link_libraries(test_store_kv PRIVATE kc_storetest kc_testrgw
                      PkgConfig::LMDB) # a store from before key bytes counted
add_test(NAME store_kv COMMAND test_store_kv)
set_tests_properties(store_kv PROPERTIES TIMEOUT 300)
add_test(NAME store_kv_s3 COMMAND test_store_kv s3)
set_tests_properties(store_kv_s3 PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)

# ---- limits ----
# test_store_limits: a lowered --max-bytes, manifests counted, the model
# listing from the index, the directory lock.
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()
if(NOT TARGET PkgConfig::LMDB)
  pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
endif()
if(NOT TARGET PkgConfig::JANSSON)
  pkg_check_modules(JANSSON REQUIRED IMPORTED_TARGET jansson)
endif()

add_executable(test_store_limits ${CMAKE_CURRENT_LIST_DIR}/test_store_limits.c)
target_link_libraries(test_store_limits PRIVATE kc_storetest
                      PkgConfig::LMDB PkgConfig::JANSSON)
add_test(NAME store_limits COMMAND test_store_limits)
set_tests_properties(store_limits PROPERTIES TIMEOUT 300)

# ---- models ----
# store_models: warmup manifests' names (store/models.c): first holder
# keeps a name, shared names, purge, the name index built for an old store.
add_executable(test_store_models ${CMAKE_CURRENT_LIST_DIR}/test_store_models.c)
target_link_libraries(test_store_models PRIVATE kc_storetest PkgConfig::LMDB)
# mdb_del and mdb_put wrapped: tests make one say the map is full
target_link_options(test_store_models PRIVATE -Wl,--wrap=mdb_del
                    -Wl,--wrap=mdb_put)
add_test(NAME store_models COMMAND test_store_models)
set_tests_properties(store_models PROPERTIES TIMEOUT 120)

# ---- zstd ----
# store_zstd: the store's side of zstd (store/zstd.c, blob.c): kept
# compressed when that saves enough, uploads arriving as frames, bad frames
# and bombs, verify and scrub, old stores, RESP values.
add_executable(test_store_zstd ${CMAKE_CURRENT_LIST_DIR}/test_store_zstd.c)
# LMDB: a frame stored as one from before the window bound was
target_link_libraries(test_store_zstd PRIVATE kc_storetest PkgConfig::ZSTD
                      PkgConfig::LMDB)
# ZSTD_createDCtx wrapped: a test makes one fail (a decoder that cannot be
# made gives its budget charge back)
target_link_options(test_store_zstd PRIVATE -Wl,--wrap=ZSTD_createDCtx)
add_test(NAME store_zstd COMMAND test_store_zstd)
set_tests_properties(store_zstd PROPERTIES TIMEOUT 300)
