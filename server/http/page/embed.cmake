# embed.cmake: turns the page's files into one C file of byte arrays, at
# build time, in pure CMake (no xxd): cmake -DOUT=file.c -DDIR=dir -P embed.cmake
# Each file NAME.EXT becomes kcd_page_NAME_EXT[] and kcd_page_NAME_EXT_len.
set(files index.html app.js style.css)
set(text "/* generated from server/http/page/ by embed.cmake: do not edit */\n#include <stddef.h>\n")
foreach(f ${files})
  file(READ "${DIR}/${f}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR len "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  # 16 bytes a line keeps the file readable and the compiler happy
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
  string(MAKE_C_IDENTIFIER "kcd_page_${f}" id)
  string(APPEND text "const unsigned char ${id}[] = {\n${bytes}0x00};\n")
  string(APPEND text "const size_t ${id}_len = ${len};\n")
endforeach()
file(WRITE "${OUT}.tmp" "${text}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
