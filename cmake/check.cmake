# The test command's targets, included by the top-level CMakeLists.txt after every subdirectory:
#
#   test_programs  every executable and library defined under tests/, bench/, tools/ (and examples/), found
#                  by walking the directories, so a new test program needs no entry here. They are
#                  not in `all` (see FLAME_TESTS_IN_ALL), so that the first build is the library
#                  and the examples only.
#   check          builds test_programs, then runs ctest in parallel (FLAME_CHECK_JOBS, default: the
#                  number of processors) without the label kernels-full (the exhaustive NVRTC matrix,
#                  about 26 CPU-minutes, which CI runs: ctest -L kernels-full).
include(ProcessorCount)

# flame_collect_targets(VAR DIR): appends to VAR every buildable target defined in DIR and below.
function(flame_collect_targets var dir)
  set(found ${${var}})
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      list(APPEND found ${t})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS subdirs)
    flame_collect_targets(found ${d})
  endforeach()
  set(${var} ${found} PARENT_SCOPE)
endfunction()

set(_flame_test_targets "")
foreach(_dir tests bench examples)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_dir}/CMakeLists.txt)
    get_property(_added DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY SUBDIRECTORIES)
    if(${PROJECT_SOURCE_DIR}/${_dir} IN_LIST _added)
      flame_collect_targets(_flame_test_targets ${PROJECT_SOURCE_DIR}/${_dir})
    endif()
  endif()
endforeach()
# tools/ (flame-train): every directory added from under it, however deep the add_subdirectory.
get_property(_added DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY SUBDIRECTORIES)
foreach(_dir IN LISTS _added)
  if(_dir MATCHES "^${PROJECT_SOURCE_DIR}/tools/")
    flame_collect_targets(_flame_test_targets ${_dir})
  endif()
endforeach()
add_custom_target(test_programs)
add_dependencies(test_programs flame ${_flame_test_targets})

ProcessorCount(_flame_nproc)
if(_flame_nproc LESS 1)
  set(_flame_nproc 2)
endif()
set(FLAME_CHECK_JOBS ${_flame_nproc} CACHE STRING "Tests that `check` runs side by side (ctest --parallel)")
add_custom_target(check
  COMMAND ${CMAKE_CTEST_COMMAND} --output-on-failure --no-tests=error --parallel ${FLAME_CHECK_JOBS}
          --label-exclude kernels-full
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  USES_TERMINAL
  COMMENT "ctest --parallel ${FLAME_CHECK_JOBS} (without the label kernels-full)")
add_dependencies(check test_programs)
