#!/usr/bin/env bash
# Runs msinfer on CPUs this machine is not, under QEMU's user-mode emulator:
#   EPYC-Milan  AMD Zen 3: AVX2 + FMA + F16C, no AVX-512 (CI's CPU) -> avx2
#   qemu64      x86-64 baseline, no AVX at all                      -> generic
# An instruction the emulated CPU lacks raises SIGILL there, so this catches a
# kernel, probe or library path that assumes the build machine's CPU. Checks
# for each: the detected level, every kernel of every level it runs against
# generic, and that generate (bf16 and w8a8 weights; tiny-gpt-oss with its
# experts kept 4-bit, mxfp4) gives the tokens the native binary gives when
# forced to the same level. Exit 77 (skipped) without qemu-x86_64.
# Usage: foreign_cpu_test.sh MSINFER_BINARY LEVELS_TEST_BINARY MODEL_DIR
set -euo pipefail
# It checks the level each CPU selects by itself: a level forced on the whole
# suite (MSINFER_ISA=generic ctest) would cap the emulated runs too.
unset MSINFER_ISA
# msinfer runs itself again with GOMP_SPINCOUNT set unless it is set already
# (exec_again_with_bounded_openmp_spin); qemu-user does not follow that exec,
# so the second process would run natively and check nothing on a machine
# whose own CPU is another level (Zen 5: avx512bf16 where avx2 is expected).
export GOMP_SPINCOUNT=10000
msinfer=$1 levels_test=$2 model=$3
command -v qemu-x86_64 >/dev/null || { echo "qemu-x86_64 not installed (scripts/setup installs qemu-user): skipped"; exit 77; }
[ -f "$model/config.json" ] || "$msinfer" make-model --preset tiny-mixtral --out "$model" >/dev/null
gpt_oss="$model-gpt-oss"
[ -f "$gpt_oss/config.json" ] || "$msinfer" make-model --preset tiny-gpt-oss --out "$gpt_oss" >/dev/null

tokens() { /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["isa"], j["token_ids"])'; }

for pair in EPYC-Milan:avx2 qemu64:generic; do
  cpu=${pair%%:*} want=${pair##*:}
  echo "== qemu-x86_64 -cpu $cpu (expect $want)"
  out=$(qemu-x86_64 -cpu "$cpu" "$levels_test" 2>&1) || { echo "$out"; echo "FAIL: levels test on $cpu"; exit 1; }
  grep -q "(CPU: $want)" <<<"$out" || { echo "$out"; echo "FAIL: $cpu detected as something other than $want"; exit 1; }
  grep -q "PASSED" <<<"$out"
  for weights in bf16 w8a8 mxfp4; do
    m=$model
    [ "$weights" = mxfp4 ] && m=$gpt_oss
    emulated=$(qemu-x86_64 -cpu "$cpu" "$msinfer" generate --model "$m" --prompt "Hello, experts" \
                 --max-tokens 8 --weights $weights --json 2>/dev/null | tokens)
    native=$("$msinfer" generate --model "$m" --prompt "Hello, experts" --max-tokens 8 --json \
               --weights $weights --isa "$want" 2>/dev/null | tokens)
    echo "emulated ($weights): $emulated"
    echo "native   ($weights): $native"
    [ "$emulated" = "$native" ] || { echo "FAIL: generate $weights on $cpu differs from native --isa $want"; exit 1; }
    [ "${emulated%% *}" = "$want" ] || { echo "FAIL: generate on $cpu ran at ${emulated%% *}"; exit 1; }
  done
done
echo "== bench kernels on EPYC-Milan"
# Small shapes: the probes and kernels run at avx2 all the same, and emulated
# they are ~10^4 times slower (the defaults took 250 s here).
out=$(qemu-x86_64 -cpu EPYC-Milan "$msinfer" bench kernels --quick --tokens 1 --weights int8 \
        --hidden 256 --expert-ffn 512 --contexts 128 --json 2>&1)
grep -q '"isa": "avx2"' <<<"$out" || { echo "$out"; echo "FAIL: bench kernels"; exit 1; }
echo "PASS"
