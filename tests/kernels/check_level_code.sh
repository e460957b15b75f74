#!/usr/bin/env bash
# Every instruction on ymm/zmm registers in msinfer's own code must sit in a
# function of a kernel level namespace (internal::avx2, internal::avx512,
# internal::avx512bf16) or be one of the machine probes of bench/machine.cc
# (compiled with a target attribute, called only at their level): both run
# only on CPUs that have the level. Code outside them -- std:: and msinfer
# inline functions, templates, the generic level, every other module -- runs
# on every CPU. This catches, at build time on any machine, what would be a
# SIGILL on a CPU without AVX (e.g. a compile flag that leaks a level's target
# into shared code). Shared libraries (oneDNN, libstdc++) are not in the file.
# Usage: check_level_code.sh BINARY_OR_LIBRARY
set -euo pipefail
lib=$1
bad=$(objdump -d -C --no-show-raw-insn "$lib" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /%[yz]mm[0-9]/ {
    if (fn !~ /internal::avx2::|internal::avx512::|internal::avx512bf16::/ &&
        fn !~ /msinfer::bench::\(anonymous namespace\)::(sum256|sum512|bf16_loop|fma256_loop|fma512_loop)\(/ &&
        !(fn in seen)) {
      seen[fn] = 1; print fn
    }
  }')
if [ -n "$bad" ]; then
  echo "FAIL: AVX registers used outside a kernel level's namespace or a dispatched probe:"
  echo "$bad"
  exit 1
fi
n=$(objdump -d "$lib" | grep -c '%[yz]mm' || true)
echo "PASS: $n AVX instructions, all inside level namespaces and dispatched probes"
