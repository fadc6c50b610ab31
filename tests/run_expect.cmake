# tests/run_expect.cmake — runs the `crisp` command once and checks how it ended.
#
#   cmake -DEXE=<crisp> -DARGS="plan|--q|x.npy" [-DEXPECT_RC=2] [-DEXPECT_STDERR=<regex>]
#         [-DEXPECT_STDOUT=<regex>] [-DEXPECT_FILES="a|b"] [-DJSON_FILE=<f> -DJSON_HEADS=<n>]
#         -P run_expect.cmake
#
# ARGS and EXPECT_FILES are separated by '|' (a ';' would be split by add_test). The test fails
# unless the exit status is exactly EXPECT_RC (default 2) — a crash (abort, segfault: status 134
# or 139, or a signal name from execute_process) never matches — and unless each regex matches.
# Files in EXPECT_FILES are deleted first, so a stale output from an earlier run cannot pass.
cmake_minimum_required(VERSION 3.24)

if(NOT DEFINED EXE)
  message(FATAL_ERROR "run_expect.cmake: EXE is not set")
endif()
if(NOT DEFINED EXPECT_RC)
  set(EXPECT_RC 2)
endif()
string(REPLACE "|" ";" arg_list "${ARGS}")
string(REPLACE "|" ";" file_list "${EXPECT_FILES}")
foreach(f IN LISTS file_list)
  file(REMOVE "${f}")
endforeach()

execute_process(COMMAND "${EXE}" ${arg_list}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)

set(failures "")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  string(APPEND failures "exit status '${rc}', expected ${EXPECT_RC}\n")
endif()
if(DEFINED EXPECT_STDERR AND NOT err MATCHES "${EXPECT_STDERR}")
  string(APPEND failures "stderr does not match '${EXPECT_STDERR}'\n")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  string(APPEND failures "stdout does not match '${EXPECT_STDOUT}'\n")
endif()
foreach(f IN LISTS file_list)
  if(NOT EXISTS "${f}")
    string(APPEND failures "expected output file '${f}' was not written\n")
  endif()
endforeach()
if(DEFINED JSON_FILE AND EXISTS "${JSON_FILE}")
  file(READ "${JSON_FILE}" json)
  string(JSON heads ERROR_VARIABLE json_error LENGTH "${json}" heads)
  if(json_error)
    string(APPEND failures "${JSON_FILE}: no 'heads' array (${json_error})\n")
  elseif(DEFINED JSON_HEADS AND NOT heads EQUAL JSON_HEADS)
    string(APPEND failures "${JSON_FILE}: ${heads} heads, expected ${JSON_HEADS}\n")
  else()
    math(EXPR last "${heads} - 1")
    foreach(h RANGE 0 ${last})
      string(JSON route GET "${json}" heads ${h} route)
      string(JSON cols LENGTH "${json}" heads ${h} col)
      if(NOT route MATCHES "^(vs|pe|dense)$" OR cols LESS 1)
        string(APPEND failures "${JSON_FILE}: head ${h} has route '${route}' and ${cols} columns\n")
      endif()
    endforeach()
  endif()
endif()

if(failures)
  message(FATAL_ERROR "crisp ${ARGS}\n${failures}--- stdout:\n${out}\n--- stderr:\n${err}")
endif()
