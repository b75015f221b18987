#!/bin/sh
# Regenerates kjv.txt, the embedded pre-training corpus of dst-pretrain, from Debian's bible-kjv and
# bible-kjv-text packages (the King James Version, 1611; see README.md for the licence):
#   apt-get install bible-kjv bible-kjv-text && tools/dst-pretrain/data/make_corpus.sh
# Books: Genesis, Exodus, Ruth, Matthew, Mark, Luke, John, Acts. One document per chapter (documents
# are separated by a blank line), one verse per line, verse numbers and chapter headings removed.
# BIBLE and BIBLE_DATA_DIR override the program and its data folder (e.g. an unpacked .deb).
set -eu
BIBLE=${BIBLE:-bible}
out=$(dirname "$0")/kjv.txt
: >"$out"
for book in Gen Exo Rut Mat Mar Luk Joh Act; do
    "$BIBLE" ${BIBLE_DATA_DIR:+-p "$BIBLE_DATA_DIR"} -l100000 "${book}1:1-${book}999:999"
done | awk '
    /^$/ { next }
    /^[1-3]? ?[A-Z][A-Za-z ]+ [0-9]+$/ { if (started) print ""; started = 1; next }
    { sub(/^ *[0-9]+ /, ""); print }
' >"$out"
