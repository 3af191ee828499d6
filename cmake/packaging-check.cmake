# Read by cpack (CPACK_PROJECT_CONFIG_FILE) before each generator: Debian
# packages install into /usr, and the build must have been configured for
# it, since the unit's ExecStart, the RUNPATHs and the Python directory are
# fixed at configure time.
if(CPACK_GENERATOR STREQUAL "DEB" AND
   NOT CPACK_CONVGRAD_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR "Debian packages install into /usr, this build into "
          "'${CPACK_CONVGRAD_INSTALL_PREFIX}': configure it with "
          "-DCMAKE_INSTALL_PREFIX=/usr")
endif()
