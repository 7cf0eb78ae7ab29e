# Installation rules and CPack packages (DEB, RPM, TGZ) for FLAME.
# Included at the end of the top-level CMakeLists.txt, after the `flame` target exists.
#
#   cmake -S . -B build -G Ninja -DCMAKE_INSTALL_PREFIX=/usr   # packages install under /usr
#   cmake --build build && (cd build && cpack -G "DEB;RPM;TGZ")  # -> build/packages/
#
# Components:
#   runtime  libflame.so.X.Y.Z + the SONAME link, license, and the flame-train program when it is
#            built (FLAME_BUILD_TRAINER; its install rule is in tools/flame-train)
#                                                             -> libflame<ABI> (DEB and RPM)
#   dev      flame.h, the libflame.so namelink, CMake package, flame.pc, README, example sources
#                                                             -> libflame-dev (DEB), flame-devel (RPM)
# The CUDA libraries FLAME links (cuBLASLt, NVRTC) are named by package, never the driver package
# (libcuda.so.1 is dlopen'ed at run time). Whether as Depends or only Recommends is
# FLAME_CUDA_PACKAGE_DEPENDENCY (below): by default Depends only when the build found them in files
# that the package manager owns; CUDA from NVIDIA's runfile installer has no packages to depend on. RPMs built on a Debian host
# use the Debian libdir; build RPMs for Fedora/RHEL on such a host (or pass -DCMAKE_INSTALL_LIBDIR=lib64).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FLAME_PKG_SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}/..)
get_filename_component(FLAME_PKG_SOURCE_DIR ${FLAME_PKG_SOURCE_DIR} ABSOLUTE)

# ---------------------------------------------------------------------------------------------
# Metadata (cache variables so that distributors can override them)
# ---------------------------------------------------------------------------------------------
set(FLAME_MAINTAINER "The FLAME authors <flame@example.org>" CACHE STRING "Package maintainer (Name <email>)")
set(FLAME_HOMEPAGE "https://flame.example.org" CACHE STRING "Project homepage for package metadata")
set(FLAME_PACKAGE_RELEASE 1 CACHE STRING "Package release number (the -N of 0.1.0-N)")
# The defaults use the reserved example.org domain (RFC 2606): fine for CI and local packages, but a
# published package must name its real maintainer and homepage. -DFLAME_RELEASE=ON enforces that.
option(FLAME_RELEASE "Build packages for publication (refuses placeholder maintainer/homepage)" OFF)
if(FLAME_RELEASE AND (FLAME_MAINTAINER MATCHES "example\\.org" OR FLAME_HOMEPAGE MATCHES "example\\.org"))
  message(FATAL_ERROR "FLAME_RELEASE=ON: set -DFLAME_MAINTAINER=\"Name <email>\" and -DFLAME_HOMEPAGE=<url> "
                      "(now \"${FLAME_MAINTAINER}\", \"${FLAME_HOMEPAGE}\")")
endif()

if(DEFINED CUDAToolkit_VERSION_MAJOR)
  set(_flame_cuda_major_default ${CUDAToolkit_VERSION_MAJOR})
  set(_flame_cuda_minor_default ${CUDAToolkit_VERSION_MINOR})
else()
  set(_flame_cuda_major_default 13)
  set(_flame_cuda_minor_default 0)
endif()
set(FLAME_CUDA_PACKAGE_MAJOR ${_flame_cuda_major_default} CACHE STRING
    "CUDA major version whose library packages the runtime package depends on")
set(FLAME_CUDA_PACKAGE_MINOR ${_flame_cuda_minor_default} CACHE STRING
    "CUDA minor version used in NVIDIA's package names (cuda-nvrtc-<major>-<minor>)")
set(_M ${FLAME_CUDA_PACKAGE_MAJOR})
set(_m ${FLAME_CUDA_PACKAGE_MINOR})
# Debian's own names (non-free: libcublaslt12, libnvrtc12) or NVIDIA's CUDA repository names
# (libcublas-13-0 ships libcublasLt.so.13; cuda-nvrtc-13-0 ships libnvrtc.so.13). Each list below
# is derived from FLAME_CUDA_PACKAGE_MAJOR/MINOR unless its cache variable is set (non-empty).
set(FLAME_DEB_CUDA_DEPENDS "" CACHE STRING
    "Debian Depends: for the CUDA libraries libflame links, never the driver (empty: derived)")
