#!/usr/bin/env python3
"""dst-pretrain's tokenizer against transformers' BertTokenizer (uncased) on the same vocabulary.

    check_hf_tokenizer.py DST_PRETRAIN VOCAB TEXT...

Tokenizes the first 400 lines of each TEXT with both and compares the ids line by line. Exits 77
(ctest: skipped) when transformers is not importable, 1 on the first difference, 0 when all agree.
"""
import subprocess
import sys

try:
    from transformers import BertTokenizer
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"transformers is not importable ({e.__class__.__name__}: {e}); skipped")
    sys.exit(77)


def main():
    prog, vocab, texts = sys.argv[1], sys.argv[2], sys.argv[3:]
    hf = BertTokenizer(vocab_file=vocab, do_lower_case=True, tokenize_chinese_chars=True)
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
                print(f"{path}:{i + 1}: {line!r}\n  transformers: {want}\n  dst-pretrain: {got}")
                sys.exit(1)
            checked += 1
    print(f"{checked} lines agree with transformers' BertTokenizer")


if __name__ == "__main__":
    main()
