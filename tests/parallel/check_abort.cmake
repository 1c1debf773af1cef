# Runs abort_one_rank under mpirun and checks that one rank's error ends the whole job with a
# non-zero exit code within MAX_SECONDS (no rank left hanging in a collective).
# Inputs: MPIEXEC, NP, EXE, MAX_SECONDS.
string(TIMESTAMP start "%s")
execute_process(
  COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${EXE}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP stop "%s")
math(EXPR elapsed "${stop} - ${start}")
message(STATUS "mpirun exit: ${rc} after ${elapsed} s")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end within ${MAX_SECONDS} s (${rc}):\n${out}\n${err}")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "mpirun exited 0 although a rank failed:\n${out}\n${err}")
endif()
if(NOT err MATCHES "deliberate error on rank")
  message(FATAL_ERROR "the failing rank's message is missing from stderr:\n${err}")
endif()
if(out MATCHES "was not aborted" OR err MATCHES "was not aborted")
  message(FATAL_ERROR "a rank survived the abort:\n${out}\n${err}")
endif()
