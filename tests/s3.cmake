# tests/s3.cmake: the S3 client of store/ (kcs3.h) against a real single-node
# Ceph RADOS Gateway that test_s3 starts itself with scripts/ceph-rgw.sh
# (installing ceph-mon, ceph-osd, ceph-common and radosgw when missing), plus
# offline cases against a fake server. Skipped (77) where the packages cannot
# be installed, except with CI=true, where that fails. kc_testrgw (testrgw.h)
# is that harness, for every test that needs an RGW (test_scaleout too).
#   s3             test_s3.c: the S3 client against the RGW and a fake server
#   s3_zstd        test_s3_zstd.c: the S3 tier with zstd on the test RGW
#   scaleout       test_scaleout.c: two replicas over one bucket
#   scaleout_once  test_scaleout_once.c: write-once across replicas
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_library(kc_testrgw STATIC ${CMAKE_CURRENT_LIST_DIR}/testrgw.c)
target_include_directories(kc_testrgw PUBLIC ${CMAKE_CURRENT_LIST_DIR}
  ${PROJECT_SOURCE_DIR}/store/tier) # kcs3.h, the S3 client under test
target_compile_definitions(kc_testrgw PRIVATE KC_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(kc_testrgw PUBLIC kc_testsrv kc_store kc_schema
                      PkgConfig::CMOCKA)

add_executable(test_s3 ${CMAKE_CURRENT_LIST_DIR}/test_s3.c)
target_link_libraries(test_s3 PRIVATE kc_testrgw kc_store kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL Threads::Threads)
add_test(NAME s3 COMMAND test_s3)
# The RGW starts in 6-8 s and stops in ~1 s; a first install adds ~70 s
# (apt-get). The whole test: ~10 s, ~12 s under ASan.
set_tests_properties(s3 PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)

# ---- zstd in the tier ----
# s3_zstd: the S3 tier on the test RGW with zstd.
add_executable(test_s3_zstd ${CMAKE_CURRENT_LIST_DIR}/test_s3_zstd.c)
target_link_libraries(test_s3_zstd PRIVATE kc_testrgw kc_store kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::ZSTD
                      Threads::Threads)
add_test(NAME s3_zstd COMMAND test_s3_zstd)
set_tests_properties(s3_zstd PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)

# ---- scale-out ----
# Two kcached replicas over one S3 bucket: write-through and read-through,
# leases across replicas, SIGKILL with a queue, S3 down, corrupt objects,
# bad configuration, against the RGW of kc_testrgw above, with kcached
# replicas from kc_testsrv (tests/server.cmake). Skipped (77) where Ceph
# cannot be installed, except with CI=true.
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_scaleout ${CMAKE_CURRENT_LIST_DIR}/test_scaleout.c)
target_link_libraries(test_scaleout PRIVATE kc_testrgw kc_testsrv kc_store
                      kc_schema PkgConfig::CMOCKA PkgConfig::CURL
                      PkgConfig::JANSSON Threads::Threads)
add_test(NAME scaleout COMMAND test_scaleout)
# RGW start ~7 s; the cases wait for the write-through queue's backoff after
# radosgw comes back (up to 30 s each time); valgrind multiplies the rest.
set_tests_properties(scaleout PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)

# ---- write-once across replicas ----
# Hardening of the S3 tier across replicas, as scaleout above (the same
# RGW and replicas). Skipped (77) where Ceph cannot be installed, except
# with CI=true.
#   scaleout_once  write-once across replicas: a PUT of a key the bucket
#                  holds with another manifest is 409; a replica that
#                  accepted one while cut off gives way to the bucket's
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_scaleout_once ${CMAKE_CURRENT_LIST_DIR}/test_scaleout_once.c)
target_link_libraries(test_scaleout_once PRIVATE kc_testrgw kc_testsrv
                      kc_store kc_schema PkgConfig::CMOCKA PkgConfig::CURL
                      PkgConfig::JANSSON Threads::Threads)
add_test(NAME scaleout_once COMMAND test_scaleout_once)
# RGW start ~7 s; the race waits for B's queue backoff after radosgw comes
# back (up to 30 s); valgrind multiplies the rest.
set_tests_properties(scaleout_once PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
