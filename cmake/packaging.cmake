# Debian packages with CPack, one per install component:
#
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr
#   cmake --build build -j && (cd build && cpack -G DEB)
#
#   convgrad-server    the server, its private libcgkernels (LIBDIR/convgrad),
#                      the systemd unit, /etc/default/convgrad, the man page;
#                      creates the system user convgrad
#   libcgclient0.2     libcgclient.so.0.2 and libcgcore.so.0.2, its public
#                      dependency: one ABI, one soname version, one package
#                      (Debian policy 8.1: named after the soname)
#   libcgclient-dev    headers (cg/ without engine.h, cgc/), the .so links,
#                      cgclient.pc and cgcore.pc, the CMake package
#   convgrad-cli       the convgrad CLI and its man page
#   python3-convgrad   the Python package with convgrad.v1
#
# Every package carries /usr/share/doc/PACKAGE/copyright (Apache-2.0, as
# LICENSE in the source tree); libcgclient-dev the changelog for C callers
# too. The shlibs file that makes other packages' dpkg-shlibdeps depend on
# libcgclient0.2 is generated for every package with a shared object (CPack
# has no per-package switch), so convgrad-server's also names its private
# libcgkernels, which nothing else links.
#
# Dependencies on Debian's libraries come from dpkg-shlibdeps
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS, dpkg-dev and file), those between the
# packages from the component dependencies, exact versions.
# A fault-injection build (CG_FAULT_INJECT) corrupts results on request:
# no package may carry it.
if(CG_FAULT_INJECT)
  return()
endif()
set(CPACK_PACKAGE_NAME convgrad)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# The Maintainer field of every package and the signature of its Debian
# changelog; the project's one contact (a rebuild under another name
# passes -DCPACK_PACKAGE_CONTACT="Name <address>").
if(NOT CPACK_PACKAGE_CONTACT)
  set(CPACK_PACKAGE_CONTACT "The convgrad developers <maintainers@convgrad.dev>")
endif()
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL server libs dev cli python)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_STRIP_FILES ON)
# dpkg-shlibdeps sees libcgcore.so.0.2 (needed by the server and the CLI)
# in the build tree; the dependency on its package comes from the component
# dependencies below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
    ${PROJECT_BINARY_DIR}/kernels ${PROJECT_BINARY_DIR}/client)
# Refuses a prefix other than /usr (cmake/packaging-check.cmake).
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/packaging-check.cmake)
set(CPACK_CONVGRAD_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})

set(deb ${PROJECT_SOURCE_DIR}/cmake/deb)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_SERVER_PACKAGE_NAME convgrad-server)
set(CPACK_DEBIAN_SERVER_PACKAGE_SECTION net)
set(CPACK_COMPONENT_SERVER_DEPENDS libs)
# adduser for the system user, procps for the unit's ExecReload (/bin/kill).
set(CPACK_DEBIAN_SERVER_PACKAGE_DEPENDS "adduser, procps")
set(CPACK_DEBIAN_SERVER_PACKAGE_SUGGESTS convgrad-cli)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA
    ${deb}/convgrad-server/conffiles ${deb}/convgrad-server/postinst
    ${deb}/convgrad-server/prerm ${deb}/convgrad-server/postrm)