set(FLAME_DEB_SYSTEM_DEPENDS "libc6 (>= 2.34), libgcc-s1 (>= 3.0), libstdc++6 (>= 12)"
    CACHE STRING "Debian Depends: for the C and C++ runtime")
# flame-train (tools/flame-train, in the runtime package when built) links the image codecs. Named
# here because shlibdeps is off (below); each with its Ubuntu name as the alternative.
set(FLAME_DEB_TRAINER_DEPENDS "libpng16-16 | libpng16-16t64, libjpeg62-turbo | libjpeg-turbo8, libwebp7"
    CACHE STRING "Debian Depends: of flame-train (the image codec libraries), added when it is built")
if(TARGET flame-train)
  set(_flame_deb_system_depends "${FLAME_DEB_SYSTEM_DEPENDS}, ${FLAME_DEB_TRAINER_DEPENDS}")
else()
  set(_flame_deb_system_depends "${FLAME_DEB_SYSTEM_DEPENDS}")
endif()
set(FLAME_DEB_SUGGESTS "" CACHE STRING "Debian Suggests: of the runtime package (empty: derived)")
set(FLAME_RPM_CUDA_REQUIRES "" CACHE STRING
    "RPM Requires: for the CUDA libraries libflame links, never the driver (empty: derived)")
set(FLAME_RPM_SUGGESTS "" CACHE STRING "RPM Suggests: of the runtime package (empty: derived)")
# Depends or Recommends for those packages. AUTO (default): Depends when the NVRTC and cuBLASLt
# libraries this build links are owned by dpkg (or rpm) packages, i.e. CUDA came from packages
# (NVIDIA's repository or the distribution); otherwise (NVIDIA's runfile installer, a copied toolkit)
# Recommends, so that `apt install ./libflame1_*.deb` works there: a hard dependency on packages
# that such a machine's sources do not have leaves libflame1 uninstallable. Nothing then checks at
# install time that the libraries exist: libflame.so links them, so a program using it fails to
# start ("libnvrtc.so.13: cannot open shared object file") until the loader finds them (README,
# Installing). DEPENDS / RECOMMENDS force one. RPM has no Recommends in CPack: Suggests there.
set(FLAME_CUDA_PACKAGE_DEPENDENCY AUTO CACHE STRING
    "How the runtime package names the CUDA library packages: AUTO, DEPENDS or RECOMMENDS")
