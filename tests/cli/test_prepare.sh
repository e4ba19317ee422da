#!/usr/bin/env bash
# test_prepare.sh: `shardlm prepare` end to end on a small temporary corpus: shard files and headers,
# the tokenizer copy, prepare.json, sharding by --shard-tokens (and removal of stale shards),
# determinism, --train-tokenizer, a single-file input, a Hugging Face tokenizer.json through prepare, train
# and generate, and bad inputs (missing path, empty directory,
# unreadable file, bad flags) exiting non-zero with a message. Prints PASS/FAIL lines for tests/run.sh.
# Skips silently (exit 0) while "$SHARDLM_BIN" is not an executable.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
DATA=${SHARDLM_DATA:-../shared/data}
tmp=$(mktemp -d /tmp/shardlm_test_prepare_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME COMMAND...: PASS if the command succeeds
  local name=$1; shift
  if "$@" >>"$tmp/log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; failures=$((failures + 1)); tail -n 20 "$tmp/log"; fi
}
header_int() {  # header_int FILE INDEX: the INDEX-th little-endian int32 of the header
  od -An -t d4 -j $(( $2 * 4 )) -N 4 "$1" | tr -d ' '
}

mkdir -p "$tmp/corpus/subdir"
for i in 1 2 3 4 5 6; do
  for j in $(seq 1 40); do echo "Document $i, line $j: the quick brown fox jumps over the lazy dog's back. Ünïcödé $((i * j))."; done >"$tmp/corpus/doc$i.txt"
done
echo "not a text file" >"$tmp/corpus/notes.md"
cp "$DATA/sotu/1790_george_washington_n.txt" "$tmp/corpus/doc7.txt"

# 1. Default GPT-2 tokenizer.
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out" >"$tmp/out1.txt" 2>&1; rc=$?
check prepare_gpt2_succeeds test $rc -eq 0
check prepare_writes_shards test -s "$tmp/out/train_000000.bin" -a -s "$tmp/out/val_000000.bin"
check prepare_copies_tokenizer cmp "$tmp/out/tokenizer/vocab.json" "$DATA/gpt2/encoder.json"
check prepare_copies_merges cmp "$tmp/out/tokenizer/merges.txt" "$DATA/gpt2/vocab.bpe"
check prepare_prints_files grep -q "train_000000.bin" "$tmp/out1.txt"
check shard_header_magic test "$(header_int "$tmp/out/train_000000.bin" 0)" = 20240520
check shard_header_version test "$(header_int "$tmp/out/train_000000.bin" 1)" = 1
n=$(header_int "$tmp/out/train_000000.bin" 2)
check shard_size_matches_header test "$(stat -c %s "$tmp/out/train_000000.bin")" = $((1024 + 2 * n))
check first_token_is_endoftext test "$(od -An -t u2 -j 1024 -N 2 "$tmp/out/train_000000.bin" | tr -d ' ')" = 50256
check prepare_json_counts grep -Eq '"val_documents":[[:space:]]*1,' "$tmp/out/prepare.json"
check prepare_json_documents grep -Eq '"documents":[[:space:]]*7,' "$tmp/out/prepare.json"

# 2. Same input, same flags: byte-identical shards.
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_again" >/dev/null 2>&1
check prepare_is_deterministic cmp "$tmp/out/train_000000.bin" "$tmp/out_again/train_000000.bin"

# 3. Small shards, then a re-run with big shards removes the stale ones.
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_small" --shard-tokens 1000 >/dev/null 2>&1
check small_shards_split test -s "$tmp/out_small/train_000002.bin"
total=0; for f in "$tmp/out_small"/train_*.bin; do total=$((total + $(header_int "$f" 2))); done
check small_shards_same_tokens test "$total" = "$n"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_small" >/dev/null 2>&1
check stale_shards_removed test ! -e "$tmp/out_small/train_000001.bin"

# 4. Training a tokenizer first.
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_bpe" --train-tokenizer 300 --val-fraction 0.3 >"$tmp/out4.txt" 2>&1; rc=$?
check train_tokenizer_succeeds test $rc -eq 0
check train_tokenizer_files test -s "$tmp/out_bpe/tokenizer/vocab.json" -a -s "$tmp/out_bpe/tokenizer/merges.txt"
check train_tokenizer_vocab_size grep -Eq '"vocab_size":[[:space:]]*300,' "$tmp/out_bpe/prepare.json"
check train_tokenizer_merges_header test "$(head -n 1 "$tmp/out_bpe/tokenizer/merges.txt")" = "#version: 0.2"
check train_tokenizer_eot_last grep -q '"<|endoftext|>": 299}' "$tmp/out_bpe/tokenizer/vocab.json"
check val_fraction_respected grep -Eq '"val_documents":[[:space:]]*2,' "$tmp/out_bpe/prepare.json"
# The trained tokenizer can be reused with --tokenizer.
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_reuse" --tokenizer "$tmp/out_bpe/tokenizer" --val-fraction 0.3 >/dev/null 2>&1
check reuse_trained_tokenizer cmp "$tmp/out_bpe/train_000000.bin" "$tmp/out_reuse/train_000000.bin"

