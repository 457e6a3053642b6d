#!/usr/bin/env python3
"""Time PDF text extraction with pypdfium2 and pypdf, file by file: the peers ragline's PDF
extraction is measured against.

    scripts/bench-pdf-peers.sh PATH... [--dump DIR] [--json] [--timeout S] [--password PW]...
    python scripts/bench-pdf-peers.py PATH... (same options; needs pypdfium2 and pypdf)

PATH is a PDF or a folder (searched recursively for *.pdf, any case). Each file is read by each
tool in a worker process, single-threaded, one file at a time: pypdfium2 opens the document
and takes every page's text (page.get_textpage().get_text_range()); pypdf opens it and calls
extract_text() on every page. The time counts opening and extracting, not the process start.
A file that takes longer than --timeout seconds (default 60) has its worker killed and is
reported as "timeout"; an exception is reported as "error: ..." and the run goes on.

Encrypted files: the empty password is tried first, then each --password in turn; a file none
opens is reported as "encrypted". A file a tool did decrypt says with which password (and, for
pypdf, whether it matched as the user or the owner password: pypdf accepts "" as the owner
password of some R5/R6 files that pdfium refuses without the user password).

Prints, per file, the pages and seconds of each tool and their status, then per tool the pages,
seconds and pages/s over the files it read, and over the files both read ("common"). --json
prints only the results, as one JSON object, on stdout.

--dump DIR writes pypdfium2's text of each file it read to DIR/<name>.txt, pages separated by a
form feed (\\f), for word-F1 comparisons. <name> is the file's path relative to the PATH it was
found under (the file name for a PATH that is a file), '/' replaced by '__', the extension
dropped. The text is pdfium's, with '\\r\\n' as '\\n' and U+FFFE (pdfium's mark for a hyphen it
removed at a line end, the line break dropped with it) removed so the word is whole again.
DIR/index.json maps each source file to its dump, pages and status.
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time

TOOLS = ("pypdfium2", "pypdf")


# ---------------------------------------------------------------------------------------------
# In the worker process.

def _pdfium(path, passwords):
    import pypdfium2 as pdfium
    t = time.perf_counter()
    doc = None
    for pw in passwords:
        try:
            doc = pdfium.PdfDocument(path, password=pw)
            opened_with = pw
            break
        except pdfium.PdfiumError as e:
            if "password" not in str(e).lower():
                raise
    if doc is None:
        return {"status": "encrypted", "seconds": time.perf_counter() - t, "pages": None, "text": None}
    texts = []
    revision = pdfium.raw.FPDF_GetSecurityHandlerRevision(doc)
    try:
        for i in range(len(doc)):
            page = doc[i]
            tp = page.get_textpage()
            texts.append(tp.get_text_range())
            tp.close()
            page.close()
    finally:
        doc.close()
    r = {"status": "ok", "seconds": time.perf_counter() - t, "pages": len(texts), "text": texts}
    if revision >= 0:  # encrypted: say which password opened it
        r["decrypted"] = {"password": opened_with, "revision": revision}
    return r


def _pypdf(path, passwords):
    import logging
    import warnings
    import pypdf
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    reader = pypdf.PdfReader(path)
    decrypted = None
    if reader.is_encrypted:
        for pw in passwords:
            how = reader.decrypt(pw)
            if how != pypdf.PasswordType.NOT_DECRYPTED:
                # OWNER_PASSWORD: the password matched the owner password (it can be "")
                decrypted = {"password": pw, "as": how.name.lower()}
                break
            reader = pypdf.PdfReader(path)
        else:
            return {"status": "encrypted", "seconds": time.perf_counter() - t, "pages": None, "text": None}
    n = 0
    for page in reader.pages:
        page.extract_text()
        n += 1
    r = {"status": "ok", "seconds": time.perf_counter() - t, "pages": n, "text": None}
    if decrypted:
        r["decrypted"] = decrypted
    return r


def _worker(conn):
    # One thread for any native code that would use more.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    while True:
        job = conn.recv()
        if job is None:
            return
        tool, path, passwords, want_text = job
        try:
            r = (_pdfium if tool == "pypdfium2" else _pypdf)(path, passwords)
        except Exception as e:  # noqa: BLE001: any failure of the library is a result
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            r = {"status": f"error: {type(e).__name__}: {msg}"[:300], "seconds": None, "pages": None, "text": None}
        if not want_text:
            r["text"] = None
        conn.send(r)


class Worker:
    """A worker process reused from file to file; killed and replaced on a timeout."""

    def __init__(self):
        self.ctx = mp.get_context("spawn")
        self.proc = None

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def run(self, job, timeout):
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(job)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass  # the worker died (a crash in native code)
            code = self.proc.exitcode
            self.proc.join(1)
            self.proc = None
            return {"status": f"error: worker died (exit {code})", "seconds": None, "pages": None, "text": None}
        self.proc.kill()
        self.proc.join()
        self.proc = None
        return {"status": "timeout", "seconds": None, "pages": None, "text": None}

    def close(self):
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()


# ---------------------------------------------------------------------------------------------

def find_pdfs(paths):
    """(path, dump name) for every PDF under the given files and folders, sorted per PATH."""
    out, seen = [], set()
    for p in paths:
        if os.path.isdir(p):
            found = []
            for d, dirs, names in os.walk(p):
                dirs.sort()
                for n in names:
                    if n.lower().endswith(".pdf"):
                        found.append(os.path.join(d, n))
            for f in sorted(found):
                rel = os.path.relpath(f, p)
                out.append((f, os.path.splitext(rel)[0].replace(os.sep, "__")))
        elif os.path.isfile(p):
            out.append((p, os.path.splitext(os.path.basename(p))[0]))
        else:
            sys.exit(f"no such file or folder: {p}")
    # Keep dump names unique.
    result = []
    for path, name in out:
        base, k = name, 2
        while name in seen:
            name = f"{base}~{k}"
            k += 1
        seen.add(name)
        result.append((path, name))
    return result


def clean(text):
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufffe", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("paths", nargs="+", metavar="PATH")
    ap.add_argument("--dump", metavar="DIR", help="write pypdfium2's text of each file here")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per file and tool (60)")
    ap.add_argument("--password", action="append", default=[],
                    help="a password to try after the empty one (repeatable)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated: pypdfium2,pypdf")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in TOOLS:
            sys.exit(f"unknown tool {t} (choose from {', '.join(TOOLS)})")
    files = find_pdfs(args.paths)
    if not files:
        sys.exit("no PDF files found")
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    passwords = [""] + args.password
    log = sys.stderr if args.json else sys.stdout

    versions = {}
    for t in tools:
        try:
            mod = __import__(t)
        except ImportError:
            sys.exit(f"{t} is not installed (scripts/bench-pdf-peers.sh makes a venv with it)")
        if t == "pypdfium2":
            versions[t] = str(mod.version.PYPDFIUM_INFO)
            versions["pdfium"] = str(mod.version.PDFIUM_INFO)
        else:
            versions[t] = mod.__version__

    workers = {t: Worker() for t in tools}
    results, index = [], {}
    width = min(60, max(len(n) for _, n in files))
    if not args.json:
        head = f"{'file':<{width}} {'pages':>5} " + " ".join(f"{t + ' s':>12}" for t in tools) + "  status"
        print(head, file=log)
    try:
        for path, name in files:
            row = {"file": path, "name": name, "bytes": os.path.getsize(path)}
            for t in tools:
                want_text = t == "pypdfium2" and bool(args.dump)
                r = workers[t].run((t, path, passwords, want_text), args.timeout)
                row[t] = {k: r[k] for k in ("status", "seconds", "pages", "decrypted") if k in r}
                if want_text and r["text"] is not None:
                    dump = os.path.join(args.dump, name + ".txt")
                    with open(dump, "w", encoding="utf-8") as w:
                        w.write("\f".join(clean(x) for x in r["text"]))
                    row["dump"] = dump
            pages = next((row[t]["pages"] for t in tools if row[t]["pages"] is not None), None)
            row["pages"] = pages
            results.append(row)
            if args.dump:
                index[path] = {"dump": os.path.basename(row["dump"]) if "dump" in row else None,
                               "pages": pages, **{t: row[t]["status"] for t in tools}}
            if not args.json:
                secs = " ".join(f"{row[t]['seconds']:>12.4f}" if row[t]["seconds"] is not None
                                else f"{'-':>12}" for t in tools)
                notes = []
                for t in tools:
                    if row[t]["status"] != "ok":
                        notes.append(f"{t} {row[t]['status']}")
                    elif "decrypted" in row[t]:
                        dec = row[t]["decrypted"]
                        how = f" as {dec['as']}" if "as" in dec else ""
                        notes.append(f"{t} decrypted with {dec['password']!r}{how}")
                status = "; ".join(notes) or "ok"
                shown = name if len(name) <= width else "…" + name[-(width - 1):]
                print(f"{shown:<{width}} {pages if pages is not None else '-':>5} {secs}  {status}", file=log,
                      flush=True)
    finally:
        for w in workers.values():
            w.close()

    def total(tool, rows):
        ok = [r for r in rows if r[tool]["status"] == "ok"]
        p = sum(r[tool]["pages"] for r in ok)
        s = sum(r[tool]["seconds"] for r in ok)
        return {"files": len(ok), "pages": p, "seconds": round(s, 6), "pages_per_s": round(p / s, 2) if s else None}

    common = [r for r in results if all(r[t]["status"] == "ok" for t in tools)]
    summary = {t: total(t, results) for t in tools}
    summary_common = {t: total(t, common) for t in tools}
    statuses = {}
    for t in tools:
        counts = {}
        for r in results:
            k = r[t]["status"].split(":")[0]
            counts[k] = counts.get(k, 0) + 1
        statuses[t] = counts
    if args.dump:
        with open(os.path.join(args.dump, "index.json"), "w", encoding="utf-8") as w:
            json.dump(index, w, indent=1, ensure_ascii=False)
            w.write("\n")
    out = {"versions": versions, "timeout_s": args.timeout, "files": results, "totals": summary,
           "totals_common": summary_common, "statuses": statuses}
    if args.json:
        json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
        return
    print(file=log)
    print(f"{len(results)} files; versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), file=log)
    for label, summ, n in (("all it read", summary, None), ("common", summary_common, len(common))):
        for t in tools:
            s = summ[t]
            rate = f"{s['pages_per_s']:.1f} pages/s" if s["pages_per_s"] else "-"
            print(f"{t:<10} {label:<12} {s['files']:>4} files {s['pages']:>6} pages {s['seconds']:>9.3f} s  {rate}",
                  file=log)
    for t in tools:
        print(f"{t:<10} statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses[t].items())), file=log)
    if args.dump:
        print(f"pypdfium2 text in {args.dump}/ (index.json maps files to dumps)", file=log)


if __name__ == "__main__":
    main()
