#!/usr/bin/env python3
"""The functions of src/ longer than LIMIT lines (default 80), longest first: what ARCHITECTURE.md's
"fewer than 10 over 80, none over 120" counts. Test code is left out: #[cfg(test)] modules, files
under a tests/ folder, and the random-model generators (test-hooks only).

    python3 scripts/fn-lengths.py [SRC] [LIMIT]
"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "src"
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
def strip(line):
    # remove string literals and line comments roughly
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    i = line.find('//')
    return line[:i] if i >= 0 else line
out = []
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p = os.path.join(d, f)
        if '/tests/' in p + '/' and '/tests' in d or f in ('tests.rs', 'random.rs', 'random_heads.rs'):
            continue
        lines = open(p, encoding='utf-8').read().split('\n')
        n = len(lines); i = 0; skip_depth = None; depth = 0
        cfg_test = False
        while i < n:
            s = strip(lines[i])
            if re.match(r'^\s*#\[cfg\(test\)\]', lines[i]): cfg_test = True
            elif cfg_test and re.match(r'^\s*(pub\s+)?mod\s+\w+\s*\{', lines[i]):
                # skip this module
                d0 = 0; j = i
                while j < n:
                    t = strip(lines[j]); d0 += t.count('{') - t.count('}')
                    if d0 == 0 and '{' in ''.join(strip(x) for x in lines[i:j+1]): break
                    j += 1
                i = j + 1; cfg_test = False; continue
            elif lines[i].strip() and not lines[i].strip().startswith('#'): cfg_test = False
            m = fn_re.match(lines[i])
            if m:
                # find body start
                j = i; d0 = 0; started = False
                while j < n:
                    t = strip(lines[j])
                    if not started and ';' in t and '{' not in t and d0 == 0:
                        break
                    for c in t:
                        if c == '{': d0 += 1; started = True
                        elif c == '}': d0 -= 1
                    if started and d0 == 0: break
                    j += 1
                if started:
                    L = j - i + 1
                    if L > limit: out.append((L, p, i + 1, m.group(7)))
                # do not skip: nested fns counted separately
            i += 1
out.sort(reverse=True)
for L, p, ln, name in out: print(f"{L:5d} {p}:{ln} {name}")
print(f"# {len(out)} over {limit}, {sum(1 for o in out if o[0] > 120)} over 120", file=sys.stderr)
