# tests/page.cmake: the routes by model and the page:
# server_models, the API against the real kcached (test_server_models.c);
# page, the page rendered by a real headless chromium against a kcached
# filled by `kcache warm` (test_page.py; skipped, 77, without chromium;
# a failure instead when CI=true).
add_executable(test_server_models ${CMAKE_CURRENT_LIST_DIR}/test_server_models.c)
target_link_libraries(test_server_models PRIVATE kc_servertest kc_store
                      Threads::Threads)
add_test(NAME server_models COMMAND test_server_models)
set_tests_properties(server_models PROPERTIES TIMEOUT 300)

add_test(NAME page
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_page.py
                 $<TARGET_FILE:kcached> $<TARGET_FILE:kcache>
                 ${CMAKE_BINARY_DIR}/artifacts)
set_tests_properties(page PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
