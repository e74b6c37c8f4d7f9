# tests/hardening.cmake: the store and server at their limits:
# test_store_limits (a lowered --max-bytes, manifests counted, the model
# listing from the index, the directory lock) and test_server_disk (a full
# disk on a small tmpfs: 507 disk_full, /readyz 503; two kcached on one
# directory; the model listing from the index and from manifests).
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

if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_server_disk.c)
  add_executable(test_server_disk ${CMAKE_CURRENT_LIST_DIR}/test_server_disk.c)
  target_link_libraries(test_server_disk PRIVATE kc_servertest
                        PkgConfig::LMDB)
  add_test(NAME server_disk COMMAND test_server_disk)
  # exit 77: the tmpfs could not be mounted (not root): skipped
  set_tests_properties(server_disk PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
