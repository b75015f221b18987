"""Runs the code blocks of a getting-started page verbatim, in page order, as one bash script.

    python3 run_doc.py PAGE.md WORKDIR      (WORKDIR is emptied first)

A fenced block preceded by the HTML comment `<!-- doc-test: file NAME -->` is written to WORKDIR/NAME;
a ```sh block is run; `<!-- doc-test: skip -->` leaves the next block out (the setup steps the test does
itself, e.g. installing into a prefix). Every other block is an error, so a page cannot grow code that
no test runs. The script runs under `bash -euo pipefail` in WORKDIR with the caller's environment (the
ctest entry sets the variables the page names: PREFIX, DST_SOURCE, DST_BUILD). Standard library only.
"""
import os
import re
import shutil
import subprocess
import sys

BLOCK = re.compile(r"(?:<!-- doc-test: (?P<directive>[^>]*?) -->\s*\n)?^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$",
                   re.S | re.M)


def script_of(text: str, page: str) -> str:
    out = []
    for i, m in enumerate(BLOCK.finditer(text), 1):
        directive = (m.group("directive") or "").split()
        info, body = m.group("info").strip(), m.group("body")
        where = f"{page}: block {i} (```{info})"
        if directive[:1] == ["skip"]:
            continue
        if directive[:1] == ["file"] and len(directive) == 2:
            name = directive[1]
            out.append(f"# {where} -> {name}\ncat > {name} <<'DOC_TEST_EOF'\n{body}DOC_TEST_EOF\n")
        elif directive:
            sys.exit(f"{where}: unknown directive {' '.join(directive)!r}")
        elif info in ("sh", "bash", "shell"):
            out.append(f"# {where}\n{body}")
        else:
            sys.exit(f"{where}: a block the test neither runs nor writes; mark it <!-- doc-test: file NAME --> "
                     "or <!-- doc-test: skip -->")
    if not out:
        sys.exit(f"{page}: no code block to run")
    return "set -euo pipefail\nset -x\n" + "\n".join(out)


def main():
    page, work = sys.argv[1], sys.argv[2]
    with open(page, encoding="utf-8") as f:
        script = script_of(f.read(), os.path.basename(page))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    path = os.path.join(work, "page.sh")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script)
    rc = subprocess.call(["bash", path], cwd=work)
    if rc:
        sys.exit(f"{page}: the page's commands failed (exit {rc}); the script is {path}")
    print(f"{page}: every block ran")


if __name__ == "__main__":
    main()
