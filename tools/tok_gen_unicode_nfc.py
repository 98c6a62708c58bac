#!/usr/bin/env python3
"""Generate src/tokenizer/unicode_nfc.inc: the tables of quern's NFC normalizer
(src/tokenizer/unicode_nfc.cpp).

    python3 tools/tok_gen_unicode_nfc.py > src/tokenizer/unicode_nfc.inc
    python3 tools/tok_gen_unicode_nfc.py --check     # vs tokenizers' NFC

The data is Unicode 9.0.0: the NFC normalizer of Hugging Face `tokenizers`
0.23.3 (the `unicode-normalization-alignments` crate) carries Unicode 9 tables.
Checked with --check: `tokenizers.normalizers.NFC` agrees with unicodedata2
9.0.0 on every code point alone and on every code point between "a" and
U+0334 (which reorders exactly the marks of combining class > 1), while
Python's own Unicode 14 tables differ on ~100 marks added after Unicode 9
(U+07FD, U+0898.., U+1E130..) and unicodedata2 16.0 on ~120.

unicodedata2 9.0.0 has no wheel for current Pythons; build it from the sdist:

    pip download --no-deps --no-binary :all: unicodedata2==9.0.0.post4 && tar xzf unicodedata2-9.0.0.post4.tar.gz
    cd unicodedata2-9.0.0.post4 && : > unicodedata2/py3/ucnhash.h
    sed -i 's/Py_TYPE(&UCD_Type) = &PyType_Type;/Py_SET_TYPE(\\&UCD_Type, \\&PyType_Type);/' unicodedata2/py3/unicodedata.c
    gcc -O2 -shared -fPIC -w $(python3-config --includes) -Iunicodedata2/py3 -Iunicodedata2 \\
        unicodedata2/py3/unicodedata.c unicodedata2/unicodectype.c -o unicodedata2$(python3-config --extension-suffix)

and put the folder of the module on PYTHONPATH (or pass --ud DIR).

Tables (all derived from unicodedata2's combining(), decomposition() and
normalize()):
- a two-stage trie of 16-bit properties per code point: canonical combining
  class (bits 0-7), NFC_QC=No (bit 8), NFC_QC=Maybe, i.e. the second code
  point of some primary composite (bit 9), has a canonical decomposition
  (bit 10), and "not a boundary" (bit 11): a segment of text may start before
  a code point without bit 11 (ccc 0, NFC_QC=Yes, and its full decomposition
  starts with such a code point), as nothing before it can interact with it;
- the full (recursive) canonical decompositions, sorted by code point;
- the primary composites (pairs that NFC composes: canonical decompositions
  of two code points less the full composition exclusions), sorted by pair.
Hangul syllables are handled algorithmically and are not in the tables.
"""
import sys

SBASE, LBASE, VBASE, TBASE, LCOUNT, VCOUNT, TCOUNT = 0xAC00, 0x1100, 0x1161, 0x11A7, 19, 21, 28
SCOUNT = LCOUNT * VCOUNT * TCOUNT
BLOCK = 128
LIMIT = 0x30000  # no code point at or above this has NFC properties (asserted)


def load_ud():
    if "--ud" in sys.argv:
        sys.path.insert(0, sys.argv[sys.argv.index("--ud") + 1])
    import unicodedata2 as ud
    if ud.unidata_version != "9.0.0":
        sys.exit(f"unicodedata2 {ud.unidata_version}: need 9.0.0 (see the docstring)")
    return ud


def is_hangul(cp):
    return SBASE <= cp < SBASE + SCOUNT


def canon(ud, cp):
    """The one-level canonical decomposition of cp, or None."""
    d = ud.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def full(ud, cp):
    d = canon(ud, cp)
    if d is None:
        return [cp]
    return [y for x in d for y in full(ud, x)]


