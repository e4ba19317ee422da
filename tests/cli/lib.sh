# lib.sh: the common start of the CLI test scripts that source it (`. "$(dirname "$0")/lib.sh" NAME`):
# BIN, the shardlm binary as an absolute path (the script exits 0, skipped, when it is not built);
# DATA, ../shared/data as an absolute path; a temporary directory $tmp (shardlm_test_NAME_*) removed on
# exit; pass / fail lines for tests/run.sh; expect, a pass / fail line from a command's status (its
# output into $log); cut_run, a run's checkpoint directory cut back to one step to resume from; and
# prepare_tiny_data, which tokenizes ten speeches with a new 512-token BPE into $tmp/data (a second or so);
# same, a pass / fail line for files being byte-identical; joined_state, a checkpoint's AdamW shards
# joined in rank order as one digest per tensor (to compare ZeRO stages with stage 0).
set -u
BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$BIN" ] || exit 0
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
DATA=$(cd "${SHARDLM_DATA:-../shared/data}" 2>/dev/null && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} OMP_NUM_THREADS=1
tmp=$(mktemp -d "/tmp/shardlm_test_${1}_XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; [ $# -gt 0 ] && echo "  $*"; }
log="$tmp/log"
expect() {  # expect NAME CONDITION-COMMAND...: the command's output goes to $log, shown on failure
  local name=$1; shift
  if "$@" >>"$log" 2>&1; then pass "$name"; else fail "$name"; tail -n 15 "$log"; fi
}
cut_run() {  # cut_run FROM TO STEP: TO holds FROM's checkpoint of STEP, as latest, and its metrics up to STEP
  local ckpt; ckpt=$(printf 'step_%08d' "$3")
  mkdir -p "$2" && cp -r "$1/$ckpt" "$2/" && echo "$ckpt" >"$2/latest" &&
    head -n "$(grep -n "\"step\":$3," "$1/metrics.jsonl" | tail -1 | cut -d: -f1)" "$1/metrics.jsonl" >"$2/metrics.jsonl"
}
prepare_tiny_data() {  # returns non-zero when ../shared/data/sotu is missing
  [ -d "$DATA/sotu" ] || return 1
  mkdir -p "$tmp/corpus" && cp "$DATA"/sotu/179*.txt "$tmp/corpus/" &&
    "$BIN" prepare --input "$tmp/corpus" --output "$tmp/data" --train-tokenizer 512 >"$tmp/prepare.log" 2>&1
}
same() {  # same NAME FILE...: all files exist and are byte-identical
  local name=$1 first=$2; shift 2
  for f in "$first" "$@"; do [ -f "$f" ] || { fail "$name" "missing $f"; return; }; done
  for f in "$@"; do cmp -s "$first" "$f" || { fail "$name" "$f differs from $first"; return; }; done
  pass "$name"
}
# joined_state DIR: the AdamW state of a checkpoint, its shards' exp_avg and exp_avg_sq bytes joined in
# rank order (safetensors read with the standard library), as one hex digest per tensor
joined_state() {
  python3 - "$1" <<'PY'
import glob, hashlib, json, struct, sys
parts = {}
for path in sorted(glob.glob(sys.argv[1] + "/optim_*.safetensors")):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, t in header.items():
        if name == "__metadata__": continue
        b, e = t["data_offsets"]
        parts.setdefault(name, []).append(raw[8 + n + b:8 + n + e])
for name in sorted(parts):
    print(name, hashlib.sha256(b"".join(parts[name])).hexdigest())
PY
}
