# tests/resp.cmake: kcached's Redis protocol listener (--resp-listen).
#
# resp_proto  cmocka unit test of the RESP2 parser and reply writers
#             (server/resp/resp_proto.c): every frame fed whole and byte by byte
# resp        tests/test_resp.py: redis-py, redis-cli, redis-benchmark and raw
#             sockets against a real kcached; skipped (77) without python3-redis,
#             a failure instead when CI=true (as are the suites below)
# server_service  tests/test_service.py: the service layer both front ends
#             share: kcached_ops_total from HTTP and RESP under one op label,
#             SIGTERM waiting for a RESP command in flight (needs redis-py)
add_executable(test_resp_proto ${CMAKE_CURRENT_LIST_DIR}/test_resp_proto.c)
target_link_libraries(test_resp_proto PRIVATE kcd_core PkgConfig::CMOCKA)
target_include_directories(test_resp_proto PRIVATE ${PROJECT_SOURCE_DIR}/server/resp)
add_test(NAME resp_proto COMMAND test_resp_proto)

# Debian's python3 first: python3-redis is installed for it.
find_program(KCACHE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(KCACHE_PYTHON3 python3)
if(KCACHE_PYTHON3)
  add_test(NAME resp COMMAND ${KCACHE_PYTHON3}
           ${CMAKE_CURRENT_LIST_DIR}/test_resp.py $<TARGET_FILE:kcached>)
  set_tests_properties(resp PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
  add_test(NAME server_service COMMAND ${KCACHE_PYTHON3}
           ${CMAKE_CURRENT_LIST_DIR}/test_service.py $<TARGET_FILE:kcached>)
  set_tests_properties(server_service PROPERTIES TIMEOUT 120
                       SKIP_RETURN_CODE 77)
endif()

# resp_attack  tests/test_resp_attack.py: attacks on the RESP port (an HTTP
#             request sent to it, revoked tokens, idle and stalled clients,
#             huge commands and replies, connection caps); needs redis-py
if(KCACHE_PYTHON3)
  add_test(NAME resp_attack COMMAND ${KCACHE_PYTHON3}
           ${CMAKE_CURRENT_LIST_DIR}/test_resp_attack.py $<TARGET_FILE:kcached>)
  set_tests_properties(resp_attack PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
