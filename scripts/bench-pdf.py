#!/usr/bin/env python3
"""Compare ragline's PDF extraction with pypdfium2 and pypdf on the same files: speed (pages/s,
one core each) and agreement (word F1 of ragline's text against pypdfium2's, per file).

    scripts/bench-pdf.sh PATH...        (runs the peers, ragline, then this)
    python scripts/bench-pdf.py --peers PEERS.json --ragline RAGLINE.jsonl

PEERS.json is `scripts/bench-pdf-peers.py --json --dump DIR` output (its dumps are read from
the paths it names); RAGLINE.jsonl is `ragline extract --json FILE...` output, in any order.
Seconds are each tool's own extraction time for the file (opening and all pages), without
process start. Word F1: bags of lower-cased words (letters and digits), markdown marks
ignored; ragline's title heading and pdfium's text both count. Prints a markdown table.
"""
import argparse
import collections
import json
import re
import sys

WORD = re.compile(r"[^\W_]+", re.UNICODE)


def words(text):
    return [w.lower() for w in WORD.findall(text)]


def f1(got, want):
    g, w = collections.Counter(got), collections.Counter(want)
    if not g and not w:
        return 1.0
    common = sum((g & w).values())
    if common == 0:
        return 0.0
    p, r = common / sum(g.values()), common / sum(w.values())
    return 2 * p * r / (p + r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", required=True)
    ap.add_argument("--ragline", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    peers = json.load(open(args.peers))
    ours = {}
    for line in open(args.ragline):
        d = json.loads(line)
        ours[d["id"]] = d
    rows, totals = [], collections.defaultdict(lambda: [0, 0.0])
    common = collections.defaultdict(lambda: [0, 0.0])
    for f in peers["files"]:
        r = ours.get(f["file"])
        if r is None:
            continue
        pdfium = f.get("pypdfium2", {})
        pages = r.get("pages") or f.get("pages") or 0
        row = {"file": f["name"], "pages": pages, "ragline": r["status"],
               "ragline_s": r["seconds"], "pypdfium2": pdfium.get("status"),
               "pypdfium2_s": pdfium.get("seconds"),
               "pypdf": f.get("pypdf", {}).get("status"),
               "pypdf_s": f.get("pypdf", {}).get("seconds")}
        if r["status"] == "indexed":
            totals["ragline"][0] += pages
            totals["ragline"][1] += r["seconds"]
        for tool in ("pypdfium2", "pypdf"):
            t = f.get(tool, {})
            if t.get("status") == "ok":
                totals[tool][0] += t.get("pages", 0)
                totals[tool][1] += t["seconds"]
        if r["status"] == "indexed" and all(f.get(t, {}).get("status") == "ok" for t in ("pypdfium2", "pypdf")):
            for tool, s in (("ragline", r["seconds"]), ("pypdfium2", pdfium["seconds"]), ("pypdf", f["pypdf"]["seconds"])):
                common[tool][0] += pages
                common[tool][1] += s
        if f.get("dump") and pdfium.get("status") == "ok":
            ref = open(f["dump"], encoding="utf-8", errors="replace").read()
            if words(ref):
                row["f1"] = f1(words(r.get("text", "")), words(ref))
        rows.append(row)
    summary = {
        "totals": {k: {"pages": v[0], "seconds": round(v[1], 4), "pages_per_s": round(v[0] / v[1], 1) if v[1] else None} for k, v in totals.items()},
        "common": {k: {"pages": v[0], "seconds": round(v[1], 4), "pages_per_s": round(v[0] / v[1], 1) if v[1] else None} for k, v in common.items()},
        "f1_mean": round(sum(r["f1"] for r in rows if "f1" in r) / max(1, sum("f1" in r for r in rows)), 4),
        "f1_files": sum("f1" in r for r in rows),
        "files": rows,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return
    print("| file | pages | ragline | s | pypdfium2 s | pypdf s | word F1 vs pdfium |")
    print("|---|---:|---|---:|---:|---:|---:|")
    fmt = lambda s: "" if s is None else f"{s:.4f}"
    for r in rows:
        print(f"| {r['file']} | {r['pages']} | {r['ragline']} | {fmt(r['ragline_s'])} | "
              f"{fmt(r['pypdfium2_s'])} | {fmt(r['pypdf_s'])} | "
              f"{'' if 'f1' not in r else format(r['f1'], '.3f')} |")
    print()
    for name, t in (("every file each tool read", summary["totals"]), ("files all three read", summary["common"])):
        print(f"pages/s over {name}: " + ", ".join(
            f"{k} {v['pages_per_s']} ({v['pages']} pages in {v['seconds']}s)" for k, v in sorted(t.items())))
    print(f"mean word F1 against pypdfium2 over {summary['f1_files']} files: {summary['f1_mean']}")


if __name__ == "__main__":
    main()
