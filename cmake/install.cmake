# Installation: `cmake --install build [--prefix DIR]` lays Remora out as
#
#   bin/remora                                 the CLI
#   bin/rocprof-attach -> ../<pythondir>/rocprof-attach   (REMORA_INSTALL_ROCPROF_ATTACH)
#   <libdir>/libremora.so.0.1.0, .so.0, .so    the C API (include/remora/remora.h)
#   <libdir>/libremora-agent.so                the in-target agent
#   <libdir>/libremora-tool.so                 the default tool (docs/tool.md)
#   <libdir>/librocprofiler-sdk-rocattach.so.1.0.0, .so.1, .so
#   <libdir>/cmake/remora/remoraConfig.cmake   find_package(remora): remora::remora, remora::headers
#   <libdir>/pkgconfig/remora.pc               pkg-config remora
#   include/remora/*.h, include/rocattach.h, include/rocprofiler-sdk-rocattach/
#   <pythondir>/remora/                        the Python package (default share/remora/python)
#   share/doc/remora/                          README, docs/*.md, examples/tool
#
# <libdir> is GNUInstallDirs' CMAKE_INSTALL_LIBDIR ("lib" for /usr/local and
# most prefixes on Debian; lib/<multiarch> for /usr). The agent and the
# default tool must sit in the same directory as libremora.so: libremora.so,
# the CLI (<bin>/../lib) and the Python package find them there.
#
# The package files (remoraConfig.cmake, remora.pc) locate everything
# relative to their own position, so the install is relocatable and
# `--prefix` at install time is honoured (tests/install checks both).
#
# Included last from the top-level CMakeLists.txt, once every target exists.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REMORA_INSTALL_PYTHONDIR "${CMAKE_INSTALL_DATADIR}/remora/python" CACHE STRING
    "Where the Python package (remora/) and the rocprof-attach script go, relative to the prefix; add it to PYTHONPATH")
option(REMORA_INSTALL_ROCPROF_ATTACH "Install bin/rocprof-attach (a link to the Python script); off when ROCm's own is wanted" ON)
set(REMORA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/remora" CACHE STRING
    "Where remoraConfig.cmake goes, relative to the prefix")

