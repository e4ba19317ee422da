#!/usr/bin/env bash
# test_hostile.sh: hostile input (issue 16's reliability report), each case through the CLI:
# the command exits non-zero, prints the exact error (naming the file and what was expected), and
# writes nothing (the listing of the whole scratch tree, sizes and times included, is unchanged).
# Prints PASS/FAIL lines for tests/run.sh; skips (exit 0) when "$SHARDLM_BIN" is not built.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
DATA=${SHARDLM_DATA:-../shared/data}
top=$(mktemp -d /tmp/shardlm_test_hostile_XXXXXX)
trap 'rm -rf "$top"' EXIT
tmp="$top/w" out="$top/out" log="$top/log"   # everything the commands may touch is under $tmp
mkdir -p "$tmp" "$out"
export OMP_NUM_THREADS=1
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; }
listing() { find "$tmp" -printf '%p %s %T@\n' | sort; }

# refuse NAME MESSAGE CMD...: CMD fails, its stderr holds MESSAGE (fixed string), nothing is written
refuse() {
  local name=$1 msg=$2; shift 2
  listing >"$out/before"
  "$@" >"$out/stdout" 2>"$out/stderr"
  local rc=$?
  listing >"$out/after"
  cat "$out/stderr" >>"$log"
  if [ $rc -eq 0 ]; then fail "$name" "exit 0, expected failure"
  elif [ $rc -gt 2 ]; then fail "$name" "exit $rc (crash?): $(head -c 600 "$out/stderr")"
  elif ! grep -qF -- "$msg" "$out/stderr"; then fail "$name" "expected '$msg', got: $(head -c 600 "$out/stderr")"
  elif ! cmp -s "$out/before" "$out/after"; then fail "$name" "files changed: $(diff "$out/before" "$out/after" | head -5)"
  else pass "$name"; fi
}

mkdir -p "$tmp/corpus"
cp "$DATA"/sotu/179*.txt "$tmp/corpus/"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 300 --val-fraction 0.2 >>"$log" 2>&1
tiny=(--model gpt2-tiny --data "$tmp/data" --seq-len 16 --batch-size 2 --threads 1 --eval-interval 0 --sample-tokens 0
      --log-interval 1)
"$BIN" train "${tiny[@]}" --steps 2 --save-dir "$tmp/ck" >>"$log" 2>&1
if [ -f "$tmp/ck/step_00000002/model.safetensors" ]; then pass setup_checkpoint; else fail setup_checkpoint; exit 0; fi
ck="$tmp/ck/step_00000002"
# a copy of the checkpoint to damage: copy CASE
copy() { rm -rf "$tmp/$1"; mkdir -p "$tmp/$1"; cp -r "$ck" "$tmp/$1/"; echo step_00000002 >"$tmp/$1/latest"; }

# ---- row 5: a directory where a file is expected
mkdir -p "$tmp/cfgdir"
refuse config_is_a_directory "$tmp/cfgdir: is a directory, expected a file" \
  "$BIN" train "${tiny[@]}" --steps 1 --config "$tmp/cfgdir" --save-dir "$tmp/never"
copy latestdir; rm "$tmp/latestdir/latest"; mkdir "$tmp/latestdir/latest"
refuse latest_is_a_directory "$tmp/latestdir/latest: is a directory, expected a file" \
  "$BIN" generate --model "$tmp/latestdir" --max-new-tokens 2
refuse resume_latest_is_a_directory "$tmp/latestdir/latest: is a directory, expected a file" \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/latestdir" --resume
copy cfgjsondir; rm "$tmp/cfgjsondir/step_00000002/config.json"; mkdir "$tmp/cfgjsondir/step_00000002/config.json"
refuse config_json_is_a_directory "config.json: is a directory, expected a file" \
  "$BIN" generate --model "$tmp/cfgjsondir" --max-new-tokens 2
refuse train_model_config_json_is_a_directory "config.json: is a directory, expected a file" \
  "$BIN" train "${tiny[@]}" --model "$tmp/cfgjsondir" --steps 1 --save-dir "$tmp/never"

