#!/usr/bin/env bash
# Counts the size of the Lua scripts: lines, and decision points (if, elseif,
# while, for, repeat, and, or; comments and strings stripped). "sliding" is
# every .lua file but the fixed window's and the buckets' own.
#
#   bash scripts/size.sh            # from the repository's root
#
# Targets: sliding <= 450 lines and <= 120 decision points; all scripts
# <= 900 lines. It exits 1 when a target is missed.
set -euo pipefail
cd "$(dirname "$0")"
python3 - *.lua <<'PY'
import re, sys, os
def dp(text):
    text = re.sub(r'--\[(=*)\[.*?\]\1\]', '', text, flags=re.S)
    text = re.sub(r'--[^\n]*', '', text)
    text = re.sub(r'\[(=*)\[.*?\]\1\]', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\])*'", "''", text)
    return len(re.findall(r'\b(if|elseif|while|for|repeat|and|or)\b', text))
files = sorted(sys.argv[1:])
sl = [f for f in files if not re.match(r'(fixed|gcra|leaky|token)', os.path.basename(f))]
lines = lambda fs: sum(open(f).read().count('\n') for f in fs)
for f in files:
    print(f"{f:20} {lines([f]):5} lines {dp(open(f).read()):4} decision points")
s_lines, s_dp, all_lines = lines(sl), sum(dp(open(f).read()) for f in sl), lines(files)
print(f"sliding: {s_lines} lines, {s_dp} decision points (target 450 / 120); all scripts: {all_lines} lines (target 900)")
sys.exit(1 if s_lines > 450 or s_dp > 120 or all_lines > 900 else 0)
PY