# The CLI finds the agent in <exe>/../lib, then in the libdir compiled into
# src/attach (REMORA_INSTALL_LIBDIR). With a libdir that is not "lib"
# (Debian multiarch under /usr, lib64 elsewhere) neither matches, and an
# installed `remora attach` would need REMORA_AGENT_PATH: say so now rather
# than at the first attach. (libremora.so and the Python package are not
# affected: they look next to libremora.so first.)
if(TARGET remora_attach)
  get_target_property(_remora_attach_defs remora_attach COMPILE_DEFINITIONS)
  set(_remora_compiled_libdir "")
  foreach(_def IN LISTS _remora_attach_defs)
    if(_def MATCHES "^REMORA_INSTALL_LIBDIR=\"?([^\"]*)\"?$")
      set(_remora_compiled_libdir "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(NOT CMAKE_INSTALL_LIBDIR STREQUAL "lib" AND NOT _remora_compiled_libdir STREQUAL CMAKE_INSTALL_FULL_LIBDIR)
    message(WARNING
      "Remora installs its libraries in ${CMAKE_INSTALL_FULL_LIBDIR}, but the CLI looks for the agent in "
      "<bin>/../lib and in ${_remora_compiled_libdir} (src/attach/CMakeLists.txt, REMORA_INSTALL_LIBDIR). "
      "An installed `remora` will need REMORA_AGENT_PATH=${CMAKE_INSTALL_FULL_LIBDIR}/libremora-agent.so; "
      "or configure with -DCMAKE_INSTALL_LIBDIR=lib.")
  endif()
endif()

# --- programs and libraries ---------------------------------------------------

# The CLI links the engine statically: no RPATH needed. rocattach carries
# $ORIGIN (compat/rocattach) to find libremora.so.0 next to itself.
set(_remora_install_targets remora remora_capi remora-agent)
foreach(_t IN ITEMS remora-tool remora-render rocprofiler-sdk-rocattach)
  if(TARGET ${_t})
    list(APPEND _remora_install_targets ${_t})
  endif()
endforeach()
install(TARGETS ${_remora_install_targets}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  # SHARED libraries: libfoo.so.X.Y.Z, the SONAME link libfoo.so.X and the
  # development link libfoo.so (what -lremora and find_package use).
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# --- headers ------------------------------------------------------------------

# include/remora/{remora,tool}.h, include/remora/compat/tnfctl.h,
# include/rocattach.h, include/rocprofiler-sdk-rocattach/rocattach.h.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

# --- CMake package: find_package(remora) ----------------------------------------

get_target_property(_remora_capi_version remora_capi VERSION)
get_target_property(_remora_capi_soversion remora_capi SOVERSION)
get_target_property(_remora_capi_name remora_capi OUTPUT_NAME)
set(REMORA_CAPI_LIBRARY_FILE
    "${CMAKE_SHARED_LIBRARY_PREFIX}${_remora_capi_name}${CMAKE_SHARED_LIBRARY_SUFFIX}.${_remora_capi_version}")
set(REMORA_CAPI_SONAME "${CMAKE_SHARED_LIBRARY_PREFIX}${_remora_capi_name}${CMAKE_SHARED_LIBRARY_SUFFIX}.${_remora_capi_soversion}")

# Paths for remoraConfig.cmake.in, made relative to the prefix by
# configure_package_config_file (PACKAGE_<var>).
set(REMORA_CONFIG_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
set(REMORA_CONFIG_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(REMORA_CONFIG_BINDIR "${CMAKE_INSTALL_BINDIR}")
set(REMORA_CONFIG_PYTHONDIR "${REMORA_INSTALL_PYTHONDIR}")
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/remoraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/remoraConfig.cmake
  INSTALL_DESTINATION ${REMORA_INSTALL_CMAKEDIR}
  PATH_VARS REMORA_CONFIG_INCLUDEDIR REMORA_CONFIG_LIBDIR REMORA_CONFIG_BINDIR REMORA_CONFIG_PYTHONDIR)
# 0.x: a minor release may change the API (semantic versioning's rule for
# 0.y.z), so only the same major.minor is compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/remoraConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/remoraConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/remoraConfigVersion.cmake
  DESTINATION ${REMORA_INSTALL_CMAKEDIR})

# --- pkg-config: remora.pc --------------------------------------------------------

# The prefix is taken relative to the .pc file (${pcfiledir}, understood by
# pkg-config and pkgconf), so `cmake --install --prefix` and moving the tree
# keep it right. Absolute dirs (-DCMAKE_INSTALL_LIBDIR=/opt/...) are kept as given.
set(_remora_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(REMORA_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _remora_pc_up "/remora-prefix/${_remora_pc_dir}" "/remora-prefix")
  string(REGEX REPLACE "/$" "" _remora_pc_up "${_remora_pc_up}")
  set(REMORA_PC_PREFIX "\${pcfiledir}/${_remora_pc_up}")
endif()
foreach(_d IN ITEMS LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(REMORA_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(REMORA_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/remora.pc.in ${PROJECT_BINARY_DIR}/cmake/remora.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/remora.pc DESTINATION ${_remora_pc_dir})

# --- Python -------------------------------------------------------------------

# Pure ctypes, nothing to compile: the package is copied as it is. It finds
# libremora.so through $REMORA_LIBRARY or the dynamic loader (ldconfig, or
# LD_LIBRARY_PATH for a private prefix); see docs/python.md.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/remora
  DESTINATION ${REMORA_INSTALL_PYTHONDIR}
  PATTERN "__pycache__" EXCLUDE
  PATTERN "*.pyc" EXCLUDE)
# The script imports the package lying next to its real path, so a link
# from bin works.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/python/rocprof-attach DESTINATION ${REMORA_INSTALL_PYTHONDIR})
if(REMORA_INSTALL_ROCPROF_ATTACH)
  file(RELATIVE_PATH _remora_bin_to_py "/remora-prefix/${CMAKE_INSTALL_BINDIR}"
       "/remora-prefix/${REMORA_INSTALL_PYTHONDIR}/rocprof-attach")
  # A relative link, made at install time under $DESTDIR and the install-time prefix.
  install(CODE "
    set(_link \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/rocprof-attach\")
    file(MAKE_DIRECTORY \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
    message(STATUS \"Installing: \${_link}\")
    file(REMOVE \"\${_link}\")
    file(CREATE_LINK \"${_remora_bin_to_py}\" \"\${_link}\" SYMBOLIC)")
endif()

# --- documentation and the example tool ----------------------------------------

file(GLOB _remora_docs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${_remora_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The sources only, not what a build next to them left behind.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/tool DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
  PATTERN "build*" EXCLUDE
  PATTERN "*.so" EXCLUDE
  PATTERN "*.o" EXCLUDE)