# ---- row 1: a malformed vocab.json through prepare, train and generate --tokenizer
# badtok NAME REPLACEMENT: DIR with the data's tokenizer whose last entry "<|endoftext|>": 299 is replaced
badtok() {
  mkdir -p "$tmp/tok_$1"
  cp "$tmp/data/tokenizer/merges.txt" "$tmp/tok_$1/"
  sed "s/\"<|endoftext|>\": 299}/$2}/" "$tmp/data/tokenizer/vocab.json" >"$tmp/tok_$1/vocab.json"
}
badtok dup '"<|endoftext|>": 5'
badtok frac '"<|endoftext|>": 2.5'
badtok neg '"<|endoftext|>": -1'
badtok big '"<|endoftext|>": 300'
badtok str '"<|endoftext|>": "299"'
badtok alpha '"<|endoftext|>\\u20ac": 299'
for t in dup frac neg big str alpha; do
  case $t in
    dup) msg='token "<|endoftext|>": id 5 is already taken by token "ą"; expected each id in [0, 300) exactly once' ;;
    frac) msg='token "<|endoftext|>": expected an integer id in [0, 300) (the vocab has 300 entries), found 2.5' ;;
    neg) msg='token "<|endoftext|>": expected an integer id in [0, 300) (the vocab has 300 entries), found -1' ;;
    big) msg='token "<|endoftext|>": expected an integer id in [0, 300) (the vocab has 300 entries), found 300' ;;
    str) msg='token "<|endoftext|>": expected an integer id in [0, 300), found a string' ;;
    alpha) msg="token \"<|endoftext|>€\" (id 299): character U+20AC at byte 13 is outside GPT-2's byte alphabet" ;;
  esac
  refuse "vocab_${t}_prepare" "$tmp/tok_$t/vocab.json: $msg" \
    "$BIN" prepare --input "$tmp/corpus" --output "$tmp/never" --tokenizer "$tmp/tok_$t"
  refuse "vocab_${t}_train" "$tmp/tok_$t/vocab.json: $msg" \
    "$BIN" train "${tiny[@]}" --steps 1 --tokenizer "$tmp/tok_$t" --save-dir "$tmp/never"
  refuse "vocab_${t}_generate" "$tmp/tok_$t/vocab.json: $msg" \
    "$BIN" generate --model "$tmp/ck" --tokenizer "$tmp/tok_$t" --max-new-tokens 2
done

# ---- row 12 / 14: training configs, trainer_state.json and manifests are parsed strictly
printf '{"train_micro_batch_size_per_gpu": 2}\n}' >"$tmp/cfg_trailing.json"
refuse config_trailing_data "$tmp/cfg_trailing.json: unexpected data after the JSON value at byte 38 (line 2, column 1)" \
  "$BIN" train "${tiny[@]}" --steps 1 --config "$tmp/cfg_trailing.json" --save-dir "$tmp/never"
printf '{"optimizer": {"type": "AdamW", "params": {"lr": 0.001, "lr": 10}}}' >"$tmp/cfg_dup.json"
refuse config_duplicate_key "$tmp/cfg_dup.json: key \"lr\" appears twice in object optimizer.params; expected each key once" \
  "$BIN" train "${tiny[@]}" --steps 1 --config "$tmp/cfg_dup.json" --save-dir "$tmp/never"
{ printf '{"shardlm": '; for i in $(seq 1200); do printf '['; done; for i in $(seq 1200); do printf ']'; done; printf '}'; } >"$tmp/cfg_deep.json"
refuse config_too_deep "$tmp/cfg_deep.json: JSON nested deeper than 1000 levels (the parser's nesting limit) at byte 1011" \
  "$BIN" train "${tiny[@]}" --steps 1 --config "$tmp/cfg_deep.json" --save-dir "$tmp/never"
copy mantrail
echo '{}' >>"$tmp/mantrail/step_00000002/manifest.json"
refuse manifest_trailing_data "manifest.json: unexpected data after the JSON value" \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/mantrail" --resume
refuse convert_manifest_trailing_data "manifest.json: unexpected data after the JSON value" \
  "$BIN" convert --checkpoint "$tmp/mantrail" --output "$tmp/never"

