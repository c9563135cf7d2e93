#!/usr/bin/env bash
# Counts the size of the Lua scripts: lines, lines past 100 columns, and
# decision points (if, elseif, while, for, repeat, and, or; comments and
# strings stripped). A counter for reviews, not a cap: a script is made
# plain, never packed to fit a count (STYLE.md).
#
#   bash scripts/size.sh            # from the repository's root
set -euo pipefail
cd "$(dirname "$0")"
python3 - *.lua <<'PY'
import re, sys
def dp(text):
    text = re.sub(r'--\[(=*)\[.*?\]\1\]', '', text, flags=re.S)
    text = re.sub(r'--[^\n]*', '', text)
    text = re.sub(r'\[(=*)\[.*?\]\1\]', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\])*'", "''", text)
    return len(re.findall(r'\b(if|elseif|while|for|repeat|and|or)\b', text))
files = sorted(sys.argv[1:])
for f in files:
    text = open(f).read()
    wide = sum(1 for line in text.split('\n') if len(line) > 100)
    print(f"{f:20} {text.count(chr(10)):5} lines {dp(text):4} decision points {wide:3} lines past 100 columns")
PY
