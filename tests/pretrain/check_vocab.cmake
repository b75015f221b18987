# ctest pretrain_vocab_fresh: rebuilds the embedded vocabulary from the embedded corpus and fails when
# it differs from the checked-in tools/dst-pretrain/data/vocab.txt. Inputs: PYTHON, SCRIPT, CORPUS,
# CHECKED_IN, GENERATED.
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${CORPUS} ${GENERATED} --size 4000 RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_vocab.py failed (${rc}):\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${GENERATED} ${CHECKED_IN} RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "${CHECKED_IN} is stale: rerun `${SCRIPT} ${CORPUS} ${CHECKED_IN} --size 4000` and commit it")
endif()
message(STATUS "vocab.txt matches make_vocab.py's output")