set_property(CACHE FLAME_CUDA_PACKAGE_DEPENDENCY PROPERTY STRINGS AUTO DEPENDS RECOMMENDS)
if(FLAME_CUDA_PACKAGE_DEPENDENCY STREQUAL "AUTO")
  set(_flame_cuda_owned_by "")
  find_program(FLAME_DPKG_QUERY dpkg-query)
  find_program(FLAME_RPM rpm)
  foreach(_lib IN ITEMS "${CUDA_nvrtc_LIBRARY}" "${CUDA_cublasLt_LIBRARY}")
    set(_owner "")
    if(_lib AND EXISTS "${_lib}")
      get_filename_component(_real "${_lib}" REALPATH)
      if(FLAME_DPKG_QUERY)
        execute_process(COMMAND ${FLAME_DPKG_QUERY} -S "${_real}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET
                        OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(_rc EQUAL 0)
          string(REGEX REPLACE ":.*" "" _owner "${_out}")
        endif()
      endif()
      if(NOT _owner AND FLAME_RPM AND NOT FLAME_DPKG_QUERY)
        execute_process(COMMAND ${FLAME_RPM} -qf "${_real}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET
                        OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(_rc EQUAL 0)
          set(_owner "${_out}")
        endif()
      endif()
    endif()
    if(_owner)
      list(APPEND _flame_cuda_owned_by "${_owner}")
    else()
      set(_flame_cuda_owned_by "")
      break()
    endif()
  endforeach()
  if(_flame_cuda_owned_by)
    set(FLAME_CUDA_PACKAGE_FIELD Depends)
    set(_flame_cuda_why "NVRTC and cuBLASLt come from the packages ${_flame_cuda_owned_by}")
  else()
    set(FLAME_CUDA_PACKAGE_FIELD Recommends)
    set(_flame_cuda_why "NVRTC and cuBLASLt (${CUDA_nvrtc_LIBRARY}, ${CUDA_cublasLt_LIBRARY}) are not owned by a package")
  endif()
elseif(FLAME_CUDA_PACKAGE_DEPENDENCY STREQUAL "DEPENDS")
  set(FLAME_CUDA_PACKAGE_FIELD Depends)
  set(_flame_cuda_why "FLAME_CUDA_PACKAGE_DEPENDENCY=DEPENDS")
elseif(FLAME_CUDA_PACKAGE_DEPENDENCY STREQUAL "RECOMMENDS")
  set(FLAME_CUDA_PACKAGE_FIELD Recommends)
  set(_flame_cuda_why "FLAME_CUDA_PACKAGE_DEPENDENCY=RECOMMENDS")
else()
  message(FATAL_ERROR "FLAME_CUDA_PACKAGE_DEPENDENCY=${FLAME_CUDA_PACKAGE_DEPENDENCY}: expected AUTO, DEPENDS or RECOMMENDS")
endif()
# Read by .ci/run, which checks the built .deb against it.
set(FLAME_CUDA_PACKAGE_FIELD ${FLAME_CUDA_PACKAGE_FIELD} CACHE INTERNAL "Depends or Recommends: the runtime package's field for CUDA")
message(STATUS "Packages: libflame${FLAME_ABI_VERSION} names the CUDA library packages under ${FLAME_CUDA_PACKAGE_FIELD} (${_flame_cuda_why})")

set(_flame_deb_cuda_depends "libcublaslt${_M} | libcublas-${_M}-${_m}, libnvrtc${_M} | cuda-nvrtc-${_M}-${_m}")
set(_flame_deb_suggests "libcudnn9-cuda-${_M}, libnccl2")
set(_flame_rpm_cuda_requires "libcublas-${_M}-${_m}, cuda-nvrtc-${_M}-${_m}")
set(_flame_rpm_suggests "libcudnn9-cuda-${_M}, libnccl")
foreach(v DEB_CUDA_DEPENDS DEB_SUGGESTS RPM_CUDA_REQUIRES RPM_SUGGESTS)
  string(TOLOWER ${v} _lv)
  if(FLAME_${v})
    set(_flame_${_lv} "${FLAME_${v}}")
  endif()
endforeach()

set(FLAME_PKG_SUMMARY "GPU tensor library with automatic differentiation (C ABI)")
set(FLAME_PKG_DESCRIPTION
    "FLAME is a GPU-only tensor library with reverse-mode automatic
differentiation. It offers strided tensors, broadcasting elementwise math,
reductions and autograd behind one stable C ABI (flame.h). Kernels are
compiled at run time with NVRTC; matrix products use cuBLASLt. An NVIDIA
driver is needed at run time.")

set(FLAME_RUNTIME_PACKAGE libflame${FLAME_ABI_VERSION})
set(FLAME_PKG_FULL_VERSION ${PROJECT_VERSION}-${FLAME_PACKAGE_RELEASE})

# ---------------------------------------------------------------------------------------------
# Install rules
# ---------------------------------------------------------------------------------------------
install(TARGETS flame EXPORT FlameTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${FLAME_PKG_SOURCE_DIR}/include/flame.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

set(FLAME_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Flame)
install(EXPORT FlameTargets NAMESPACE Flame:: DESTINATION ${FLAME_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${FLAME_PKG_SOURCE_DIR}/packaging/FlameConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/packaging/FlameConfig.cmake
  INSTALL_DESTINATION ${FLAME_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/packaging/FlameConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/packaging/FlameConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/packaging/FlameConfigVersion.cmake
        DESTINATION ${FLAME_CMAKE_DIR} COMPONENT dev)

configure_file(${FLAME_PKG_SOURCE_DIR}/packaging/flame.pc.in ${CMAKE_CURRENT_BINARY_DIR}/packaging/flame.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/packaging/flame.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# Documentation: share/doc/flame (CMAKE_INSTALL_DOCDIR); Debian also wants a copyright file in each
# package's own doc directory.
install(FILES ${FLAME_PKG_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(FILES ${FLAME_PKG_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT dev)
install(FILES ${FLAME_PKG_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${FLAME_RUNTIME_PACKAGE}
        RENAME copyright COMPONENT runtime)
install(FILES ${FLAME_PKG_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/libflame-dev
        RENAME copyright COMPONENT dev)

# Example sources (and the headers they share) plus a CMakeLists.txt that builds them against the
# installed package.
file(GLOB FLAME_EXAMPLE_SOURCES ${FLAME_PKG_SOURCE_DIR}/examples/*.c ${FLAME_PKG_SOURCE_DIR}/examples/*.h)
install(FILES ${FLAME_EXAMPLE_SOURCES} DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT dev)
install(FILES ${FLAME_PKG_SOURCE_DIR}/examples/standalone/CMakeLists.txt
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT dev)

# Debian changelogs (lintian wants /usr/share/doc/<package>/changelog.Debian.gz, gzip -9n).
find_program(FLAME_GZIP gzip)
if(FLAME_GZIP)
  string(TIMESTAMP _flame_date "%a, %d %b %Y %H:%M:%S +0000" UTC)  # honours SOURCE_DATE_EPOCH
  foreach(_pkg ${FLAME_RUNTIME_PACKAGE} libflame-dev)
    if(_pkg STREQUAL "libflame-dev")
      set(_comp dev)
    else()
      set(_comp runtime)
    endif()
    set(_dir ${CMAKE_CURRENT_BINARY_DIR}/packaging/changelog/${_pkg})
    file(MAKE_DIRECTORY ${_dir})
    file(WRITE ${_dir}/changelog.Debian
      "${_pkg} (${FLAME_PKG_FULL_VERSION}) unstable; urgency=medium\n\n"
      "  * Release ${PROJECT_VERSION}. See README.md for what is included.\n\n"
      " -- ${FLAME_MAINTAINER}  ${_flame_date}\n")
    execute_process(COMMAND ${FLAME_GZIP} -9 -n -f ${_dir}/changelog.Debian)
    install(FILES ${_dir}/changelog.Debian.gz DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${_pkg} COMPONENT ${_comp})
  endforeach()
endif()

# ---------------------------------------------------------------------------------------------
# CPack
# ---------------------------------------------------------------------------------------------
set(CPACK_PACKAGE_NAME flame)
set(CPACK_PACKAGE_VENDOR "The FLAME authors")
set(CPACK_PACKAGE_CONTACT "${FLAME_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION "${FLAME_PKG_DESCRIPTION}")
# CPACK_PACKAGE_DESCRIPTION_SUMMARY stays unset on purpose: CPackDeb would prepend it to every
# component's description, giving both .debs the same synopsis. Each package has its own below.
set(CPACK_PACKAGE_HOMEPAGE_URL "${FLAME_HOMEPAGE}")
set(CPACK_RESOURCE_FILE_LICENSE ${FLAME_PKG_SOURCE_DIR}/LICENSE)
set(CPACK_RESOURCE_FILE_README ${FLAME_PKG_SOURCE_DIR}/README.md)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_VERBATIM_VARIABLES ON)
set(CPACK_GENERATOR TGZ)
find_program(FLAME_DPKG_DEB dpkg-deb)
find_program(FLAME_RPMBUILD rpmbuild)
if(FLAME_DPKG_DEB)
  list(APPEND CPACK_GENERATOR DEB)
endif()
if(FLAME_RPMBUILD)
  list(APPEND CPACK_GENERATOR RPM)
endif()

set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_COMPONENT_RUNTIME_DISPLAY_NAME "FLAME shared library")
set(CPACK_COMPONENT_DEV_DISPLAY_NAME "FLAME development files")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "${FLAME_PKG_DESCRIPTION}\n\nThis package contains the shared library.")
set(CPACK_COMPONENT_DEV_DESCRIPTION "${FLAME_PKG_DESCRIPTION}\n\nThis package contains the C header, the CMake package (find_package(Flame)),\nthe pkg-config file and example programs.")
set(CPACK_COMPONENT_DEV_DEPENDS runtime)
# The TGZ is one archive with everything; DEB and RPM are split by component.
set(CPACK_ARCHIVE_COMPONENT_INSTALL OFF)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_RPM_COMPONENT_INSTALL ON)

# ---- DEB ----
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_RELEASE ${FLAME_PACKAGE_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${FLAME_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${FLAME_HOMEPAGE}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# First line: the synopsis (each package its own); the rest: the extended description.
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "${FLAME_PKG_SUMMARY}\n${CPACK_COMPONENT_RUNTIME_DESCRIPTION}")
set(CPACK_DEBIAN_DEV_DESCRIPTION "${FLAME_PKG_SUMMARY} - development files\n${CPACK_COMPONENT_DEV_DESCRIPTION}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${FLAME_RUNTIME_PACKAGE})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
if(FLAME_CUDA_PACKAGE_FIELD STREQUAL "Depends")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "${_flame_deb_system_depends}, ${_flame_deb_cuda_depends}")
else()
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "${_flame_deb_system_depends}")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "${_flame_deb_cuda_depends}")
endif()
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "${_flame_deb_suggests}")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libflame-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${FLAME_RUNTIME_PACKAGE} (= ${FLAME_PKG_FULL_VERSION})")
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE_IS_HOST ON)
# shlibs control file ("libflame 1 libflame1 (>= 0.1.0)").
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)  # the CUDA libraries are not dpkg-managed on build hosts
# ldconfig through a trigger, not through maintainer scripts (lintian: lacks-ldconfig-trigger).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
  ${FLAME_PKG_SOURCE_DIR}/packaging/debian/triggers
  ${FLAME_PKG_SOURCE_DIR}/packaging/debian/postinst
  ${FLAME_PKG_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# ---- RPM ----
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_RELEASE ${FLAME_PACKAGE_RELEASE})
set(CPACK_RPM_PACKAGE_LICENSE MIT)
set(CPACK_RPM_PACKAGE_URL "${FLAME_HOMEPAGE}")
set(CPACK_RPM_PACKAGE_VENDOR "The FLAME authors")
set(CPACK_RPM_PACKAGE_GROUP "Development/Libraries")
set(CPACK_RPM_PACKAGE_DESCRIPTION "${FLAME_PKG_DESCRIPTION}")
set(CPACK_RPM_RUNTIME_PACKAGE_NAME ${FLAME_RUNTIME_PACKAGE})
set(CPACK_RPM_RUNTIME_PACKAGE_SUMMARY "${FLAME_PKG_SUMMARY}")
if(FLAME_CUDA_PACKAGE_FIELD STREQUAL "Depends")
  set(CPACK_RPM_RUNTIME_PACKAGE_REQUIRES "${_flame_rpm_cuda_requires}")
  set(CPACK_RPM_RUNTIME_PACKAGE_SUGGESTS "${_flame_rpm_suggests}")
else()
  set(CPACK_RPM_RUNTIME_PACKAGE_SUGGESTS "${_flame_rpm_cuda_requires}, ${_flame_rpm_suggests}")
endif()
set(CPACK_RPM_DEV_PACKAGE_NAME flame-devel)
set(CPACK_RPM_DEV_PACKAGE_SUMMARY "${FLAME_PKG_SUMMARY} - development files")
set(CPACK_RPM_DEV_PACKAGE_REQUIRES "${FLAME_RUNTIME_PACKAGE} = ${FLAME_PKG_FULL_VERSION}")
set(CPACK_RPM_DEV_PACKAGE_ARCHITECTURE ${CMAKE_SYSTEM_PROCESSOR})
# Automatic requirements stay on (libc, libstdc++), but not for the CUDA libraries: they are named
# by package above, and NVIDIA's packages need not advertise the sonames.
set(CPACK_RPM_SPEC_MORE_DEFINE "%global __requires_exclude ^lib(nvrtc|cublasLt|cublas|cuda)\\\\.so.*$")
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/cmake
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATAROOTDIR}
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATAROOTDIR}/doc)

include(CPack)