# 5. One file: split by tokens.
"$BIN" prepare --input "$tmp/corpus/doc7.txt" --output "$tmp/out_one" --vocab "$DATA/gpt2/encoder.json" --merges "$DATA/gpt2/vocab.bpe" >/dev/null 2>&1; rc=$?
check single_file_input test $rc -eq 0 -a -s "$tmp/out_one/train_000000.bin" -a -s "$tmp/out_one/val_000000.bin"

# 6. A Hugging Face tokenizer.json (LLaMA 2's SentencePiece BPE layout, ids checked against `tokenizers`
# in test_tokenizer_json): copied with its tokenizer_config.json, each document as "</s> <s> ids" (the
# eos separator, then tokenizer(doc)'s template), a tiny LLaMA trained on it and prompted with text.
TJ=tests/fixtures/tokenizer_json/spm-llama2
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_tj" --tokenizer "$TJ" --val-fraction 0 >"$tmp/tj.txt" 2>&1; rc=$?
check tokenizer_json_prepares test $rc -eq 0 -a -s "$tmp/out_tj/tokenizer/tokenizer.json" \
  -a -s "$tmp/out_tj/tokenizer/tokenizer_config.json" -a ! -e "$tmp/out_tj/tokenizer/vocab.json"
check tokenizer_json_eos_separates grep -q '"eot_id":[[:space:]]*2,' "$tmp/out_tj/prepare.json"
first=$(od -An -t u2 -j 1024 -N 4 "$tmp/out_tj/train_000000.bin" | tr -s ' ')
check tokenizer_json_document_starts_eos_bos test "$first" = " 2 1"
"$BIN" train --model llama-tiny --data "$tmp/out_tj" --steps 2 --batch-size 2 --seq-len 32 --sample-tokens 4 \
  --save-dir "$tmp/ck_tj" >"$tmp/tj_train.txt" 2>&1; rc=$?
check tokenizer_json_trains test $rc -eq 0
"$BIN" generate --model "$tmp/ck_tj" --prompt "Hello world" --max-new-tokens 0 --logits-out "$tmp/tj_logits.json" \
  >"$tmp/tj_gen.txt" 2>&1; rc=$?
check tokenizer_json_prompt_is_tokenizers_ids grep -q '"input_ids":[[:space:]]*\[1,[[:space:]]*623,[[:space:]]*310,[[:space:]]*366,[[:space:]]*320,[[:space:]]*344,[[:space:]]*359,[[:space:]]*467\]' "$tmp/tj_logits.json"
"$BIN" prepare --input "$tmp/corpus" --output "$tmp/out_tj" --vocab "$DATA/gpt2/encoder.json" --merges "$DATA/gpt2/vocab.bpe" \
  >/dev/null 2>&1; rc=$?
check two_files_replace_a_tokenizer_json test $rc -eq 0 -a ! -e "$tmp/out_tj/tokenizer/tokenizer.json" \
  -a ! -e "$tmp/out_tj/tokenizer/tokenizer_config.json" -a -s "$tmp/out_tj/tokenizer/vocab.json"

# 7. Bad inputs: non-zero exit and a message naming the problem.
expect_fail() {  # expect_fail NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  "$BIN" prepare "$@" >"$tmp/bad.txt" 2>&1; local rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$pattern" "$tmp/bad.txt"; then echo "PASS $name"
  else echo "FAIL $name (exit $rc)"; cat "$tmp/bad.txt"; failures=$((failures + 1)); fi
}
mkdir -p "$tmp/empty" "$tmp/broken"
cp "$tmp/corpus/doc1.txt" "$tmp/broken/"
ln -s /nonexistent/shardlm_missing "$tmp/broken/dangling.txt"
expect_fail missing_input_fails "no_such_input" --input "$tmp/no_such_input" --output "$tmp/o1"
expect_fail empty_dir_fails "no .txt files" --input "$tmp/empty" --output "$tmp/o2"
expect_fail unreadable_file_fails "dangling.txt" --input "$tmp/broken" --output "$tmp/o3"
expect_fail missing_tokenizer_fails "no_tok" --input "$tmp/corpus" --output "$tmp/o4" --tokenizer "$tmp/no_tok"
expect_fail unknown_flag_fails "unknown argument" --frobnicate 3
expect_fail bad_val_fraction_fails "val-fraction" --val-fraction 1.5
expect_fail bad_train_tokenizer_fails "train-tokenizer" --train-tokenizer 100
"$BIN" prepare --help >"$tmp/help.txt" 2>&1; rc=$?
check help_exits_zero test $rc -eq 0
check help_mentions_flags grep -q -- "--shard-tokens" "$tmp/help.txt"
[ $failures -eq 0 ]
