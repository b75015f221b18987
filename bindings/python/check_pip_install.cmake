# ctest python_pip_install: `pip install ./bindings/python` into a fresh virtual environment (system
# site packages for NumPy; no network: --no-build-isolation --no-deps), against the library of this
# build, then imports the installed package from outside the tree and runs a tiny layer.
#   cmake -DPYTHON=... -DSRC=<repo root> -DLIBDIR=<dir of libdstransformer.so> -DWORK=<scratch dir> -P
foreach(v PYTHON SRC LIBDIR WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_pip_install.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${PYTHON}" -m venv --system-site-packages "${WORK}/venv" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python -m venv failed (${rc}): is python3-venv installed?")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "DST_LIB_DIR=${LIBDIR}" "DST_INCLUDE_DIR=${SRC}/capi/include"
          "${WORK}/venv/bin/python" -m pip install --no-build-isolation --no-deps --no-cache-dir
          --disable-pip-version-check -q "${SRC}/bindings/python"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install ./bindings/python failed (${rc})")
endif()
set(probe [=[
import os, numpy as np, dstransformer as dst
assert "site-packages" in dst.__file__, dst.__file__
with dst.Context("cpu") as ctx:
    cfg = dst.LayerConfig(batch_size=2, max_seq_length=4, hidden_size=8, heads=2)
    with dst.Layer(ctx, cfg) as layer:
        y = layer.forward(np.ones((2, 4, 8), np.float32))
        assert y.shape == (2, 4, 8) and np.isfinite(y).all()
print("installed dstransformer", dst.version(), "at", os.path.dirname(dst.__file__))
]=])
execute_process(COMMAND "${WORK}/venv/bin/python" -c "${probe}" WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed package does not import or run (${rc})")
endif()
