# CPack: one Debian package, libdstransformer_<version>_<arch>.deb, holding everything `cmake --install`
# installs under /usr (library, header, pkg-config and CMake files, dst-convert, and the Java and Python
# bindings when they are built). `cpack -G DEB` in the build folder writes it; the ctest entry
# package_deb builds it and runs its programs from an unpacked copy (tests/install/check_deb.cmake).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libdstransformer)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_CONTACT "libdstransformer maintainers <libdstransformer@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/package)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)  # fast to write; the CUDA library dominates the size
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # a shlibs file and the ldconfig trigger for the library
# The run-time dependencies from Debian, by hand: dpkg-shlibdeps knows no package for the CUDA libraries
# (they come from the CUDA toolkit, which must be on the loader's path for a CUDA build).
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6, libgcc-s1, libgomp1, libopenblas0 | libopenblas0-pthread")
include(CPack)
