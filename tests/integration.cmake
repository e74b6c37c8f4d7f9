# tests/integration.cmake: reliability tests against the real kcached (issue
# 6): test_reliability (SIGKILL during concurrent uploads, a full store, a bad
# data directory, oversized and cut bodies, idle connections) and the wrk
# soak (tests/soak/soak.sh). Needs kc_testsrv from tests/server.cmake.
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_reliability ${CMAKE_CURRENT_LIST_DIR}/test_reliability.c)
target_link_libraries(test_reliability PRIVATE kc_testsrv kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::JANSSON
                      Threads::Threads)
add_test(NAME reliability COMMAND test_reliability)
# The crash loop cuts itself at about 60 s; restarts are slower under ASan.
set_tests_properties(reliability PROPERTIES TIMEOUT 400)

# Soak: wrk with mixed GET blob, POST /v1/lookup and PUT blob; 20 s here
# (SOAK_SECONDS=60 by hand). Skips (77) when wrk is not installed.
add_test(NAME soak COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/soak/soak.sh
         $<TARGET_FILE:kcached>)
set_tests_properties(soak PROPERTIES ENVIRONMENT "SOAK_SECONDS=20"
                     TIMEOUT 180 SKIP_RETURN_CODE 77)