# ---- row 7: one flipped byte in model.safetensors is caught by every load path
flip() {  # flip FILE: invert the byte 10 from its end (inside the data section)
  local f=$1 off=$(( $(stat -c %s "$1") - 10 ))
  local b=$(od -An -tu1 -j $off -N1 "$f" | tr -d ' ')
  printf "$(printf '\\%03o' $(( 255 - b )))" | dd of="$f" bs=1 seek=$off conv=notrunc status=none
}
copy flipped; flip "$tmp/flipped/step_00000002/model.safetensors"
msg="$tmp/flipped/step_00000002/model.safetensors: checksum"
refuse flipped_byte_generate "$msg" "$BIN" generate --model "$tmp/flipped" --max-new-tokens 2
refuse flipped_byte_generate_tag_dir "$msg" "$BIN" generate --model "$tmp/flipped/step_00000002" --max-new-tokens 2
refuse flipped_byte_train_model "$msg" "$BIN" train "${tiny[@]}" --model "$tmp/flipped" --steps 1 --save-dir "$tmp/never"
refuse flipped_byte_resume "$msg" "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/flipped" --resume
refuse flipped_byte_convert "$msg" "$BIN" convert --checkpoint "$tmp/flipped" --output "$tmp/never"
if "$BIN" generate --model "$tmp/flipped" --max-new-tokens 2 --no-verify >>"$log" 2>&1; then pass no_verify_loads_anyway
else fail no_verify_loads_anyway; fi
if "$BIN" generate --model "$ck" --max-new-tokens 2 >>"$log" 2>&1; then pass intact_checkpoint_generates
else fail intact_checkpoint_generates; fi

# ---- row 6: out-of-range integers in trainer_state.json (reached past the manifest with --no-verify)
copy bigstep
sed -i 's/"step":[^,]*,/"step": 1e30,/' "$tmp/bigstep/step_00000002/trainer_state.json"
refuse trainer_state_step_checked_by_manifest "trainer_state.json: " \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/bigstep" --resume
refuse trainer_state_step_1e30 \
  "$tmp/bigstep/step_00000002/trainer_state.json: \"step\" must be an integer in [0, 9007199254740992], found 1e+30" \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/bigstep" --resume --no-verify
copy bigbatch
sed -i 's/"batch":[^,]*,/"batch": 1e30,/' "$tmp/bigbatch/step_00000002/trainer_state.json"
refuse loader_batch_1e30 "loader position: \"batch\" must be an integer in [0, 9007199254740992], found 1e+30" \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/bigbatch" --resume --no-verify
copy statedup
sed -i 's/^{/{"step": 1e6,/' "$tmp/statedup/step_00000002/trainer_state.json"
refuse trainer_state_duplicate_key "trainer_state.json: key \"step\" appears twice in the top-level object" \
  "$BIN" train "${tiny[@]}" --steps 3 --save-dir "$tmp/statedup" --resume --no-verify

# ---- row 8: a safetensors header length one less (a trailing padding space dropped)
shorten_header() {  # shorten_header FILE: header length - 1, written back little-endian
  local f=$1 n=0 i
  local -a b=($(od -An -tu1 -N8 "$f"))
  for i in 7 6 5 4 3 2 1 0; do n=$(( n * 256 + b[i] )); done
  n=$(( n - 1 ))
  for i in 0 1 2 3 4 5 6 7; do printf "$(printf '\\%03o' $(( (n >> (8 * i)) & 255 )))"; done |
    dd of="$f" bs=1 conv=notrunc status=none
}
mkdir -p "$tmp/hfoff"; cp "$ck/model.safetensors" "$ck/config.json" "$tmp/hfoff/"
shorten_header "$tmp/hfoff/model.safetensors"
msg="$tmp/hfoff/model.safetensors: the tensors end at data byte"
refuse header_off_by_one_generate "$msg" "$BIN" generate --model "$tmp/hfoff" --tokenizer "$tmp/data/tokenizer" --max-new-tokens 2
refuse header_off_by_one_train "$msg" "$BIN" train "${tiny[@]}" --model "$tmp/hfoff" --steps 1 --save-dir "$tmp/never"
copy ckoff; shorten_header "$tmp/ckoff/step_00000002/model.safetensors"
refuse header_off_by_one_checkpoint_no_verify "$tmp/ckoff/step_00000002/model.safetensors: the tensors end at data byte" \
  "$BIN" generate --model "$tmp/ckoff" --max-new-tokens 2 --no-verify

