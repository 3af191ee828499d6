# man-commands.cmake - the COMMANDS and COMMON OPTIONS sections of
# convgrad(1), as a help2man --include file, from the CLI's own help texts:
# `PROGRAM --help` lists the commands, `PROGRAM CMD --help` describes each
# (its text before "Common options:"), and the common options come once.
# Usage: cmake -DPROGRAM=path/to/convgrad -DOUT=file.h2m -P man-commands.cmake

# Text as lines of roff inside .nf/.fi: backslashes and minus signs
# escaped, a leading dot or quote neutralised.
function(roff_lines text out_var)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REPLACE "-" "\\-" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out_var} ".nf\n${text}\n.fi\n" PARENT_SCOPE)
endfunction()

function(help_of args out_var)
  execute_process(COMMAND ${PROGRAM} ${args} --help OUTPUT_VARIABLE text
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} ${args} --help exited ${rc}")
  endif()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

help_of("" main)
# "Commands:" then "  NAME   what it does" lines (continuations are
# indented further), up to the first empty line.
string(REGEX MATCH "\nCommands:\n(.*)" block "${main}")
string(REGEX REPLACE "\n\n.*" "" block "${CMAKE_MATCH_1}")
string(REGEX MATCHALL "\n  [a-z]+ " names "\n${block}")
if(NOT names)
  message(FATAL_ERROR "no commands in `${PROGRAM} --help`")
endif()

set(page "[COMMANDS]\n")
foreach(n ${names})
  string(STRIP "${n}" cmd)
  help_of("${cmd}" text)
  string(FIND "${text}" "\nCommon options:\n" cut)
  if(cut LESS 0)
    message(FATAL_ERROR "`${PROGRAM} ${cmd} --help` has no Common options")
  endif()
  string(SUBSTRING "${text}" 0 ${cut} own)
  string(SUBSTRING "${text}" ${cut} -1 common)
  string(REGEX REPLACE "\n+$" "" own "${own}")
  roff_lines("${own}" body)
  string(APPEND page ".SS \"convgrad ${cmd}\"\n${body}")
endforeach()

# The common options, the same after every command (the exit codes that
# follow them are in the main help, DESCRIPTION).
string(REGEX REPLACE "^\nCommon options:\n" "" common "${common}")
string(REGEX REPLACE "\n+Exit codes:.*" "" common "${common}")
roff_lines("${common}" body)
string(APPEND page "[COMMON OPTIONS]\n${body}")
file(WRITE ${OUT} "${page}")
