# Man pages generated from the programs' own --help by help2man (Debian's
# help2man) while they build, so a page never falls behind a flag:
# convgrad-server(8) and convgrad(1), gzipped (-n: reproducible) as Debian
# installs them. -DCG_MAN=OFF builds without them (and without help2man).
option(CG_MAN "Generate the man pages with help2man" ON)
if(CG_MAN)
  find_program(HELP2MAN help2man REQUIRED)
  find_program(GZIP gzip REQUIRED)
endif()

# cg_man_page(TARGET SECTION DESCRIPTION COMPONENT comp
#             [INCLUDE file.h2m] [COMMANDS])
# The page of TARGET's program in man SECTION; INCLUDE adds help2man
# sections; COMMANDS adds one section per subcommand from `PROGRAM CMD
# --help` (cmake/man-commands.cmake). The program runs from PATH, so its
# usage line names it without the build directory.
function(cg_man_page target section description)
  cmake_parse_arguments(M "COMMANDS" "COMPONENT;INCLUDE" "" ${ARGN})
  if(NOT CG_MAN)
    return()
  endif()
  set(dir ${PROJECT_BINARY_DIR}/man)
  set(page ${dir}/${target}.${section})
  set(includes)
  set(deps ${target})
  if(M_INCLUDE)
    list(APPEND includes --include=${M_INCLUDE})
    list(APPEND deps ${M_INCLUDE})
  endif()
  if(M_COMMANDS)
    set(commands ${dir}/${target}-commands.h2m)
    add_custom_command(
      OUTPUT ${commands}
      COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:${target}>
              -DOUT=${commands} -P ${PROJECT_SOURCE_DIR}/cmake/man-commands.cmake
      DEPENDS ${target} ${PROJECT_SOURCE_DIR}/cmake/man-commands.cmake
      VERBATIM)
    list(APPEND includes --include=${commands})
    list(APPEND deps ${commands})
  endif()
  add_custom_command(
    OUTPUT ${page}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${CMAKE_COMMAND} -E env "PATH=$<TARGET_FILE_DIR:${target}>:$ENV{PATH}"
            ${HELP2MAN} --no-info --section=${section} --name=${description}
            "--version-string=${target} ${CG_VERSION}" ${includes}
            --output=${page} ${target}
    COMMAND ${GZIP} -9nf ${page}
    DEPENDS ${deps}
    COMMENT "help2man ${target}.${section}"
    VERBATIM)
  add_custom_target(${target}_man ALL DEPENDS ${page}.gz)
  install(FILES ${page}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section}
          COMPONENT ${M_COMPONENT})
endfunction()
