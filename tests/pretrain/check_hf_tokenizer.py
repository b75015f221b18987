#!/usr/bin/env python3
"""dst-pretrain's tokenizer against transformers' BertTokenizer (uncased) on the same vocabulary.

    check_hf_tokenizer.py DST_PRETRAIN VOCAB TEXT...

Tokenizes the first 400 lines of each TEXT with both and compares the ids line by line, once with
VOCAB and once with VOCAB extended by every character of the texts (as itself and as a "##"
continuation, also lower-cased and decomposed), so that exotic characters become pieces rather than
[UNK]. Exits 77 (ctest: skipped) when transformers is not importable, 1 on the first difference, 0
when all agree.
"""
import inspect
import os
import subprocess
import sys
import tempfile
import unicodedata

try:
    from transformers import BertTokenizer
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"transformers is not importable ({e.__class__.__name__}: {e}); skipped")
    sys.exit(77)


def load(vocab):
    # transformers >= 5 takes the vocabulary as `vocab` (its BertTokenizer runs on the tokenizers
    # library); older versions as `vocab_file` (the Python BasicTokenizer + WordpieceTokenizer).
    if "vocab" in inspect.signature(BertTokenizer.__init__).parameters:
        hf = BertTokenizer(vocab=vocab, do_lower_case=True, tokenize_chinese_chars=True)
    else:
        hf = BertTokenizer(vocab_file=vocab, do_lower_case=True, tokenize_chinese_chars=True)
    with open(vocab, encoding="utf-8") as f:
        n = len(set(line.rstrip("\n") for line in f))
    if len(hf.get_vocab()) != n:
        print(f"transformers did not load {vocab} ({len(hf.get_vocab())} of {n} tokens)")
        sys.exit(1)
    return hf


def compare(prog, vocab, texts):
    hf = load(vocab)
    checked = 0
    for path in texts:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(400), f)]
        ours = subprocess.run([prog, "tokenize", "--vocab", vocab, "-"], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, check=True).stdout.split("\n")
        for i, line in enumerate(lines):
            want = hf.convert_tokens_to_ids(hf.tokenize(line))
            got = [int(t) for t in ours[i].split()]
            if got != want:
                print(f"{path}:{i + 1} ({vocab}): {line!r}\n  transformers: {want}\n  dst-pretrain: {got}")
                sys.exit(1)
            checked += 1
    return checked


def main():
    prog, vocab, texts = sys.argv[1], sys.argv[2], sys.argv[3:]
    checked = compare(prog, vocab, texts)
    with open(vocab, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f]
    have = set(tokens)
    extra = []
    for path in texts:
        with open(path, encoding="utf-8") as f:
            for ch in sorted(set(f.read())):
                if ch.isspace() or unicodedata.category(ch).startswith("C"):
                    continue
                for c in [ch, ch.lower()] + list(unicodedata.normalize("NFD", ch.lower())):
                    for t in (c, "##" + c):
                        if t not in have:
                            have.add(t)
                            extra.append(t)
    with tempfile.TemporaryDirectory() as d:
        wide = os.path.join(d, "vocab_wide.txt")
        with open(wide, "w", encoding="utf-8") as f:
            f.write("\n".join(tokens + extra) + "\n")
        checked += compare(prog, wide, texts)
    print(f"{checked} lines agree with transformers' BertTokenizer (two vocabularies, {len(extra)} extra pieces)")


if __name__ == "__main__":
    main()
