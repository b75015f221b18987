# ctest install_java: the Java binding as `cmake --install` put it in the staged prefix STAGE. Checks the
# jar, the JNI library's run path and the Maven entry (pom coordinate), then compiles EXAMPLE against
# the installed jar and runs it with the installed native library only.
#   cmake -DSTAGE= -DLIBDIR= -DDATADIR= -DVERSION= -DJAVAC= -DJAVA= -DREADELF= -DEXAMPLE= -DWORK= -P
foreach(v STAGE LIBDIR DATADIR VERSION JAVAC JAVA READELF EXAMPLE WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_install.cmake: -D${v}=... is required")
  endif()
endforeach()
set(jar "${STAGE}/${DATADIR}/java/dstransformer.jar")
set(jni "${STAGE}/${LIBDIR}/libdstransformer_java.so")
set(maven "${STAGE}/${DATADIR}/maven-repo/org/dstransformer/dstransformer/${VERSION}")
foreach(f "${jar}" "${STAGE}/${DATADIR}/java/dstransformer-${VERSION}.jar" "${jni}"
          "${maven}/dstransformer-${VERSION}.jar" "${maven}/dstransformer-${VERSION}.pom")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(READ "${maven}/dstransformer-${VERSION}.pom" pom)
foreach(want "<groupId>org.dstransformer</groupId>" "<artifactId>dstransformer</artifactId>"
             "<version>${VERSION}</version>")
  string(FIND "${pom}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the pom lacks ${want}")
  endif()
endforeach()
execute_process(COMMAND "${READELF}" -d "${jni}" OUTPUT_VARIABLE dyn)
if(NOT dyn MATCHES "RUNPATH\\)[^\n]*\\[\\$ORIGIN\\]")
  message(FATAL_ERROR "libdstransformer_java.so: expected RUNPATH [$ORIGIN]:\n${dyn}")
endif()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${JAVAC}" -encoding UTF-8 -cp "${jar}" -d "${WORK}" "${EXAMPLE}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "javac against the installed jar failed (${rc})")
endif()
get_filename_component(main "${EXAMPLE}" NAME_WE)
unset(ENV{LD_LIBRARY_PATH})
execute_process(COMMAND "${JAVA}" --enable-native-access=ALL-UNNAMED "-Djava.library.path=${STAGE}/${LIBDIR}"
                        -cp "${jar}:${WORK}" ${main}
                WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example failed with the installed jar and native library (${rc})")
endif()
message(STATUS "installed Java binding ok: org.dstransformer:dstransformer:${VERSION}")
