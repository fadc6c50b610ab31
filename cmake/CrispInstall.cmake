# cmake/CrispInstall.cmake — `cmake --install` rules: the static library, the public headers and
# the CMake package, so that a consumer writes
#   find_package(crisp 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE crisp::crisp)
# with -DCMAKE_PREFIX_PATH=<prefix>. tests/consumer/ is such a project (scripts/test.sh builds it).
include(CMakePackageConfigHelpers)

set(CRISP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/crisp"
    CACHE STRING "Where crispConfig.cmake is installed, relative to the prefix")

install(TARGETS crisp EXPORT crispTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/crisp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/crisp)
install(EXPORT crispTargets NAMESPACE crisp:: DESTINATION ${CRISP_INSTALL_CMAKEDIR})

# The installed config re-finds what the static library's link interface names (OpenMP, and with
# the CUDA backend CUDA::cudart), so it records how this build was made.
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/crispConfig.cmake.in
  ${PROJECT_BINARY_DIR}/crispConfig.cmake INSTALL_DESTINATION ${CRISP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/crispConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)  # 0.x: a minor release may change the API
install(FILES ${PROJECT_BINARY_DIR}/crispConfig.cmake ${PROJECT_BINARY_DIR}/crispConfigVersion.cmake
        DESTINATION ${CRISP_INSTALL_CMAKEDIR})
