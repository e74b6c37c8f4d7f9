# tests/hardening_http.cmake: kcached under hostile HTTP clients,
# each a cmocka binary over the real kcached (kc_testsrv) and raw sockets
# (rawhttp.c: bytes libcurl would not send):
#   server_slow         slow headers, the per-address cap, --health-listen
#   server_http         request framing RFC 9112 refuses (smuggling)
#   server_auth_reload  token-file reloads that must keep the old tokens
#   framing_scan        unit test of the received-bytes scanner (framing.c)
add_library(kc_rawhttp STATIC ${CMAKE_CURRENT_LIST_DIR}/rawhttp.c)
target_include_directories(kc_rawhttp PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(kc_rawhttp PUBLIC kc_testsrv)

foreach(t slow http auth_reload)
  add_executable(test_server_${t} ${CMAKE_CURRENT_LIST_DIR}/test_server_${t}.c)
  target_link_libraries(test_server_${t} PRIVATE kc_rawhttp kc_testsrv
                        kc_schema PkgConfig::CMOCKA)
  add_test(NAME server_${t} COMMAND test_server_${t})
  set_tests_properties(server_${t} PROPERTIES TIMEOUT 300)
endforeach()

add_executable(test_framing_scan ${CMAKE_CURRENT_LIST_DIR}/test_framing_scan.c)
target_link_libraries(test_framing_scan PRIVATE kcd_core PkgConfig::CMOCKA)
add_test(NAME framing_scan COMMAND test_framing_scan)
