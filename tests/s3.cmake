# tests/s3.cmake: the S3 client of store/ (kcs3.h) against a real single-node
# Ceph RADOS Gateway that test_s3 starts itself with scripts/ceph-rgw.sh
# (installing ceph-mon, ceph-osd, ceph-common and radosgw when missing), plus
# offline cases against a fake server. Skipped (77) where the packages cannot
# be installed, except with CI=true, where that fails. kc_testrgw (testrgw.h)
# is that harness, for every test that needs an RGW (test_scaleout too).
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_library(kc_testrgw STATIC ${CMAKE_CURRENT_LIST_DIR}/testrgw.c)
target_include_directories(kc_testrgw PUBLIC ${CMAKE_CURRENT_LIST_DIR})
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
