#!/usr/bin/env bash
# test_layers.sh: the source tree keeps its layers (docs/architecture.md, "Layers"). Every #include "..."
# under src/ and include/ is read; a file may include only files of its own layer or of a lower one,
# and no chain of includes may come back to where it started (tsort finds such a loop). A header in
# include/shardlm/ belongs to the layer of the src/ file that implements it (same base name).
set -u
cd "$(dirname "$0")/../.."
layers="base comm ops model io train infer cli"   # lowest first
rank() { local i=0; for l in $layers; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }

# the layer a path (as written after #include, or a file of the tree) belongs to
owner() {
  case $1 in
    shardlm/ops.h | shardlm/ops_list.h | shardlm/ops_profile.h) echo ops ;;
    shardlm/*.h)
      local b; b=$(basename "$1" .h)
      local f; f=$(find src -name "$b.c" -not -path 'src/cli/*' | head -1)
      [ -z "$f" ] && f=$(find src -name "$b.c" | head -1)
      if [ -n "$f" ]; then echo "$f" | cut -d/ -f2; else echo "?"; fi ;;
    src/*) echo "$1" | cut -d/ -f2 ;;
    include/shardlm/*) owner "shardlm/$(basename "$1")" ;;
    *) echo "$1" | cut -d/ -f1 ;;
  esac
}

up=0; unknown=0; edges=$(mktemp); trap 'rm -f "$edges"' EXIT
for f in $(find src include -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort); do
  from=$(owner "$f"); rf=$(rank "$from")
  for inc in $(grep -o '^#include "[^"]*"' "$f" | sed 's/#include "//; s/"$//'); do
    case $inc in shardlm/*) target=include/$inc ;; *) target=src/$inc ;; esac
    [ -f "$target" ] || [ -f "$(dirname "$f")/$inc" ] || continue   # a local header next to the file
    [ -f "$target" ] || target=$(dirname "$f")/$inc
    echo "$f $target" >>"$edges"
    to=$(owner "$target"); rt=$(rank "$to")
    if [ "$rt" -lt 0 ] || [ "$rf" -lt 0 ]; then
      echo "  $f ($from) includes $inc ($to): a file outside the layers"; unknown=$((unknown + 1))
    elif [ "$rt" -gt "$rf" ]; then
      echo "  $f ($from) includes $inc, which is in the higher layer $to"; up=$((up + 1))
    fi
  done
done
if [ $up -eq 0 ] && [ $unknown -eq 0 ]; then echo "PASS includes_never_go_up_a_layer"
else echo "FAIL includes_never_go_up_a_layer ($up going up, $unknown outside the layers)"; fi
if loops=$(tsort "$edges" 2>&1 >/dev/null) && [ -z "$loops" ]; then echo "PASS no_include_loops"
else echo "FAIL no_include_loops"; echo "$loops" | head -20; fi
n=$(wc -l <"$edges")
if [ "$n" -gt 100 ]; then echo "PASS layer_check_read_the_tree ($n includes)"; else echo "FAIL layer_check_read_the_tree (only $n includes)"; fi
