# tests/server.cmake: kcached's integration tests, one binary per feature
# (test_server_<feature>.c, ctest server_<feature>: the real binary on a free
# loopback port, spoken to with libcurl) over kc_servertest (servertest.h),
# their shared helpers; and kc_testsrv (testsrv.h), the helper that starts
# kcached and speaks HTTP to it, for every module's integration tests.
#   server_blob, server_bundle, server_lease, server_auth, server_ops,
#   server_fetch     the features below (kc_servertest)
#   server_disk      a full disk on a small tmpfs, two kcached on one
#                    directory (77 without root)
#   server_slow, server_http, server_auth_reload   hostile HTTP clients
#                    (kc_rawhttp, rawhttp.h); framing_scan its scanner
#   server_slowread  slow readers, bounded lookups, manifest file caps
#   server_slowclient clients at real networks' pace on every GET path
#   server_demand    POST /v1/demand, GET /v1/models/{model}/demand
#   server_models    the routes by model; page: the page in headless
#                    chromium (test_page.py)
#   server_accesslog the access log and --access-log
#   server_zstd      GET/HEAD/PUT with zstd encodings
#   reliability      SIGKILL during uploads, a full store, bad data dirs,
#                    cut bodies, idle connections; soak: wrk (soak.sh)
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_library(kc_testsrv STATIC ${CMAKE_CURRENT_LIST_DIR}/testsrv.c)
target_include_directories(kc_testsrv PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(kc_testsrv PUBLIC KCACHED_BIN="$<TARGET_FILE:kcached>")
target_link_libraries(kc_testsrv PUBLIC kc_schema PkgConfig::CURL)
add_dependencies(kc_testsrv kcached)

add_library(kc_servertest STATIC ${CMAKE_CURRENT_LIST_DIR}/servertest.c)
target_link_libraries(kc_servertest PUBLIC kc_testsrv kc_schema
                      PkgConfig::CMOCKA PkgConfig::CURL PkgConfig::JANSSON)

# blob: uploads, digests, limits, rot and the scrub; bundle: manifests,
# lookup, models; lease: leases; auth: the role matrix, token reload, TLS;
# ops: health, stats, metrics, restart, flags, logs, stop, timeouts.
foreach(feature blob bundle lease auth ops)
  add_executable(test_server_${feature}
                 ${CMAKE_CURRENT_LIST_DIR}/test_server_${feature}.c)
  target_link_libraries(test_server_${feature} PRIVATE kc_servertest)
  add_test(NAME server_${feature} COMMAND test_server_${feature})
endforeach()
# A few servers each, seconds here; the sanitizer build is slower.
set_tests_properties(server_blob server_bundle server_lease server_auth
                     server_ops PROPERTIES TIMEOUT 300)

# fetch: POST /v1/blobs/fetch, many blobs in one answer.
add_executable(test_server_fetch ${CMAKE_CURRENT_LIST_DIR}/test_server_fetch.c)
target_link_libraries(test_server_fetch PRIVATE kc_servertest PkgConfig::ZSTD)
add_test(NAME server_fetch COMMAND test_server_fetch)
set_tests_properties(server_fetch PROPERTIES TIMEOUT 300)

# ---- a full disk ----
# test_server_disk: a full disk on a small tmpfs (507 disk_full, /readyz
# 503); two kcached on one directory; the model listing from the index and
# from manifests.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_server_disk.c)
  add_executable(test_server_disk ${CMAKE_CURRENT_LIST_DIR}/test_server_disk.c)
  target_link_libraries(test_server_disk PRIVATE kc_servertest
                        PkgConfig::LMDB)
  add_test(NAME server_disk COMMAND test_server_disk)
  # exit 77: the tmpfs could not be mounted (not root): skipped
  set_tests_properties(server_disk PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# ---- hostile HTTP clients ----
# kcached under hostile HTTP clients,
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
target_include_directories(test_framing_scan PRIVATE ${PROJECT_SOURCE_DIR}/server/http)
add_test(NAME framing_scan COMMAND test_framing_scan)

# ---- slow readers ----
# Slow readers do not
# pin the store or exhaust its reader table; lookup answers are bounded;
# manifests have at most KC_MANIFEST_MAX_FILES files (test_server_slowread:
# the real kcached, the real store, the client library).
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_server_slowread
               ${CMAKE_CURRENT_LIST_DIR}/test_server_slowread.c)
target_link_libraries(test_server_slowread PRIVATE kc_servertest kc_client
                      kc_store PkgConfig::LMDB)
add_test(NAME server_slowread COMMAND test_server_slowread)
# Writes 340 MiB through a small store; slower under the sanitizers.
set_tests_properties(server_slowread PROPERTIES TIMEOUT 600)
# server_slowclient: clients at 1, 15 and 40 MB/s, stalling, at a 1500-byte
# MTU (TCP_MAXSEG), many at once on every GET path (HTTP and RESP) while a
# writer churns a small store: bodies whole or refused up front, memory
# bounded (test_server_slowclient.c).
add_executable(test_server_slowclient
               ${CMAKE_CURRENT_LIST_DIR}/test_server_slowclient.c)
target_link_libraries(test_server_slowclient PRIVATE kc_servertest
                      Threads::Threads)
add_test(NAME server_slowclient COMMAND test_server_slowclient)
set_tests_properties(server_slowclient PROPERTIES TIMEOUT 300)

# ---- demand ----
# server_demand: POST /v1/demand and GET /v1/models/{model}/demand against
# the real binary.
add_executable(test_server_demand ${CMAKE_CURRENT_LIST_DIR}/test_server_demand.c)
target_link_libraries(test_server_demand PRIVATE kc_servertest)
add_test(NAME server_demand COMMAND test_server_demand)
set_tests_properties(server_demand PROPERTIES TIMEOUT 300)

# ---- the routes by model and the page ----
# The routes by model and the page:
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

# ---- the access log ----
# The small-GET hot path: the access log that it
# formats cheaply, and the --access-log off|FILE flag (test_server_accesslog:
# the real kcached).
if(NOT TARGET PkgConfig::CURL)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
endif()

add_executable(test_server_accesslog
               ${CMAKE_CURRENT_LIST_DIR}/test_server_accesslog.c)
target_link_libraries(test_server_accesslog PRIVATE kc_testsrv
                      PkgConfig::CMOCKA PkgConfig::CURL)
add_test(NAME server_accesslog COMMAND test_server_accesslog)

# ---- zstd on the wire ----
# server_zstd: GET/HEAD/PUT with Accept-Encoding and Content-Encoding on a
# real kcached.
add_executable(test_server_zstd ${CMAKE_CURRENT_LIST_DIR}/test_server_zstd.c)
target_link_libraries(test_server_zstd PRIVATE kc_servertest PkgConfig::ZSTD)
add_test(NAME server_zstd COMMAND test_server_zstd)
set_tests_properties(server_zstd PROPERTIES TIMEOUT 300)

# ---- reliability ----
# Reliability tests against the real kcached: test_reliability (SIGKILL
# during concurrent uploads, a full store, a bad data directory, oversized
# and cut bodies, idle connections) and the wrk soak (tests/soak/soak.sh).
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
