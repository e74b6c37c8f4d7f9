# tests/deploy.cmake: the deployment files (systemd unit, container, k8s, CI
# workflow, OPERATIONS.md), the examples under deploy/ and README's lines
# run as written, and kcached's sd_notify readiness.
# Debian's python3 first: python3-yaml is installed for it.
find_program(KCACHE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(KCACHE_PYTHON3 python3)
set(KCACHE_DEPLOY_TESTS ${CMAKE_CURRENT_SOURCE_DIR}/deploy)

add_test(NAME deploy_files
         COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/test_deploy.py
                 --root ${PROJECT_SOURCE_DIR})

add_executable(test_sdnotify deploy/test_sdnotify.c ${PROJECT_SOURCE_DIR}/server/sdnotify.c)
target_include_directories(test_sdnotify PRIVATE ${PROJECT_SOURCE_DIR}/server)
target_link_libraries(test_sdnotify PRIVATE PkgConfig::CMOCKA)
add_test(NAME deploy_sdnotify COMMAND test_sdnotify)

# systemd-analyze verify needs ExecStart's binary to exist.
if(TARGET kcached)
  set(KCACHE_UNIT_EXEC $<TARGET_FILE:kcached>)
else()
  set(KCACHE_UNIT_EXEC /bin/true)
endif()
add_test(NAME deploy_systemd_verify
         COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/verify_unit.py
                 ${PROJECT_SOURCE_DIR}/deploy/systemd/kcached.service ${KCACHE_UNIT_EXEC})
set_tests_properties(deploy_systemd_verify PROPERTIES SKIP_RETURN_CODE 77)

# READY=1 once listening, STOPPING=1 on SIGTERM (kcached's main calls kcd_sd_notify).
if(TARGET kcached)
  add_test(NAME deploy_notify
           COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/notify_ready.py $<TARGET_FILE:kcached>)
  set_tests_properties(deploy_notify PROPERTIES TIMEOUT 120)
endif()

# Every example under deploy/ run as written against a kcached with TLS and
# tokens: the k8s init container's and job's commands (the ConfigMap's
# files, each image's tools), the Dockerfiles' package lists and pip
# install, the torch-service entrypoint through the CA its yaml mounts
# (with the Python tests' venv: skipped without it, a failure when CI=true).
if(TARGET kcached AND TARGET kcache)
  if(DEFINED KCACHE_VENV)
    set(_deploy_venv ${KCACHE_VENV})
  else()
    set(_deploy_venv ${PROJECT_SOURCE_DIR}/build/venv)
  endif()
  set(_deploy_args --root ${PROJECT_SOURCE_DIR} --kcached $<TARGET_FILE:kcached>
      --kcache $<TARGET_FILE:kcache>)
  if(TARGET kcache_shared AND NOT KCACHE_SANITIZE)
    list(APPEND _deploy_args --venv ${_deploy_venv} --lib $<TARGET_FILE:kcache_shared>)
  endif()
  add_test(NAME deploy_examples
           COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/test_examples.py ${_deploy_args})
  set_tests_properties(deploy_examples PROPERTIES TIMEOUT 400
                       ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()

# Every line README.md gives a user to paste is run by a test: its CLI,
# suggest and page lines here, as written, in a scratch directory whose
# build/ is this build; the others name their test (test_readme.py).
if(TARGET kcached AND TARGET kcache AND NOT KCACHE_SANITIZE)
  add_test(NAME readme_lines
           COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/test_readme.py
                   --root ${PROJECT_SOURCE_DIR} --build ${CMAKE_BINARY_DIR})
  set_tests_properties(readme_lines PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()

# The container built from an empty Debian 12 without Docker (debootstrap and
# chroot: see container_chroot.py), started as its USER, and health-checked.
# Once per test run: the sanitizer build's copy would build the same thing.
if(NOT KCACHE_SANITIZE)
  add_test(NAME deploy_container_build
           COMMAND ${KCACHE_PYTHON3} ${KCACHE_DEPLOY_TESTS}/container_chroot.py
                   --root ${PROJECT_SOURCE_DIR})
  set_tests_properties(deploy_container_build PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1500)
endif()
