# The command line of one example program, without a GPU (cmake -P; registered by
# examples/CMakeLists.txt as example_cli_<name>, label cpu). Run with FLAME_CUDA_DRIVER_PATH pointing
# nowhere: an example that created a context before answering would exit 2 here and fail.
#
#   -DPROG=<the executable>  -DNAME=<program name>  -DSOURCE=<its .c file>
#   -DBAD=<arguments, one string split as a shell would>  -DBAD_MESSAGE=<the start of the error line they must print>
#
# Checks: --help exits 0 and prints "usage: NAME" and a line with "(default: " for every option of
# the source's table (each `{"--name", ARG_...` entry); --version exits 0 and prints
# "NAME (FLAME <version>"; BAD exits 1 and prints BAD_MESSAGE on stderr; an unknown option exits 1
# and is named.
foreach(var PROG NAME SOURCE BAD BAD_MESSAGE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_example_cli.cmake: -D${var}= is required")
  endif()
endforeach()

function(run_example out_rc out_stdout out_stderr)
  execute_process(COMMAND ${PROG} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE so ERROR_VARIABLE se TIMEOUT 60)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_stdout} "${so}" PARENT_SCOPE)
  set(${out_stderr} "${se}" PARENT_SCOPE)
endfunction()

set(failures "")

# --help: exit 0, usage on stdout, every option of the table with its default.
run_example(rc so se --help)
if(NOT rc STREQUAL "0")
  string(APPEND failures "--help exited ${rc} (want 0); stderr: ${se}\n")
endif()
if(NOT so MATCHES "usage: ${NAME} ")
  string(APPEND failures "--help printed no 'usage: ${NAME}' line on stdout: ${so}\n")
endif()
file(READ ${SOURCE} source_text)
string(REGEX MATCHALL "{\"--[a-z0-9-]+\", ARG_" table_entries "${source_text}")
set(option_count 0)
foreach(entry IN LISTS table_entries)
  string(REGEX REPLACE "^{\"(--[a-z0-9-]+)\".*" "\\1" option "${entry}")
  math(EXPR option_count "${option_count} + 1")
  # One usage line per option: "  --steps N   help (default: 2000)".
  if(NOT so MATCHES "\n  ${option}[^\n]*\\(default: [^\n]+\\)\n")
    string(APPEND failures "--help shows no line with the default of ${option}\n")
  endif()
endforeach()
foreach(builtin --help --version)
  if(NOT so MATCHES "\n  ${builtin} ")
    string(APPEND failures "--help does not list ${builtin}\n")
  endif()
endforeach()

# --version: exit 0, the program and the library's version.
run_example(rc so se --version)
if(NOT rc STREQUAL "0")
  string(APPEND failures "--version exited ${rc} (want 0); stderr: ${se}\n")
endif()
if(NOT so MATCHES "^${NAME} \\(FLAME [0-9]+\\.[0-9]+\\.[0-9]+")
  string(APPEND failures "--version printed '${so}' (want '${NAME} (FLAME <major.minor.patch>, ...')\n")
endif()

# A bad value: exit 1 and one line naming the argument.
separate_arguments(bad_args UNIX_COMMAND "${BAD}")
run_example(rc so se ${bad_args})
if(NOT rc STREQUAL "1")
  string(APPEND failures "'${BAD}' exited ${rc} (want 1); stderr: ${se}\n")
endif()
string(FIND "${se}" "${BAD_MESSAGE}" at)
if(at EQUAL -1)
  string(APPEND failures "'${BAD}' printed '${se}' on stderr (want it to contain '${BAD_MESSAGE}')\n")
endif()

# An unknown option: exit 1, named.
run_example(rc so se --no-such-option)
if(NOT rc STREQUAL "1" OR NOT se MATCHES "${NAME}: unknown option '--no-such-option'")
  string(APPEND failures "--no-such-option exited ${rc} (want 1) with stderr '${se}' (want it named)\n")
endif()

if(failures)
  message(FATAL_ERROR "${NAME}:\n${failures}")
endif()
message(STATUS "${NAME}: --help (${option_count} options with defaults), --version, '${BAD}' and an unknown option answer as they should")
