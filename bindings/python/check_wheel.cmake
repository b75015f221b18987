# ctest python_wheel: `pip wheel ./bindings/python` against this build's library, then the wheel installed
# into a fresh virtual environment (system site packages for NumPy; offline: --no-build-isolation,
# --no-index, --no-deps) and run from outside the tree by check_python_install.py, which also checks that
# the package and the libdstransformer.so it loads both come from the environment (the wheel bundles it).
# The wheel stays in WORK/wheelhouse and the environment in WORK/venv (the fixture of docs_python).
#   cmake -DPYTHON=... -DSRC=<repo root> -DLIBDIR=<dir of libdstransformer.so> -DWORK=<scratch dir> -P
foreach(v PYTHON SRC LIBDIR WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_wheel.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/wheelhouse")
set(pip --disable-pip-version-check --no-cache-dir -q)
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "DST_LIB_DIR=${LIBDIR}" "DST_INCLUDE_DIR=${SRC}/capi/include"
          "${PYTHON}" -m pip ${pip} wheel --no-build-isolation --no-deps -w "${WORK}/wheelhouse" "${SRC}/bindings/python"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip wheel ./bindings/python failed (${rc})")
endif()
file(GLOB wheel "${WORK}/wheelhouse/dstransformer-*.whl")
list(LENGTH wheel n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one wheel in ${WORK}/wheelhouse, found: ${wheel}")
endif()
message(STATUS "built ${wheel}")
execute_process(COMMAND "${PYTHON}" -m venv --system-site-packages "${WORK}/venv" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python -m venv failed (${rc}): is python3-venv installed?")
endif()
execute_process(COMMAND "${WORK}/venv/bin/python" -m pip ${pip} install --no-index --no-deps "${wheel}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install of the wheel failed (${rc})")
endif()
file(MAKE_DIRECTORY "${WORK}/run")
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH --unset=PYTHONPATH
                        "${WORK}/venv/bin/python" "${SRC}/tests/install/check_python_install.py" "${WORK}/venv"
                WORKING_DIRECTORY "${WORK}/run" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed wheel does not import or run (${rc})")
endif()
