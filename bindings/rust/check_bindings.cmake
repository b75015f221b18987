# ctest rust_bindings_fresh: regenerates the Rust FFI declarations from the public header into the
# build tree and fails when they differ from the checked-in dstransformer-sys/src/bindings.rs.
# Inputs: BINDGEN, ARGS (a list; see CMakeLists.txt), GENERATED, CHECKED_IN.
execute_process(COMMAND ${BINDGEN} -o ${GENERATED} ${ARGS}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bindgen failed (${rc}):\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${GENERATED} ${CHECKED_IN} RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "${CHECKED_IN} is stale: the public header changed. "
                      "Run `cmake --build <build> --target rust_bindings` and commit the result "
                      "(new output: ${GENERATED}).")
endif()
message(STATUS "bindings.rs matches the public header")
