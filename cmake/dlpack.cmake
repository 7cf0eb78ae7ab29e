# Finds a packaged dlpack.h for the DLPack exchange (src/interop/dlpack.h) and defines the
# INTERFACE target flame_dlpack, which carries FLAME_DLPACK_HEADER="<absolute path>" (the sources
# write `#include FLAME_DLPACK_HEADER`, so no include directory, and nothing else from the
# directory that holds it, enters the build).
#
# Order: -DFLAME_DLPACK_HEADER=<path> if given; dlpack/dlpack.h in the system include path
# (Debian/Ubuntu: libdlpack-dev, DLPack 0.6); only when that is missing, the copy PyTorch ships
# (<torch>/include/dlpack/dlpack.h or <torch>/include/ATen/dlpack.h, DLPack 1.x in recent
# releases), for GPU machines that have PyTorch but no package manager. Otherwise configuration
# stops and says what to install. flame.h itself never includes dlpack.h.
set(FLAME_DLPACK_HEADER "" CACHE FILEPATH "dlpack.h to build the DLPack exchange with (empty: search)")

if(NOT FLAME_DLPACK_HEADER)
  find_path(FLAME_DLPACK_SYSTEM_INCLUDE_DIR NAMES dlpack/dlpack.h DOC "directory holding dlpack/dlpack.h")
  if(FLAME_DLPACK_SYSTEM_INCLUDE_DIR)
    set(_flame_dlpack "${FLAME_DLPACK_SYSTEM_INCLUDE_DIR}/dlpack/dlpack.h")
    set(_flame_dlpack_from "the system include path")
  else()
    find_program(FLAME_PYTHON3 NAMES python3 python)
    if(FLAME_PYTHON3)
      execute_process(
        COMMAND ${FLAME_PYTHON3} -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'include'))"
        OUTPUT_VARIABLE _flame_torch_include OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET RESULT_VARIABLE _flame_torch_rc)
      if(_flame_torch_rc EQUAL 0 AND _flame_torch_include)
        foreach(_c dlpack/dlpack.h ATen/dlpack.h)
          if(NOT _flame_dlpack AND EXISTS "${_flame_torch_include}/${_c}")
            set(_flame_dlpack "${_flame_torch_include}/${_c}")
            set(_flame_dlpack_from "PyTorch (${_flame_torch_include})")
          endif()
        endforeach()
      endif()
    endif()
  endif()
  if(NOT _flame_dlpack)
    message(FATAL_ERROR
      "FLAME needs dlpack.h (the DLPack header) to build its DLPack exchange, and found none:\n"
      "  - not dlpack/dlpack.h in the system include path: install it (Debian/Ubuntu: "
      "apt-get install libdlpack-dev), or\n"
      "  - not in PyTorch's include directory (python3 -c 'import torch' failed or has no dlpack.h), or\n"
      "  - pass -DFLAME_DLPACK_HEADER=/path/to/dlpack.h.")
  endif()
else()
  if(NOT EXISTS "${FLAME_DLPACK_HEADER}")
    message(FATAL_ERROR "FLAME_DLPACK_HEADER=${FLAME_DLPACK_HEADER} does not exist")
  endif()
  set(_flame_dlpack "${FLAME_DLPACK_HEADER}")
  set(_flame_dlpack_from "FLAME_DLPACK_HEADER")
endif()

file(STRINGS "${_flame_dlpack}" _flame_dlpack_version REGEX "^#define DLPACK_(MAJOR_VERSION|MINOR_VERSION|VERSION) ")
string(REGEX REPLACE "#define DLPACK_" "" _flame_dlpack_version "${_flame_dlpack_version}")
message(STATUS "dlpack.h: ${_flame_dlpack} (from ${_flame_dlpack_from}; ${_flame_dlpack_version})")

add_library(flame_dlpack INTERFACE)
target_compile_definitions(flame_dlpack INTERFACE "FLAME_DLPACK_HEADER=\"${_flame_dlpack}\"")
