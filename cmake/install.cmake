# cmake --install of the library, included by the top-level CMakeLists.txt after src/.
#
#   <prefix>/include/flashserve/          the public headers (and the generated version.h)
#   <prefix>/lib/libflashserve_attention.a   flashserve::attention, the C++ API (attention.h)
#   <prefix>/lib/libflashserve_c.so       flashserve::c, the C API (c_api.h) the Python package loads
#   <prefix>/lib/cmake/flashserve/        flashserveConfig.cmake, its version file and the targets
#   <prefix>/lib/pkgconfig/flashserve.pc  the C++ API for pkg-config users
#   <prefix>/bin/flashserve               the command line
#   <prefix>/share/flashserve/            its data (data/: the workload length traces)
#
# Two components: `library` (headers, libraries, the CMake package, flashserve.pc; needs only the
# flashserve_attention and flashserve_c targets built) and `cli` (the executable and its data);
# cmake --install installs both, --component one of them.
#
# A downstream project: find_package(flashserve 0.1 REQUIRED) and
# target_link_libraries(app PRIVATE flashserve::attention). tests/install/ is one, built by CI.
include(CMakePackageConfigHelpers)

set(FLASHSERVE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashserve)

set_target_properties(flashserve_attention PROPERTIES EXPORT_NAME attention)
set_target_properties(flashserve_c PROPERTIES EXPORT_NAME c)
# The installed binaries keep the run-time path of the libraries they were linked with from outside
# the system's directories (the CUDA toolkit's libcudart, a pip-installed libcublasLt): without it
# an installed libflashserve_c.so or flashserve would find them only through LD_LIBRARY_PATH.
set_target_properties(flashserve_c flashserve PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flashserve
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT library FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/flashserve/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashserve COMPONENT library)
install(TARGETS flashserve_attention flashserve_c EXPORT flashserveTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT library)
install(TARGETS flashserve RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
# The executable looks for these at <its folder>/${FLASHSERVE_DATA_FROM_BIN} (src/CMakeLists.txt).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/ DESTINATION ${CMAKE_INSTALL_DATADIR}/flashserve
        COMPONENT cli)

install(EXPORT flashserveTargets NAMESPACE flashserve:: FILE flashserveTargets.cmake
        DESTINATION ${FLASHSERVE_CMAKE_DIR} COMPONENT library)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashserveConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flashserveConfig.cmake
                              INSTALL_DESTINATION ${FLASHSERVE_CMAKE_DIR})
# 0.x: a minor version may change the API, so a request for 0.1 accepts 0.1.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashserveConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashserveConfig.cmake
              ${PROJECT_BINARY_DIR}/flashserveConfigVersion.cmake
        DESTINATION ${FLASHSERVE_CMAKE_DIR} COMPONENT library)

# pkg-config: the prefix is found from the .pc file's own folder, so the installed tree can move
# (cmake --install --prefix, a copied tree) like the CMake package can.
file(RELATIVE_PATH FLASHSERVE_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" FLASHSERVE_PC_TO_PREFIX "${FLASHSERVE_PC_TO_PREFIX}")
set(FLASHSERVE_PC_LIBS "-L\${libdir} -lflashserve_attention -pthread")
if(FLASHSERVE_WITH_CUDA)
  # libflashserve_attention.a holds the CUDA kernels: a program linking it needs the CUDA runtime
  # (shared, as CUDA::cudart is; it loads the driver only when a CUDA call is made, so a machine
  # without a GPU runs the CPU path).
  # The folder of the libcudart CUDA::cudart names (CUDAToolkit_LIBRARY_DIR is not always it).
  get_target_property(FLASHSERVE_CUDART CUDA::cudart IMPORTED_LOCATION)
  get_filename_component(FLASHSERVE_CUDART_DIR "${FLASHSERVE_CUDART}" DIRECTORY)
  string(APPEND FLASHSERVE_PC_LIBS
         " -L${FLASHSERVE_CUDART_DIR} -Wl,-rpath,${FLASHSERVE_CUDART_DIR} -lcudart")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/flashserve.pc.in ${PROJECT_BINARY_DIR}/flashserve.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashserve.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT library)
