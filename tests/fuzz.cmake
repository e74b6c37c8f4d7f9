# tests/fuzz.cmake: the libFuzzer targets of tests/fuzz.
# Only with -DKCACHE_FUZZ=ON and clang (Debian's clang 14 works); the normal
# gcc build never reads further than the guard. scripts/fuzz.sh drives it.
#
# fuzz_<t>           one libFuzzer binary per target (ASan + UBSan)
# ctest fuzz_<t>     replays tests/fuzz/corpus/<t> and tests/fuzz/regressions/<t>
#                    once (-runs=0): no fuzzing, just "every kept input passes"
include_guard(GLOBAL)
if(NOT KCACHE_FUZZ)
  return()
endif()
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "KCACHE_FUZZ needs clang (libFuzzer): "
                      "cmake -DKCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang")
endif()

set(KC_FUZZ_DIR ${PROJECT_SOURCE_DIR}/tests/fuzz)
set(KC_FUZZ_TARGETS manifest warmup key router auth resp)
set(KC_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined
                -fno-omit-frame-pointer)

# The code under test gets coverage instrumentation (no libFuzzer main) and
# the sanitizers; whatever links these libraries links the sanitizer
# runtimes too.
foreach(lib kc_schema kc_store kc_tier kcd_base kcd_http kcd_resp kcd_core)
  target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link ${KC_FUZZ_SAN})
  target_link_options(${lib} INTERFACE ${KC_FUZZ_SAN})
endforeach()

enable_testing()
foreach(t ${KC_FUZZ_TARGETS})
  add_executable(fuzz_${t} ${KC_FUZZ_DIR}/fuzz_${t}.c)
  target_include_directories(fuzz_${t} PRIVATE ${KC_FUZZ_DIR})
  target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer ${KC_FUZZ_SAN})
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer ${KC_FUZZ_SAN})
  target_link_libraries(fuzz_${t} PRIVATE kc_schema)
  add_test(NAME fuzz_${t}
    COMMAND fuzz_${t} -runs=0 ${KC_FUZZ_DIR}/corpus/${t}
            ${KC_FUZZ_DIR}/regressions/${t})
  set_tests_properties(fuzz_${t} PROPERTIES LABELS fuzz TIMEOUT 300)
endforeach()
target_link_libraries(fuzz_router PRIVATE kcd_core)
target_link_libraries(fuzz_auth PRIVATE kcd_core)
target_link_libraries(fuzz_resp PRIVATE kcd_core)
# white-box: each front end's own header
target_include_directories(fuzz_router PRIVATE ${PROJECT_SOURCE_DIR}/server/http)
target_include_directories(fuzz_resp PRIVATE ${PROJECT_SOURCE_DIR}/server/resp)
add_custom_target(fuzz)
foreach(t ${KC_FUZZ_TARGETS})
  add_dependencies(fuzz fuzz_${t})
endforeach()
