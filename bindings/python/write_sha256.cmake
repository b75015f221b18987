# cmake -DOUT=<file> "-DFILES=<a;b;...>" -P write_sha256.cmake, run from the repository root:
# writes "<sha256>  <relative path>" lines, the format `sha256sum -c` reads.
set(_lines "")
foreach(f ${FILES})
  file(SHA256 "${f}" _h)
  string(APPEND _lines "${_h}  ${f}\n")
endforeach()
file(WRITE "${OUT}" "${_lines}")
