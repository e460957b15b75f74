#!/usr/bin/env bash
# A level whose start-up probe fails falls back with one log line, never
# aborts. The amx level's bf16 GEMMs are oneDNN's: on a CPU with AMX,
# DNNL_MAX_CPU_ISA=AVX2 makes oneDNN refuse every bf16 matmul, as oneDNN 2.6
# does on a real AVX2-only CPU: generate must still run (at avx512bf16), say
# why once, and give the tokens of --isa avx512bf16. Exit 77 (skipped) on a
# CPU without AMX (no other level has a probe that can fail).
# Usage: onednn_fallback_test.sh MSINFER_BINARY MODEL_DIR
set -euo pipefail
msinfer=$1 model=$2
unset MSINFER_ISA  # the fallback is from this CPU's best level, not from a cap
[ -f "$model/config.json" ] || "$msinfer" make-model --preset tiny-mixtral --out "$model" >/dev/null
grep -qw amx_bf16 /proc/cpuinfo || { echo "no AMX on this CPU: skipped"; exit 77; }
tokens() { /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["isa"], j["token_ids"])'; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT
fallback=$(DNNL_MAX_CPU_ISA=AVX2 "$msinfer" generate --model "$model" --prompt "Hello, experts" \
             --max-tokens 8 --json 2>"$err" | tokens)
native=$("$msinfer" generate --model "$model" --prompt "Hello, experts" --max-tokens 8 --json \
           --isa avx512bf16 2>/dev/null | tokens)
cat "$err"
echo "fallback: $fallback"
echo "native:   $native"
[ "$(grep -c 'failed its start-up check' "$err")" = 1 ] || { echo "FAIL: expected one log line"; exit 1; }
[ "$fallback" = "$native" ] || { echo "FAIL: fallback run differs from --isa avx512bf16"; exit 1; }
echo PASS
