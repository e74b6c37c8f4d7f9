# tests/scaleout.cmake: two kcached replicas over one S3 bucket:
# write-through and read-through, leases across replicas, SIGKILL with a
# queue, S3 down, corrupt objects, bad configuration, against a real
# single-node Ceph RGW (kc_testrgw from tests/s3.cmake, kc_testsrv from
# tests/server.cmake). Skipped (77) where Ceph cannot be installed, except
# with CI=true.
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
