# cmake -DSTAGE= -DLIBDIR= -DNM= -DREADELF= -DSOVERSION= -DVERSION= -DHEADER= -P check_symbols.cmake
# Checks the installed shared library's ABI surface:
#  - `nm -D --defined-only` lists only dst_* symbols;
#  - the dst_* symbols are exactly the functions the public header declares with DST_API;
#  - the SONAME is libdstransformer.so.<SOVERSION>, and the installed names form the usual chain
#    libdstransformer.so -> libdstransformer.so.<SOVERSION> -> libdstransformer.so.<VERSION>.
cmake_minimum_required(VERSION 3.25)

foreach(_v STAGE LIBDIR NM READELF SOVERSION VERSION HEADER)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "check_symbols.cmake: -D${_v}=... is required")
  endif()
endforeach()

set(_dir "${STAGE}/${LIBDIR}")
set(_lib "${_dir}/libdstransformer.so")
set(_errors "")

foreach(_name libdstransformer.so libdstransformer.so.${SOVERSION} libdstransformer.so.${VERSION})
  if(NOT EXISTS "${_dir}/${_name}")
    string(APPEND _errors "  missing ${_dir}/${_name}\n")
  endif()
endforeach()
if(NOT _errors STREQUAL "")
  message(FATAL_ERROR "install layout:\n${_errors}")
endif()
file(READ_SYMLINK "${_lib}" _link1)
file(READ_SYMLINK "${_dir}/libdstransformer.so.${SOVERSION}" _link2)
if(NOT _link1 STREQUAL "libdstransformer.so.${SOVERSION}" OR NOT _link2 STREQUAL "libdstransformer.so.${VERSION}")
  string(APPEND _errors "  symlink chain is libdstransformer.so -> ${_link1} -> ${_link2}\n")
endif()

# --- SONAME
execute_process(COMMAND "${READELF}" -d "${_lib}" OUTPUT_VARIABLE _dyn RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${_lib} failed (${_rc})")
endif()
if(_dyn MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
  set(_soname "${CMAKE_MATCH_1}")
else()
  set(_soname "<none>")
endif()
if(NOT _soname STREQUAL "libdstransformer.so.${SOVERSION}")
  string(APPEND _errors "  SONAME is ${_soname}, expected libdstransformer.so.${SOVERSION}\n")
endif()

# --- exported symbols
execute_process(COMMAND "${NM}" -D --defined-only "${_lib}" OUTPUT_VARIABLE _nm RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "nm -D --defined-only ${_lib} failed (${_rc})")
endif()
string(REPLACE "\n" ";" _lines "${_nm}")
set(_exported "")
foreach(_line IN LISTS _lines)
  # "<address> <type> <name>[@version]"
  if(_line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
    set(_sym "${CMAKE_MATCH_1}")
    list(APPEND _exported "${_sym}")
    if(NOT _sym MATCHES "^dst_")
      string(APPEND _errors "  exported symbol outside the API: ${_line}\n")
    endif()
  endif()
endforeach()
list(LENGTH _exported _n_exported)

# --- every DST_API function of the header is exported
file(READ "${HEADER}" _h)
string(REGEX MATCHALL "DST_API[^;(]*[ *](dst_[A-Za-z0-9_]+)[ \t]*\\(" _decls "${_h}")
set(_declared "")
foreach(_d IN LISTS _decls)
  if(_d MATCHES "(dst_[A-Za-z0-9_]+)[ \t]*\\($")
    list(APPEND _declared "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(LENGTH _declared _n_declared)
if(_n_declared EQUAL 0)
  string(APPEND _errors "  found no DST_API declarations in ${HEADER}\n")
endif()
foreach(_f IN LISTS _declared)
  if(NOT _f IN_LIST _exported)
    string(APPEND _errors "  declared in the header but not exported: ${_f}\n")
  endif()
endforeach()
foreach(_f IN LISTS _exported)
  if(_f MATCHES "^dst_" AND NOT _f IN_LIST _declared)
    string(APPEND _errors "  exported but not declared with DST_API in the header: ${_f}\n")
  endif()
endforeach()

if(NOT _errors STREQUAL "")
  message(FATAL_ERROR "ABI check of ${_lib}:\n${_errors}")
endif()
message(STATUS "SONAME ${_soname}; ${_n_exported} exported symbols, all dst_*; "
               "all ${_n_declared} DST_API functions of the header present")
