# gpu module tests: test_gpu (cmocka). NVRTC is found at run time the way the
# library finds it; tests that need it skip without it, or fail when CI=true.
# Two stand-in libraries exercise what a real toolkit cannot: an NVRTC that
# crashes and an NVRTC too old to use. A second run puts the toolkit's stub
# libcuda first on the loader path, so the driver's symbols and its error
# path are exercised on hosts without a GPU.
if(NOT TARGET PkgConfig::CMOCKA)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()

set(KC_GPU_TEST_BIN ${CMAKE_CURRENT_BINARY_DIR}/gpu-test)

# $CUDA_HOME/lib64/libnvrtc.so of a fake toolkit: the crashing NVRTC.
add_library(gpu_fake_nvrtc MODULE ${CMAKE_CURRENT_LIST_DIR}/gpu_fake_nvrtc.c)
set_target_properties(gpu_fake_nvrtc PROPERTIES
  PREFIX "lib" OUTPUT_NAME nvrtc
  LIBRARY_OUTPUT_DIRECTORY ${KC_GPU_TEST_BIN}/fake-cuda/lib64)
add_library(gpu_old_nvrtc MODULE ${CMAKE_CURRENT_LIST_DIR}/gpu_fake_nvrtc.c)
target_compile_definitions(gpu_old_nvrtc PRIVATE FAKE_NO_CUBIN)
set_target_properties(gpu_old_nvrtc PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${KC_GPU_TEST_BIN})

# A PyPI wheel's layout (nvidia/cu13/lib): an NVRTC that dlopens its
# builtins by soname, and the builtins beside it, off the loader path.
set(KC_WHEEL_LIB ${KC_GPU_TEST_BIN}/wheel/nvidia/cu13/lib)
add_library(gpu_wheel_nvrtc MODULE ${CMAKE_CURRENT_LIST_DIR}/gpu_fake_nvrtc.c)
target_compile_definitions(gpu_wheel_nvrtc PRIVATE FAKE_NEEDS_BUILTINS)
target_link_libraries(gpu_wheel_nvrtc PRIVATE ${CMAKE_DL_LIBS})
set_target_properties(gpu_wheel_nvrtc PROPERTIES
  PREFIX "" OUTPUT_NAME libnvrtc SUFFIX ".so.13"
  LIBRARY_OUTPUT_DIRECTORY ${KC_WHEEL_LIB})
add_library(gpu_wheel_builtins MODULE
  ${CMAKE_CURRENT_LIST_DIR}/gpu_fake_nvrtc.c)
target_compile_definitions(gpu_wheel_builtins PRIVATE FAKE_BUILTINS_LIB)
target_link_options(gpu_wheel_builtins PRIVATE
  -Wl,-soname,libnvrtc-builtins.so.99.9)
set_target_properties(gpu_wheel_builtins PROPERTIES
  PREFIX "" OUTPUT_NAME libnvrtc-builtins SUFFIX ".so.99.9"
  LIBRARY_OUTPUT_DIRECTORY ${KC_WHEEL_LIB})

add_executable(test_gpu ${CMAKE_CURRENT_LIST_DIR}/test_gpu.c)
target_link_libraries(test_gpu PRIVATE kc_gpu PkgConfig::CMOCKA Threads::Threads)
add_dependencies(test_gpu gpu_fake_nvrtc gpu_old_nvrtc gpu_wheel_nvrtc
  gpu_wheel_builtins)
target_compile_definitions(test_gpu PRIVATE
  KC_GPU_KERNELS="${CMAKE_CURRENT_LIST_DIR}/kernels"
  KC_FAKE_CUDA_HOME="${KC_GPU_TEST_BIN}/fake-cuda"
  KC_FAKE_NVRTC="$<TARGET_FILE:gpu_fake_nvrtc>"
  KC_OLD_NVRTC="$<TARGET_FILE:gpu_old_nvrtc>"
  KC_WHEEL_NVRTC="$<TARGET_FILE:gpu_wheel_nvrtc>")
add_test(NAME gpu COMMAND test_gpu)
# The timeout test waits 1 s; the first NVRTC load reads ~100 MB from disk.
set_tests_properties(gpu PROPERTIES TIMEOUT 300)

set(KC_CUDA_STUB /usr/local/cuda/lib64/stubs/libcuda.so)
if(EXISTS ${KC_CUDA_STUB})
  file(MAKE_DIRECTORY ${KC_GPU_TEST_BIN}/stub-driver)
  file(CREATE_LINK ${KC_CUDA_STUB} ${KC_GPU_TEST_BIN}/stub-driver/libcuda.so.1
       SYMBOLIC)
  add_test(NAME gpu_stub_driver COMMAND test_gpu --stub-driver)
  set_tests_properties(gpu_stub_driver PROPERTIES
    ENVIRONMENT "LD_LIBRARY_PATH=${KC_GPU_TEST_BIN}/stub-driver")
endif()

# A fake libcuda.so.1 (tests/gpu_fake_cuda.c): detection and the load check
# past cuInit, and the primary context kept across load checks, without a GPU.
add_library(gpu_fake_cuda MODULE ${CMAKE_CURRENT_LIST_DIR}/gpu_fake_cuda.c)
set_target_properties(gpu_fake_cuda PROPERTIES
  PREFIX "" OUTPUT_NAME libcuda SUFFIX ".so.1"
  LIBRARY_OUTPUT_DIRECTORY ${KC_GPU_TEST_BIN}/fake-driver)
add_dependencies(test_gpu gpu_fake_cuda)
add_test(NAME gpu_fake_driver COMMAND test_gpu --fake-driver)
set_tests_properties(gpu_fake_driver PROPERTIES
  ENVIRONMENT "KCACHE_LIBCUDA=$<TARGET_FILE:gpu_fake_cuda>")

# Compat on real silicon (scripts/gpu-check.sh): builds saxpy for a list of
# targets, loads each on GPU 0, compares with kc_gpu_arch_runs_on, and runs
# what loaded. Without a GPU only its rules row runs; the rest is SKIP.
add_executable(gpu_launch_check ${CMAKE_CURRENT_LIST_DIR}/gpu_launch_check.c)
target_link_libraries(gpu_launch_check PRIVATE kc_gpu)
target_compile_definitions(gpu_launch_check PRIVATE
  KC_GPU_KERNELS="${CMAKE_CURRENT_LIST_DIR}/kernels")
add_test(NAME gpu_launch_check COMMAND gpu_launch_check)
set_tests_properties(gpu_launch_check PROPERTIES TIMEOUT 300)

# scripts/gpu-check.sh in its no-GPU mode: packs a carry from this build
# tree (no rebuild) and runs it; the GPU rows SKIP, the rest must not FAIL.
# Not in the sanitizer build: it tests the packaging (a carried program runs
# under a scrubbed environment), and its programs have their own tests there.
if(NOT KCACHE_SANITIZE)
add_test(NAME gpu_check_script
  COMMAND ${CMAKE_COMMAND} -E env KC_GPU_CHECK_NO_BUILD=1 KC_GPU_CHECK_NO_WHEEL=1
    KC_GPU_CHECK_BUILD=${CMAKE_BINARY_DIR}
    KC_GPU_CARRY=${CMAKE_BINARY_DIR}/gpucarry-test KC_GPU_CHECK_BUDGET=120
    OUT=${CMAKE_BINARY_DIR}/gpucarry-test-out
    sh -c "${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh pack && ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh run")
set_tests_properties(gpu_check_script PROPERTIES TIMEOUT 180
  DEPENDS "gpu;gpu_launch_check")
endif()
