# tests/hardening_s3.cmake: hardening of the S3 tier across replicas (issue
# 14), against the real single-node Ceph RGW of kc_testrgw (tests/s3.cmake)
# with kcached replicas from kc_testsrv (tests/server.cmake), as
# tests/scaleout.cmake does. Skipped (77) where Ceph cannot be installed,
# except with CI=true.
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
