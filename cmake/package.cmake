# Installing Shardwise as a C++ package (issue 40): `cmake --install build --prefix P` puts
#   P/include/shardwise/*.h                 the public headers (include/shardwise, version.h)
#   P/lib/libshardwise.a                    every library of the tree (core ... engine, api)
#   P/lib/libshardwise_cuda.a               the CUDA backend and NCCL group (CUDA builds)
#   P/lib/cmake/Shardwise/*.cmake           find_package(Shardwise): Shardwise::shardwise, ::cuda
#   P/lib/pkgconfig/shardwise.pc            pkg-config --cflags --libs shardwise
#   P/bin/shardwise, P/share/shardwise/configs/
# Internal headers are not installed: the public ones include only each other.
# The package's libraries are one archive each, made of the objects the tree's own libraries
# were built from (nothing is compiled twice); what they link is listed once, in
# ShardwiseConfig.cmake, found again on the user's machine.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(sw_pkg_cpu_libs sw_core sw_kernels sw_models sw_offload sw_comm sw_sharding sw_planner
    sw_checkpoint sw_engine sw_api)
set(sw_pkg_objects)
foreach(lib ${sw_pkg_cpu_libs})
  list(APPEND sw_pkg_objects $<TARGET_OBJECTS:${lib}>)
endforeach()
add_library(sw_package STATIC ${sw_pkg_objects})
set_target_properties(sw_package PROPERTIES OUTPUT_NAME shardwise EXPORT_NAME shardwise
                      LINKER_LANGUAGE CXX)
target_compile_features(sw_package INTERFACE cxx_std_20)
target_include_directories(sw_package INTERFACE
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# Defined by ShardwiseConfig.cmake before it loads the targets.
target_link_libraries(sw_package INTERFACE $<INSTALL_INTERFACE:Shardwise::dependencies>)
install(TARGETS sw_package EXPORT ShardwiseTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT ShardwiseTargets NAMESPACE Shardwise:: FILE ShardwiseTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Shardwise COMPONENT dev)

set(SW_PACKAGE_HAS_CUDA FALSE)
set(SW_PACKAGE_CUDA_HINTS "")
if(TARGET sw_cuda)
  set(SW_PACKAGE_HAS_CUDA TRUE)
  set(sw_pkg_cuda_objects $<TARGET_OBJECTS:sw_cuda>)
  if(TARGET sw_comm_nccl)
    list(APPEND sw_pkg_cuda_objects $<TARGET_OBJECTS:sw_comm_nccl>)
  endif()
  add_library(sw_package_cuda STATIC ${sw_pkg_cuda_objects})
  set_target_properties(sw_package_cuda PROPERTIES OUTPUT_NAME shardwise_cuda
                        EXPORT_NAME cuda_archive LINKER_LANGUAGE CXX)
  target_link_libraries(sw_package_cuda INTERFACE sw_package
                        $<INSTALL_INTERFACE:Shardwise::cuda_dependencies>)
  # Its registrars (device allocator, Ops, NCCL group) run at program start: linked whole.
  add_library(sw_package_cuda_whole INTERFACE)
  set_target_properties(sw_package_cuda_whole PROPERTIES EXPORT_NAME cuda)
  target_link_libraries(sw_package_cuda_whole INTERFACE
                        "$<BUILD_INTERFACE:$<LINK_LIBRARY:WHOLE_ARCHIVE,sw_package_cuda>>"
                        "$<INSTALL_INTERFACE:$<LINK_LIBRARY:WHOLE_ARCHIVE,Shardwise::cuda_archive>>")
  install(TARGETS sw_package_cuda sw_package_cuda_whole EXPORT ShardwiseCudaTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  install(EXPORT ShardwiseCudaTargets NAMESPACE Shardwise:: FILE ShardwiseCudaTargets.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Shardwise COMPONENT dev)
  foreach(lib ${SW_NCCL} ${SW_CUDNN})
    get_filename_component(dir ${lib} DIRECTORY)
    string(APPEND SW_PACKAGE_CUDA_HINTS " ${dir}")
  endforeach()
endif()

configure_package_config_file(cmake/ShardwiseConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/ShardwiseConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Shardwise NO_SET_AND_CHECK_MACRO)
# 0.x: a new minor version may change the API, so only the same minor version matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/ShardwiseConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/ShardwiseConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/ShardwiseConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Shardwise COMPONENT dev)

# pkg-config: the same libraries as flags; the prefix relative to the .pc file's folder.
file(RELATIVE_PATH SW_PC_PREFIX_REL /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" SW_PC_PREFIX_REL "${SW_PC_PREFIX_REL}")
get_filename_component(sw_blas_dir ${SW_OPENBLAS} DIRECTORY)
get_filename_component(sw_blas_name ${SW_OPENBLAS} NAME)
set(SW_PC_LIBS "-ldnnl -L${sw_blas_dir} -l:${sw_blas_name}")
configure_file(cmake/shardwise.pc.in ${PROJECT_BINARY_DIR}/cmake/shardwise.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/shardwise.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

install(DIRECTORY include/shardwise ${PROJECT_BINARY_DIR}/include/shardwise
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
# The tool, with the folders of the libraries it was linked with outside the system's (CUDA's)
# as its RPATH; the example configs.
set_target_properties(shardwise PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS shardwise RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT dev)
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/shardwise/configs COMPONENT dev)

# A Debian package of the same (scripts/package_check.sh): `cpack -G DEB` in the build folder.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME shardwise-dev)
set(CPACK_PACKAGE_VENDOR "Shardwise")
set(CPACK_PACKAGE_CONTACT "Shardwise developers <shardwise@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Shardwise: train sharded transformers (FSDP/ZeRO) from C++")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
# What a program built against the package needs (the CUDA libraries, outside Debian's
# archive here, are not listed: a CUDA build's package expects them where it was built).
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libopenmpi-dev, libopenblas0-openmp, libdnnl-dev, liburing-dev, nlohmann-json3-dev, libpcre2-dev, libsentencepiece-dev, libicu-dev, libgomp1")
if(SW_NATIVE)
  # The archives hold code for this machine's CPU (-march=native): the package is for machines
  # like it. Configure with -DSW_NATIVE=OFF for one that runs on any x86-64.
  set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
      "${CPACK_PACKAGE_DESCRIPTION_SUMMARY}\n Built with -march=native: for CPUs like the build machine's.")
endif()
include(CPack)
