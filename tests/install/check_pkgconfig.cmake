# cmake -DSTAGE= -DLIBDIR= -DWORK= -DCC= -DPKG_CONFIG= -DSOURCE= [-DEXTRA_FLAGS=] -P check_pkgconfig.cmake
# Compiles a C99 consumer against the staged install with the flags pkg-config gives, and runs it.
cmake_minimum_required(VERSION 3.25)

foreach(_v STAGE LIBDIR WORK CC PKG_CONFIG SOURCE)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "check_pkgconfig.cmake: -D${_v}=... is required")
  endif()
endforeach()

set(ENV{PKG_CONFIG_PATH} "${STAGE}/${LIBDIR}/pkgconfig")
unset(ENV{PKG_CONFIG_LIBDIR})
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs dstransformer
                OUTPUT_VARIABLE _pc OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs dstransformer failed (${_rc}): ${_err}")
endif()
execute_process(COMMAND "${PKG_CONFIG}" --modversion dstransformer
                OUTPUT_VARIABLE _ver OUTPUT_STRIP_TRAILING_WHITESPACE)
message(STATUS "pkg-config dstransformer ${_ver}: ${_pc}")
separate_arguments(_pc_args UNIX_COMMAND "${_pc}")
separate_arguments(_extra UNIX_COMMAND "${EXTRA_FLAGS}")

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${PKG_CONFIG}" --variable=libdir dstransformer
                OUTPUT_VARIABLE _libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
# The two ways docs/building.md gives for a prefix the loader does not search (ldconfig covers the
# system prefixes): an rpath to pkg-config's libdir, or LD_LIBRARY_PATH at run time.
unset(ENV{LD_LIBRARY_PATH})
foreach(_how rpath ld_library_path)
  set(_exe "${WORK}/consumer_${_how}")
  set(_link ${_pc_args})
  if(_how STREQUAL "rpath")
    list(APPEND _link "-Wl,-rpath,${_libdir}")
  endif()
  # Source first, libraries after it (the order a linker with --as-needed requires).
  set(_cmd "${CC}" -std=c99 -Wall -Wextra -pedantic -Werror ${_extra} "${SOURCE}" -o "${_exe}" ${_link})
  list(JOIN _cmd " " _shown)
  message(STATUS "${_shown}")
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "compiling the pkg-config consumer failed (${_rc})")
  endif()
  if(_how STREQUAL "rpath")
    execute_process(COMMAND "${_exe}" RESULT_VARIABLE _rc)
  else()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${_libdir}" "${_exe}" RESULT_VARIABLE _rc)
  endif()
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "the pkg-config consumer built for ${_how} failed (${_rc})")
  endif()
  message(STATUS "consumer (${_how}) ok")
endforeach()
