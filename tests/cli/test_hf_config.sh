#!/usr/bin/env bash
# test_hf_config.sh: a Hugging Face directory whose config.json asks for something shardlm cannot
# compute is refused by train, generate and convert-style loading with the key named, and nothing is
# written (no save directory). The weights are a real transformers 5 fixture; only config.json changes.
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
FIX=tests/fixtures/hf5/llama-theta
tmp=$(mktemp -d /tmp/shardlm_hfcfg_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# refused NAME KEY SED-EXPRESSION: config.json edited by sed must make train and generate fail naming KEY
refused() {
  local name=$1 key=$2 expr=$3 dir=$tmp/$1
  mkdir -p "$dir"
  cp "$FIX/model.safetensors" "$dir/"
  sed -e "$expr" "$FIX/config.json" >"$dir/config.json"
  if cmp -s "$FIX/config.json" "$dir/config.json"; then fail "$name" "the sed expression changed nothing"; return; fi
  "$BIN" train --model "$dir" --data "$tmp/no-data" --steps 1 --save-dir "$tmp/out-$name" >"$tmp/$name.out" 2>&1
  local rc=$?
  "$BIN" generate --model "$dir" --prompt-ids 1,2,3 --max-new-tokens 1 >"$tmp/$name.gen" 2>&1
  local rc2=$?
  if [ $rc -eq 0 ] || [ $rc2 -eq 0 ]; then fail "$name" "accepted (train rc $rc, generate rc $rc2)"
  elif ! grep -q "config.json.*$key" "$tmp/$name.out" || ! grep -q "config.json.*$key" "$tmp/$name.gen"; then
    fail "$name" "the error does not name $key: $(cat "$tmp/$name.out")"
  elif [ -e "$tmp/out-$name" ]; then fail "$name" "a save directory was written"
  else pass "$name"; fi
}

refused rope_type_longrope_refused longrope \
  's/"rope_type": "default"/"rope_type": "longrope", "short_factor": [1], "long_factor": [1]/'
refused rope_theta_given_twice_differently rope_theta 's/"rms_norm_eps"/"rope_theta": 10000.0, "rms_norm_eps"/'
refused rope_scaling_disagrees_with_rope_parameters rope_scaling \
  's/"rms_norm_eps"/"rope_scaling": {"type": "linear", "factor": 2.0}, "rms_norm_eps"/'
refused attention_bias_refused attention_bias 's/"attention_bias": false/"attention_bias": true/'
refused mlp_bias_refused mlp_bias 's/"mlp_bias": false/"mlp_bias": true/'
refused partial_rotary_factor_refused partial_rotary_factor 's/"rms_norm_eps"/"partial_rotary_factor": 0.5, "rms_norm_eps"/'
refused attention_dropout_refused attention_dropout 's/"attention_dropout": 0.0/"attention_dropout": 0.1/'
refused quantization_config_refused quantization_config \
  's/"rms_norm_eps"/"quantization_config": {"quant_method": "bitsandbytes"}, "rms_norm_eps"/'
refused model_type_gemma_refused gemma 's/"model_type": "llama"/"model_type": "gemma"/'

# an unknown key is a one-line notice, and the model still loads
dir=$tmp/unknown
mkdir -p "$dir" && cp "$FIX/model.safetensors" "$dir/"
sed -e 's/"rms_norm_eps"/"my_new_key": 7, "rms_norm_eps"/' "$FIX/config.json" >"$dir/config.json"
if "$BIN" generate --model "$dir" --prompt-ids 1,2,3 --max-new-tokens 2 --temperature 0 >"$tmp/unknown.out" 2>&1 &&
   [ "$(grep -c 'notice: .*config.json: keys shardlm does not know, ignored: my_new_key' "$tmp/unknown.out")" = 1 ]; then
  pass unknown_key_is_a_notice
else
  fail unknown_key_is_a_notice "$(cat "$tmp/unknown.out")"
fi

# --stop-at-eot stops on every eos_token_id of config.json and generation_config.json (an integer or a
# list, as LLaMA 3 Instruct's), and a malformed one is an error naming the file
dir=$tmp/stop
mkdir -p "$dir" && cp "$FIX/model.safetensors" "$FIX/config.json" "$dir/"
greedy() { "$BIN" generate --model "$dir" --prompt-ids 1,2,3 --max-new-tokens 4 --temperature 0 "$@" 2>"$tmp/stop.err"; }
read -r t1 t2 t3 t4 <<<"$(greedy)"
echo "{\"eos_token_id\": [4000, $t3]}" >"$dir/generation_config.json"
out3=$(greedy --stop-at-eot)
sed -i "s/\"eos_token_id\": 4,/\"eos_token_id\": [4, $t2],/" "$dir/config.json"
out2=$(greedy --stop-at-eot)
if [ -n "${t4:-}" ] && [ "$out3" = "$t1 $t2 $t3" ] && [ "$out2" = "$t1 $t2" ] && [ "$(greedy)" = "$t1 $t2 $t3 $t4" ]; then
  pass stop_at_eot_takes_every_eos_token_id
else
  fail stop_at_eot_takes_every_eos_token_id "greedy $t1 $t2 $t3 $t4; with generation_config [$out3]; with config [$out2]"
fi
echo '{"eos_token_id": "x"}' >"$dir/generation_config.json"
if ! greedy --stop-at-eot >/dev/null && grep -q "generation_config.json: eos_token_id" "$tmp/stop.err"; then
  pass stop_ids_malformed_refused
else
  fail stop_ids_malformed_refused "$(cat "$tmp/stop.err")"
fi

# a prompt that fills every position: its logits with --logits-out (as transformers computes them), a clear
# refusal without, and one token more is "longer than" the positions
npos=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" "$FIX/config.json")
ids=$(seq -s, 1 "$npos")
if "$BIN" generate --model "$FIX" --prompt-ids "$ids" --temperature 0 --logits-out "$tmp/full.json" >"$tmp/full.out" 2>&1 &&
   python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(len(d['logits']) != int(sys.argv[2]))" \
     "$tmp/full.json" "$npos" &&
   ! "$BIN" generate --model "$FIX" --prompt-ids "$ids" --temperature 0 >"$tmp/full2.out" 2>&1 &&
   grep -q "fills the model's $npos positions" "$tmp/full2.out" &&
   ! "$BIN" generate --model "$FIX" --prompt-ids "$ids,1" --logits-out "$tmp/over.json" >"$tmp/over.out" 2>&1 &&
   grep -q "is longer than the model's $npos positions" "$tmp/over.out" && [ ! -e "$tmp/over.json" ]; then
  pass full_length_prompt_logits
else
  fail full_length_prompt_logits "$(cat "$tmp/full.out" "$tmp/full2.out" "$tmp/over.out" 2>/dev/null | tail -5)"
fi
