# `cmake --install`: the public headers, libflashtile.a and libflashtile.so, the C API library, the CLI, and
# the CMake package (lib/cmake/flashtile) that find_package(flashtile [COMPONENTS CUDA]) reads:
#   flashtile::flashtile_static   libflashtile.a
#   flashtile::flashtile_shared   libflashtile.so
#   flashtile::flashtile          the static one (what the project's own tests run against; no run-time path)
# tests/consumer is a project built against it by scripts/test.sh.
include(CMakePackageConfigHelpers)
set(_ft_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/flashtile)

install(TARGETS flashtile flashtile_shared EXPORT flashtileTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS flashtile_capi LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flashtile DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET flashtile_cli)
  install(TARGETS flashtile_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT flashtileTargets NAMESPACE flashtile:: DESTINATION ${_ft_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashtileConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/flashtileConfig.cmake INSTALL_DESTINATION ${_ft_cmake_dir})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashtileConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashtileConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/flashtileConfigVersion.cmake
        DESTINATION ${_ft_cmake_dir})
