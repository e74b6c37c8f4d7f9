# tests/demand.cmake: demand feedback: kcached's
# POST /v1/demand and GET /v1/models/{model}/demand against the real binary
# (server_demand), and the bucket suggestion's dynamic programme against brute
# force (suggest).
add_executable(test_server_demand ${CMAKE_CURRENT_LIST_DIR}/test_server_demand.c)
target_link_libraries(test_server_demand PRIVATE kc_servertest)
add_test(NAME server_demand COMMAND test_server_demand)
set_tests_properties(server_demand PROPERTIES TIMEOUT 300)

if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()
add_executable(test_suggest ${CMAKE_CURRENT_LIST_DIR}/test_suggest.c)
target_link_libraries(test_suggest PRIVATE kc_client PkgConfig::CMOCKA)
add_test(NAME suggest COMMAND test_suggest)
