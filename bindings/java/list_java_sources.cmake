# Writes the .java files SWIG generated in DIR, one per line, to OUT (a javac argument file).
file(GLOB sources "${DIR}/*.java")
list(SORT sources)
string(REPLACE ";" "\n" content "${sources}")
file(WRITE "${OUT}" "${content}\n")
