# cmake -DBUILD_DIR=<build> -DSTAGE=<prefix> -P install_stage.cmake
# Installs a build tree into an empty staging prefix.
cmake_minimum_required(VERSION 3.25)

foreach(_v BUILD_DIR STAGE)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "install_stage.cmake: -D${_v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${STAGE}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${STAGE}"
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${STAGE} failed (${_rc})")
endif()

file(GLOB_RECURSE _files RELATIVE "${STAGE}" LIST_DIRECTORIES false "${STAGE}/*")
list(SORT _files)
list(JOIN _files "\n  " _listing)
message(STATUS "installed into ${STAGE}:\n  ${_listing}")