# ---- row 9: a save killed before its commit leaves .tmp-step_*; the next training start removes it
{ SHARDLM_FAULT=0:2:save "$BIN" train "${tiny[@]}" --steps 2 --save-interval 1 --save-dir "$tmp/killed" >>"$log" 2>&1; } 2>/dev/null
stale=$(ls -d "$tmp/killed"/.tmp-step_00000002-* 2>/dev/null | wc -l)
if [ "$stale" -eq 1 ] && grep -qx step_00000001 "$tmp/killed/latest"; then pass killed_save_leaves_a_tmp_dir
else fail killed_save_leaves_a_tmp_dir "stale: $stale"; fi
"$BIN" train "${tiny[@]}" --steps 2 --save-dir "$tmp/killed" --resume >"$out/stdout" 2>>"$log"
if grep -q "^note: removed 1 stale temporary checkpoint entry from $tmp/killed (left by an interrupted save)$" "$out/stdout" &&
   [ -z "$(ls -d "$tmp/killed"/.tmp-* 2>/dev/null)" ] && grep -qx step_00000002 "$tmp/killed/latest"; then
  pass next_start_removes_the_stale_tmp_dir
else fail next_start_removes_the_stale_tmp_dir "$(grep note "$out/stdout"; ls -a "$tmp/killed")"; fi

# ---- row 13: broken validation shards are fatal, whatever the breakage, naming the shard
datacopy() { rm -rf "$tmp/$1"; cp -r "$tmp/data" "$tmp/$1"; }
datacopy valmagic
printf '\x00\x00\x00\x00' | dd of="$tmp/valmagic/val_000000.bin" bs=1 conv=notrunc status=none
refuse val_bad_magic_is_fatal "$tmp/valmagic/val_000000.bin: bad magic 0: expected 20240520" \
  "$BIN" train "${tiny[@]}" --data "$tmp/valmagic" --eval-interval 1 --steps 1 --save-dir "$tmp/never"
datacopy valtoken   # token 2 of the shard becomes 65535, outside the 300-token vocab
printf '\xff\xff' | dd of="$tmp/valtoken/val_000000.bin" bs=1 seek=$((1024 + 4)) conv=notrunc status=none
refuse val_bad_token_is_fatal "$tmp/valtoken/val_000000.bin: token 2 is 65535, expected an id below the vocab size 300" \
  "$BIN" train "${tiny[@]}" --data "$tmp/valtoken" --eval-interval 1 --steps 1 --no-save --metrics "$out/m.jsonl"

# ---- row 12: the model's vocab_size and the tokenizer's must agree where the CLI pairs them
sed 's/"vocab_size":[^,]*,/"vocab_size": 512,/' "$ck/config.json" >"$tmp/cfg512.json"
refuse config_json_vocab_differs \
  "the model's vocab_size 512 ($tmp/cfg512.json) differs from the tokenizer's 300 tokens ($tmp/data/tokenizer)" \
  "$BIN" train "${tiny[@]}" --model "$tmp/cfg512.json" --steps 1 --save-dir "$tmp/never"
refuse checkpoint_vocab_differs_train \
  "the model's vocab_size 300 ($tmp/ck) differs from the tokenizer's 50257 tokens ($DATA/gpt2)" \
  "$BIN" train "${tiny[@]}" --model "$tmp/ck" --tokenizer "$DATA/gpt2" --steps 1 --save-dir "$tmp/never"
refuse checkpoint_vocab_differs_generate \
  "the model's vocab_size 300 ($tmp/ck) differs from the tokenizer's 50257 tokens ($DATA/gpt2)" \
  "$BIN" generate --model "$tmp/ck" --tokenizer "$DATA/gpt2" --max-new-tokens 2
