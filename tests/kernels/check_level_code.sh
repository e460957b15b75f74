#!/usr/bin/env bash
# Every instruction on ymm/zmm registers in the kernels library must sit in a
# function of a level namespace (internal::avx2, internal::avx512,
# internal::avx512bf16), which only runs on CPUs that have that level. Code
# outside them -- std:: and msinfer inline functions, templates, the generic
# level -- runs on every CPU. This catches, at build time on any machine, what
# would be a SIGILL on a CPU without AVX (e.g. a compile flag that leaks a
# level's target into shared code).
# Usage: check_level_code.sh libmsinfer_kernels.a
set -euo pipefail
lib=$1
bad=$(objdump -d -C --no-show-raw-insn "$lib" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /%[yz]mm[0-9]/ {
    if (fn !~ /internal::avx2::|internal::avx512::|internal::avx512bf16::/ && !(fn in seen)) {
      seen[fn] = 1; print fn
    }
  }')
if [ -n "$bad" ]; then
  echo "FAIL: AVX registers used outside a kernel level's namespace:"
  echo "$bad"
  exit 1
fi
n=$(objdump -d "$lib" | grep -c '%[yz]mm' || true)
echo "PASS: $n AVX instructions, all inside level namespaces"
