# tests/python.cmake: the Python package (python/, kcache) with pytest in the
# virtual environment of scripts/pyenv.sh (KCACHE_VENV, default build/venv:
# torch==2.13.0, triton, redis-py). The in-tree package is used
# (PYTHONPATH=python) with this build's libkcache.so (KCACHE_LIB) and kcached.
# Without the environment the tests are skipped (77), unless CI=true: then
# they fail (a torch test that cannot find torch fails in CI).
#
# python_install  the package `pip install ./python` put into the venv
#                 imports, with its own libkcache.so, no LD_LIBRARY_PATH
# python_client   kcache.Client and kcache.triton (real triton, no GPU)
# python_firsthour  scripts/run.sh's printed lines, run as printed: the
#                 install, torch.compile twice (the second process hits),
#                 Triton's cache manager across two cache directories
# python_torch    real PyTorch compiling through kcache: each warm path,
#                 wrong token, version mismatch, kcached down, concurrency
# python_torch_aot  kcache.torch.compile's AOTInductor packages per bucket:
#                 published, served to fresh processes, fallbacks, refusals
# A sanitizer build's libkcache.so cannot be loaded into python: not there.
if(KCACHE_SHARED AND NOT KCACHE_SANITIZE)
  set(KCACHE_VENV "${PROJECT_SOURCE_DIR}/build/venv" CACHE PATH
      "virtual environment of the Python tests (scripts/pyenv.sh)")
  set(_py_env "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
      "KCACHE_LIB=$<TARGET_FILE:kcache_shared>"
      "KCACHED=$<TARGET_FILE:kcached>" "PYTHONDONTWRITEBYTECODE=1")
  set(_py_run ${CMAKE_CURRENT_LIST_DIR}/python/run.sh ${KCACHE_VENV})
  add_test(NAME python_client COMMAND ${_py_run}
           ${CMAKE_CURRENT_LIST_DIR}/python/test_client.py
           ${CMAKE_CURRENT_LIST_DIR}/python/test_triton.py)
  add_test(NAME python_torch COMMAND ${_py_run}
           ${CMAKE_CURRENT_LIST_DIR}/python/test_torch.py)
  set_tests_properties(python_client PROPERTIES TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${_py_env}")
  # about 13 min alone on 2 busy cores (17 fresh torch processes); not
  # RUN_SERIAL, so that it overlaps the C tests rather than adding to them
  set_tests_properties(python_torch PROPERTIES TIMEOUT 2400
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${_py_env}")
  add_test(NAME python_firsthour COMMAND ${_py_run}
           ${CMAKE_CURRENT_LIST_DIR}/python/test_firsthour.py)
  set_tests_properties(python_firsthour PROPERTIES TIMEOUT 400
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${_py_env}")
  add_test(NAME python_torch_aot COMMAND ${_py_run}
           ${CMAKE_CURRENT_LIST_DIR}/python/test_torch_aot.py)
  # about 4 min alone on 2 busy cores (10 fresh torch processes)
  set_tests_properties(python_torch_aot PROPERTIES TIMEOUT 1200
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${_py_env}")
  add_test(NAME python_install COMMAND ${_py_run}
           ${CMAKE_CURRENT_LIST_DIR}/python/test_install.py)
  set_tests_properties(python_install PROPERTIES TIMEOUT 60
                       SKIP_RETURN_CODE 77 ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()
