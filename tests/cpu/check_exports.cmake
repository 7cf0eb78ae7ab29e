# Checks the dynamic symbol table and dynamic section of libflame.so (run by ctest in script mode):
#  - every defined dynamic symbol is a flame_* name with the version FLAME_1 (nothing else leaks:
#    no C++ symbols, no statically linked pieces);
#  - the exported set equals the set of functions declared FLAME_API in flame.h, both ways;
#  - the SONAME is libflame.so.<SOVERSION>;
#  - no NEEDED entry names the CUDA driver (libcuda) or the CUDA runtime: the driver is dlopen'ed.
# Inputs: -DLIB= -DHEADER= -DNM= -DREADELF= -DSOVERSION=
foreach(v LIB HEADER NM READELF SOVERSION)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "check_exports.cmake: -D${v}= is required")
  endif()
endforeach()

set(errors "")

# ---- exported symbols ----
execute_process(COMMAND ${NM} -D --defined-only --with-symbol-versions ${LIB}
  OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIB}: ${nm_err}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported "")
foreach(line IN LISTS nm_lines)
  if(line STREQUAL "")
    continue()
  endif()
  # "<address> <type> <name>[@@|@]<version>"
  if(NOT line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) (.+)$")
    string(APPEND errors "  unparsable nm line: ${line}\n")
    continue()
  endif()
  set(type "${CMAKE_MATCH_1}")
  set(sym "${CMAKE_MATCH_2}")
  if(sym MATCHES "^FLAME_1(@@FLAME_1)?$" AND type STREQUAL "A")
    continue()  # the version definition itself
  endif()
  if(sym MATCHES "^(flame_[a-z0-9_]+)@@FLAME_1$")
    if(NOT type STREQUAL "T")
      string(APPEND errors "  ${sym} is exported with type ${type}, expected a function (T)\n")
    endif()
    list(APPEND exported "${CMAKE_MATCH_1}")
  else()
    string(APPEND errors "  unexpected export: ${type} ${sym} (only flame_*@@FLAME_1 may be exported)\n")
  endif()
endforeach()

# ---- functions declared in the header ----
file(READ ${HEADER} header)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" header "${header}")  # drop comments
string(REGEX MATCHALL "FLAME_API[^;(]*[ *]flame_[a-z0-9_]+ *\\(" decls "${header}")
set(declared "")
foreach(d IN LISTS decls)
  string(REGEX MATCH "flame_[a-z0-9_]+ *\\($" name "${d}")
  string(REGEX REPLACE " *\\($" "" name "${name}")
  list(APPEND declared "${name}")
endforeach()
list(LENGTH declared n_declared)
if(n_declared LESS 10)
  string(APPEND errors "  parsed only ${n_declared} FLAME_API declarations from ${HEADER}; the parser is broken\n")
endif()

set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
set(extra ${exported})
list(REMOVE_ITEM extra ${declared})
list(SORT missing)
list(SORT extra)
foreach(s IN LISTS missing)
  string(APPEND errors "  declared in flame.h but not exported: ${s}\n")
endforeach()
foreach(s IN LISTS extra)
  string(APPEND errors "  exported but not declared in flame.h: ${s}\n")
endforeach()

# ---- SONAME and NEEDED ----
execute_process(COMMAND ${READELF} -d ${LIB} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d failed on ${LIB}")
endif()
if(NOT dyn MATCHES "\\(SONAME\\)[^\n]*\\[libflame\\.so\\.${SOVERSION}\\]")
  string(APPEND errors "  SONAME is not libflame.so.${SOVERSION}\n")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]]+\\]" needed_lines "${dyn}")
set(needed "")
foreach(l IN LISTS needed_lines)
  string(REGEX REPLACE ".*\\[([^]]+)\\]$" "\\1" lib "${l}")
  list(APPEND needed "${lib}")
  if(lib MATCHES "^libcuda\\.so" OR lib MATCHES "^libcudart" OR lib MATCHES "^libnvidia" OR lib MATCHES "^libnccl")
    string(APPEND errors "  links ${lib}: the driver and NCCL must be loaded with dlopen at run time, the runtime not at all\n")
  endif()
endforeach()

list(LENGTH exported n_exported)
if(errors)
  message(FATAL_ERROR "libflame.so export check failed for ${LIB}:\n${errors}")
endif()
message(STATUS "ok: ${n_exported} flame_* functions exported with version FLAME_1, matching flame.h; "
               "SONAME libflame.so.${SOVERSION}; NEEDED: ${needed}")
