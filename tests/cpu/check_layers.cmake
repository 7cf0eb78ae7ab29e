# The layer order of src/: every #include "<folder>/..." between folders must point downward.
#
#   cmake -DSRC=<repo>/src -P check_layers.cmake
#
# Each folder of src/ is one layer; a file may include headers of its own folder and of folders
# of a lower rank, never of a higher or equal rank (equal ranks are siblings: io, runtime and
# interop know nothing of each other). A folder missing from the table below is an error, so that
# a new layer is placed on purpose. There are no exceptions: any upward or sideways edge fails.

cmake_minimum_required(VERSION 3.22)

set(LAYER_RANK
  core=0
  runtime=1 io=1 interop=1
  tensor=2
  ops=3
  autograd=4
  dist=5 optim=5
  toolkit=6
  models=7
  api=8)

if(NOT SRC OR NOT IS_DIRECTORY "${SRC}")
  message(FATAL_ERROR "check_layers: pass -DSRC=<repository>/src")
endif()

function(layer_rank folder out)
  foreach(entry IN LISTS LAYER_RANK)
    string(REPLACE "=" ";" kv "${entry}")
    list(GET kv 0 name)
    list(GET kv 1 rank)
    if(name STREQUAL folder)
      set(${out} ${rank} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

file(GLOB folders RELATIVE "${SRC}" "${SRC}/*")
set(problems "")
foreach(folder IN LISTS folders)
  if(IS_DIRECTORY "${SRC}/${folder}")
    layer_rank(${folder} rank)
    if(rank STREQUAL "")
      string(APPEND problems "  src/${folder}/ is not in check_layers.cmake's LAYER_RANK: give it a place in the order\n")
    endif()
  endif()
endforeach()

file(GLOB_RECURSE sources RELATIVE "${SRC}" "${SRC}/*.h" "${SRC}/*.cpp")
set(edges 0)
foreach(file IN LISTS sources)
  string(REGEX MATCH "^[^/]+" from "${file}")
  if(from STREQUAL file)  # a file directly in src/ (none today): no layer
    continue()
  endif()
  layer_rank(${from} from_rank)
  file(STRINGS "${SRC}/${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" inc "${line}")
    string(REGEX MATCH "^[^/]+" to "${inc}")
    if(to STREQUAL inc OR to STREQUAL from)  # same folder
      continue()
    endif()
    layer_rank(${to} to_rank)
    if(to_rank STREQUAL "" OR from_rank STREQUAL "")  # not a layer of src/ (e.g. a system-style path)
      continue()
    endif()
    math(EXPR edges "${edges} + 1")
    if(NOT to_rank LESS from_rank)
      string(APPEND problems "  upward include: src/${file} -> ${inc} (${from} is layer ${from_rank}, ${to} is layer ${to_rank})\n")
    endif()
  endforeach()
endforeach()

if(problems)
  message(FATAL_ERROR "check_layers: the include graph of src/ breaks the layer order:\n${problems}")
endif()
message(STATUS "check_layers: ${edges} includes between layers, all downward")
