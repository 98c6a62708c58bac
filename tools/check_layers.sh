#!/usr/bin/env bash
# The layering of src/ (DESIGN.md: cli/server → runtime → model/tokenizer/chat/
# grammar → backend/formats → quant/core): each folder includes only from its own
# level and the levels beneath it — so the backend knows no model or runtime
# and the model no runtime. Prints every #include that breaks the rule and
# exits 1; run by ctest (test name layering).
#   tools/check_layers.sh [SRC_DIR]
set -u
src=${1:-$(dirname "$0")/../src}
cd "$src" || exit 2
# folder: the quern folders its files may include (besides its own)
allowed() {
  case $1 in
    core) echo "core" ;;
    quant) echo "core quant" ;;
    formats) echo "core quant formats" ;;
    backend) echo "core quant formats backend" ;;
    tokenizer | chat | model | grammar) echo "core quant formats backend model tokenizer chat grammar" ;;
    runtime) echo "core quant formats backend model tokenizer chat grammar runtime" ;;
    server) echo "core quant formats backend model tokenizer chat grammar runtime server" ;;
    cli) echo "core quant formats backend model tokenizer chat grammar runtime server cli" ;;
    *) echo "?" ;;
  esac
}
bad=0
while IFS= read -r -d '' f; do
  top=${f#./}
  top=${top%%/*}
  ok=" $(allowed "$top") "
  while IFS= read -r line; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$line")
    dir=${inc%%/*}
    [ "$dir" = "$inc" ] && continue  # same-folder include
    case $dir in core | quant | formats | backend | tokenizer | chat | model | grammar | runtime | server | cli) ;; *) continue ;; esac
    if [[ $ok != *" $dir "* ]]; then
      echo "src/${f#./}: includes \"$inc\" ($top may not depend on $dir)"
      bad=1
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
done < <(find . -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) -print0)
exit $bad