set(CPACK_DEBIAN_SERVER_DESCRIPTION
    "convolution gradients over gRPC: the server
convgrad-server computes the gradients of convolution layers
(ConvolutionBackwardData, ConvolutionBackwardWeights, their ConvTranspose
forms and a layer's whole backward) for remote callers with oneDNN, on a
pool of worker threads pinned to cores. The package runs it as the
systemd service convgrad-server.service, as the system user convgrad,
sandboxed, on 127.0.0.1:50051 and /run/convgrad/convgrad.sock; settings in
/etc/default/convgrad.")

set(CPACK_DEBIAN_LIBS_PACKAGE_NAME libcgclient${CG_SOVERSION})
set(CPACK_DEBIAN_LIBS_PACKAGE_SECTION libs)
# dpkg's ldconfig trigger (CPack's own postinst and postrm call ldconfig
# too, which the trigger makes redundant but not wrong).
set(CPACK_DEBIAN_LIBS_PACKAGE_CONTROL_EXTRA ${deb}/libcgclient/triggers)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIBS_DESCRIPTION
    "convolution gradients over gRPC: the C client library
libcgclient calls a convgrad server: chunked uploads from the caller's
memory, retries with backoff, round_robin over replicas, TLS, tokens and
shared-memory regions. libcgcore, also here, holds the problem types,
validation, shape inference and the plain-C reference; neither loads
oneDNN or OpenMP.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libcgclient-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DEPENDS libs)
# cgc/client.h includes <grpc/status.h>; cgclient.pc requires grpc's.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS libgrpc-dev)
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "convolution gradients over gRPC: the C client's development files
Headers (cgc/client.h, cg/*.h), pkg-config files (cgclient.pc, cgcore.pc)
and the CMake package (find_package(convgrad), convgrad::cgclient) of
libcgclient and libcgcore. CHANGELOG.md says what changed for C callers.")

set(CPACK_DEBIAN_CLI_PACKAGE_NAME convgrad-cli)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION net)
set(CPACK_COMPONENT_CLI_DEPENDS libs)
set(CPACK_DEBIAN_CLI_DESCRIPTION
    "convolution gradients over gRPC: the command-line client
convgrad asks a convgrad server for health and its capabilities, runs any
op from flags, .npy files or oneDNN graph JSON and checks the result
against a local reference, smoke-tests every op, and benchmarks.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-convgrad)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_COMPONENT_PYTHON_DEPENDS libs)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-numpy")
# convgrad.torch needs torch; convgrad.v1 protobuf and grpcio.
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS
    "python3-torch, python3-protobuf, python3-grpcio")
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
    ${deb}/python3-convgrad/postinst ${deb}/python3-convgrad/prerm)
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
    "convolution gradients over gRPC: the Python package
convgrad is a ctypes binding of libcgclient (convgrad.Client) and
convgrad.torch.offload, which moves the backward of a PyTorch model's
convolutions to a convgrad server. convgrad.v1 holds the protobuf and
grpcio modules of the wire schema, generated from the same build.")

# The Debian changelog a native package carries (Debian policy 12.7): one
# entry per release, pointing to CHANGELOG.md. Its date is the
# configuration's, or SOURCE_DATE_EPOCH's for a reproducible build.
string(TIMESTAMP cg_deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
file(WRITE ${PROJECT_BINARY_DIR}/debian-changelog
     "convgrad (${PROJECT_VERSION}) stable; urgency=medium\n\n"
     "  * Release ${PROJECT_VERSION}. What changed for C callers:\n"
     "    /usr/share/doc/libcgclient-dev/CHANGELOG.md (CHANGELOG.md in the\n"
     "    source tree).\n\n"
     " -- ${CPACK_PACKAGE_CONTACT}  ${cg_deb_date}\n")
find_program(GZIP gzip REQUIRED)
add_custom_command(
  OUTPUT ${PROJECT_BINARY_DIR}/changelog.gz
  COMMAND ${CMAKE_COMMAND} -E copy ${PROJECT_BINARY_DIR}/debian-changelog
          ${PROJECT_BINARY_DIR}/changelog
  COMMAND ${GZIP} -9nf ${PROJECT_BINARY_DIR}/changelog
  DEPENDS ${PROJECT_BINARY_DIR}/debian-changelog VERBATIM)
add_custom_target(cg_deb_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/changelog.gz)
foreach(comp server libs dev cli python)
  string(TOUPPER ${comp} COMP)
  install(FILES ${deb}/copyright ${PROJECT_BINARY_DIR}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${CPACK_DEBIAN_${COMP}_PACKAGE_NAME}
          COMPONENT ${comp})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/libcgclient-dev
        COMPONENT dev)

include(CPack)