def build(ud):
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    ccc = {c: ud.combining(chr(c)) for c in cps}
    decomp = {c: full(ud, c) for c in cps if not is_hangul(c) and canon(ud, c) is not None}
    for c, d in decomp.items():
        assert ud.normalize("NFD", chr(c)) == "".join(map(chr, d)), hex(c)
    # Primary composites: two-code-point canonical decompositions that NFC
    # recomposes (the others are the full composition exclusions).
    pairs = {}
    for c in decomp:
        d = canon(ud, c)
        if len(d) == 2 and ud.normalize("NFC", chr(c)) == chr(c):
            pairs[(d[0], d[1])] = c
    excluded = [c for c in decomp if ud.normalize("NFC", chr(c)) != chr(c)]
    seconds = {b for (_, b) in pairs}
    assert all(ccc[a] == 0 for (a, _) in pairs), "the first code point of a pair is a starter"
    props = {}
    for c in cps:
        p = ccc[c]
        if is_hangul(c):
            flags = 0
        else:
            qc_no = ud.normalize("NFC", chr(c)) != chr(c)
            maybe = c in seconds or VBASE <= c < VBASE + VCOUNT or TBASE < c < TBASE + TCOUNT
            first = decomp[c][0] if c in decomp else c
            boundary = ccc[c] == 0 and not qc_no and not maybe and ccc[first] == 0 and first not in seconds
            flags = (256 if qc_no else 0) | (512 if maybe else 0) | (1024 if c in decomp else 0) | \
                (0 if boundary else 2048)
        p |= flags
        if p:
            assert c < LIMIT, hex(c)
            props[c] = p
    assert all(p & ~1024 == 0 for c, p in props.items() if c < 0x300), "the fast path assumes U+0000..U+02FF are plain boundaries"
    return props, decomp, pairs, excluded


def emit(ud, props, decomp, pairs, excluded):
    blocks, index = {}, []
    block_list = []
    for b in range(LIMIT // BLOCK):
        blk = tuple(props.get(b * BLOCK + i, 0) for i in range(BLOCK))
        if blk not in blocks:
            blocks[blk] = len(block_list)
            block_list.append(blk)
        index.append(blocks[blk])
    assert len(block_list) < 256
    out = []
    w = out.append
    w(f"// Generated by tools/tok_gen_unicode_nfc.py from Unicode {ud.unidata_version} (unicodedata2); do not edit.")
    w(f"// {len(decomp)} canonical decompositions, {len(pairs)} primary composites, {len(excluded)} full "
      f"composition exclusions, {len(block_list)} property blocks.")
    w(f"constexpr uint32_t kNfcLimit = 0x{LIMIT:X};")
    w(f"constexpr uint32_t kNfcBlockShift = {BLOCK.bit_length() - 1};")

    def table(decl, items, per):
        w(decl + " = {")
        for k in range(0, len(items), per):
            w("    " + ", ".join(items[k:k + per]) + ",")
        w("};")

    table(f"constexpr uint8_t kNfcStage1[{len(index)}]", [str(x) for x in index], 32)
    flat = [f"0x{v:X}" for blk in block_list for v in blk]
    table(f"constexpr uint16_t kNfcStage2[{len(flat)}]", flat, 16)
    # Decompositions: {code point, offset into kNfcDecompData, length}.
    data, rows = [], []
    for c in sorted(decomp):
        d = decomp[c]
        assert 1 <= len(d) <= 4
        rows.append(f"{{0x{c:X}, {len(data)}, {len(d)}}}")
        data += d
    w("struct NfcDecomp { uint32_t cp; uint16_t off; uint16_t len; };")
    table(f"constexpr NfcDecomp kNfcDecomp[{len(rows)}]", rows, 6)
    table(f"constexpr uint32_t kNfcDecompData[{len(data)}]", [f"0x{x:X}" for x in data], 10)
    # Primary composites: {first << 21 | second, composite}, sorted by key.
    rows = [f"{{0x{(a << 21) | b:X}, 0x{c:X}}}" for (a, b), c in sorted(pairs.items(), key=lambda t: (t[0][0] << 21) | t[0][1])]
    w("struct NfcPair { uint64_t key; uint32_t cp; };")
    table(f"constexpr NfcPair kNfcPairs[{len(rows)}]", rows, 4)
    print("\n".join(out))


def check():
    """Compare unicodedata2 with the NFC normalizer of `tokenizers`."""
    ud = load_ud()
    from tokenizers import normalizers
    nfc = normalizers.NFC()
    bad = 0
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        for s in (chr(c), "a" + chr(c) + "\u0334"):
            if nfc.normalize_str(s) != ud.normalize("NFC", s):
                bad += 1
    print(f"unicode {ud.unidata_version}: {bad} strings differ from tokenizers' NFC", file=sys.stderr)
    return bad == 0


def main():
    if "--check" in sys.argv:
        sys.exit(0 if check() else 1)
    ud = load_ud()
    emit(ud, *build(ud))


if __name__ == "__main__":
    main()
