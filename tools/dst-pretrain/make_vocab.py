#!/usr/bin/env python3
"""Builds a WordPiece vocabulary (vocab.txt, one token per line) from a text corpus.

    make_vocab.py CORPUS OUT [--size N] [--cased]

Words come from BERT's basic tokenization, written out here in Python (the C tokenizer of
dst-pretrain implements the same rules): control characters dropped, whitespace normalised, CJK
characters and punctuation split off, lower-casing and accent stripping (NFD, combining marks
removed) unless --cased. Training is the WordPiece merge procedure: start from the characters (a
word's first character as itself, the others as ``##c``), then repeatedly merge the adjacent pair
(a, b) that occurs most often over the corpus's word counts (the frequency criterion of BPE, which
Hugging Face's WordPiece trainer also uses; the likelihood score count(ab) / (count(a) · count(b))
of the WordPiece paper favours the letters of rare words on a corpus this small), until the
vocabulary has N entries. Ties are broken by the pair's text, so the output depends only on the
corpus. The five special tokens [PAD] [UNK] [CLS] [SEP] [MASK] come first (ids 0-4).
"""
import argparse
import collections
import sys
import unicodedata

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def is_punctuation(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, lower=True):
    out = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or is_control(c):
            continue
        if is_whitespace(c):
            out.append(" ")
        elif is_cjk(cp):
            out.append(" " + c + " ")
        else:
            out.append(c)
    words = []
    for tok in unicodedata.normalize("NFC", "".join(out)).split():
        if lower:
            tok = "".join(ch for ch in unicodedata.normalize("NFD", tok.lower())
                          if unicodedata.category(ch) != "Mn")
        cur = []
        for ch in tok:
            if is_punctuation(ch):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(ch)
            else:
                cur.append(ch)
        if cur:
            words.append("".join(cur))
    return words


def merged(a, b):
    return a + b[2:]


def train(word_counts, size):
    words = [[w[0]] + ["##" + c for c in w[1:]] for w in word_counts]
    counts = list(word_counts.values())
    vocab = list(SPECIALS)
    seen = set(vocab)
    for sym in sorted({s for w in words for s in w}):
        if sym not in seen:
            vocab.append(sym)
            seen.add(sym)
    pairs = collections.Counter()
    syms = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for s in w:
            syms[s] += counts[i]
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += counts[i]
            where[(a, b)].add(i)
    while len(vocab) < size and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        new = merged(*best)
        if new not in seen:
            vocab.append(new)
            seen.add(new)
        for i in sorted(where.pop(best, ())):
            w, n = words[i], counts[i]
            for s in w:
                syms[s] -= n
            for p in zip(w, w[1:]):
                pairs[p] -= n
                if pairs[p] <= 0:
                    del pairs[p]
                where[p].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for s in out:
                syms[s] += n
            for p in zip(out, out[1:]):
                pairs[p] += n
                where[p].add(i)
        pairs.pop(best, None)
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=4000)
    ap.add_argument("--cased", action="store_true")
    args = ap.parse_args()
    wc = collections.Counter()
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            wc.update(basic_tokenize(line, lower=not args.cased))
    vocab = train(dict(sorted(wc.items())), args.size)
    with open(args.out, "w", encoding="utf-8") as f:
        for t in vocab:
            f.write(t + "\n")
    print(f"{args.out}: {len(vocab)} tokens from {sum(wc.values())} words ({len(wc)} distinct)", file=sys.stderr)


if __name__ == "__main__":
    main()
