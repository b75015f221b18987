# cmake -DSTAGE= -DLIBDIR= -DWORK= -DGENERATOR= -DCC= -DSOURCE_DIR= [-DEXTRA_FLAGS=] -P check_cmake_package.cmake
# Configures, builds and runs the consumer project in SOURCE_DIR against the staged install, finding
# the library only through CMAKE_PREFIX_PATH=<stage>.
cmake_minimum_required(VERSION 3.25)

foreach(_v STAGE LIBDIR WORK GENERATOR CC SOURCE_DIR)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "check_cmake_package.cmake: -D${_v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK}" -G "${GENERATOR}"
          "-DCMAKE_PREFIX_PATH=${STAGE}" "-DCMAKE_C_COMPILER=${CC}" -DCMAKE_BUILD_TYPE=Release
          "-DCMAKE_C_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}"
          # only the staged package may satisfy find_package (not a system-wide install)
          -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
          "-DEXPECTED_CONFIG_DIR=${STAGE}/${LIBDIR}/cmake/dstransformer"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "configuring the find_package(dstransformer) consumer failed (${_rc})")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK}" RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "building the find_package(dstransformer) consumer failed (${_rc})")
endif()

set(ENV{LD_LIBRARY_PATH} "${STAGE}/${LIBDIR}:$ENV{LD_LIBRARY_PATH}")
execute_process(COMMAND "${WORK}/consumer" RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the find_package(dstransformer) consumer failed (${_rc})")
endif()
