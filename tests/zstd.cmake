# tests/zstd.cmake: blobs held zstd-compressed and sent so.
# store_zstd: the store's side (store/zstd.c, blob.c): kept compressed when
# that saves an eighth, uploads arriving as frames, bad frames and bombs,
# verify and scrub, old stores, RESP values. server_zstd: GET/HEAD/PUT with
# Accept-Encoding and Content-Encoding on a real kcached. s3_zstd: the S3
# tier on the test RGW.
add_executable(test_store_zstd ${CMAKE_CURRENT_LIST_DIR}/test_store_zstd.c)
target_link_libraries(test_store_zstd PRIVATE kc_storetest PkgConfig::ZSTD)
add_test(NAME store_zstd COMMAND test_store_zstd)
set_tests_properties(store_zstd PROPERTIES TIMEOUT 300)

add_executable(test_server_zstd ${CMAKE_CURRENT_LIST_DIR}/test_server_zstd.c)
target_link_libraries(test_server_zstd PRIVATE kc_servertest PkgConfig::ZSTD)
add_test(NAME server_zstd COMMAND test_server_zstd)
set_tests_properties(server_zstd PROPERTIES TIMEOUT 300)

add_executable(test_s3_zstd ${CMAKE_CURRENT_LIST_DIR}/test_s3_zstd.c)
target_link_libraries(test_s3_zstd PRIVATE kc_testrgw kc_store kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::ZSTD
                      Threads::Threads)
add_test(NAME s3_zstd COMMAND test_s3_zstd)
set_tests_properties(s3_zstd PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
