#!/usr/bin/env python3
"""The benchmark passages: 2,000 paragraphs of 200-2,500 characters cut from ../shared/data
(react-docs and MDN), shuffled with a fixed seed, as JSONL ({"text": ...}).

    scripts/bench-passages.py OUT.jsonl [COUNT]

COUNT (default 2,000) takes more: scripts/gpu-prepare.sh takes 10,000.

Used by scripts/bench-peers.sh (ragline against sentence-transformers) and
scripts/bench-serve.sh (ragline serve under load), so both measure the same texts.
"""
import json
import os
import random
import re
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
data = os.environ.get("RAGLINE_DATA_DIR", os.path.join(root, "..", "shared", "data"))
paras = []
for sub in ("react-docs", "mdn"):
    for d, _, names in sorted(os.walk(os.path.join(data, sub))):
        for n in sorted(names):
            if n.endswith(".md"):
                text = open(os.path.join(d, n), encoding="utf-8").read()
                for p in re.split(r"\n\s*\n", text):
                    p = p.strip()
                    if 200 <= len(p) <= 2500 and not p.startswith(("---", "<", "|")):
                        paras.append(p)
if not paras:
    sys.exit(f"no passages under {data}: set RAGLINE_DATA_DIR")
random.Random(7).shuffle(paras)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for p in paras[:int(sys.argv[2]) if len(sys.argv) > 2 else 2000]:
        f.write(json.dumps({"text": p}, ensure_ascii=False) + "\n")
