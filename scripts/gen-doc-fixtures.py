#!/usr/bin/env python3
"""Generate the PDF and DOCX test fixtures in tests/fixtures/docs/, each with the text an
extractor should find in it (NAME.expected.json).

    scripts/gen-doc-fixtures.sh            (makes the venv, then runs this with --check)
    python scripts/gen-doc-fixtures.py [--out DIR] [--check]

Needs reportlab and python-docx (pinned in scripts/docs-venv.sh); --check also needs pypdfium2
and pypdf: it reads every generated file back and compares with its expected.json.

Deterministic: reportlab runs with invariant=1 (fixed dates and file ID), the only TTF is Vera
from inside the pinned reportlab, the DOCX is re-zipped with fixed timestamps, so re-running
gives identical bytes (on the same zlib).

expected.json, for every fixture:
  title      the document's title (PDF Info /Title, DOCX core title; also shown on page 1)
  text       the body text in reading order: blocks (title, headings, paragraphs, list items,
             table rows) separated by a blank line, the lines of a paragraph joined by single
             spaces; running headers and footers left out; the word hyphenated at a line end
             joined ("propulsion"); ligature characters as plain letters ("film", "flexible").
             DOCX tables: a row per line, cells separated by a tab.
  headings   [{"level": n, "text": ...}] in order (the title is not among them)
  pages      PDFs: the text of each page, in the same form ("" for a page with no text layer)
  blocks     [{"kind": title|heading|paragraph|list_item|table, "text": ...}] in order
  furniture  running header/footer lines that are on the page but not part of "text"
  terms      rare words for search tests, with the page they are on (PDFs)
  absent     DOCX: strings that must not appear (deleted tracked-change text)
  footnotes  DOCX: footnote texts (not part of "text"; an extractor may append them)
  no_text_pages  1-based pages with no text layer
and, for some:
  password   encrypted.pdf: the user password ("encryption" has both passwords, RC4-128)
  hyphenated, ligatures   single.pdf: the words drawn split ("propul-" / "sion") or with
             U+FB01/U+FB02, as they should come out
  columns    twocol.pdf: per page, [left column text, right column text]
  table, inserted, absent, footnotes   report.docx

What pdfium (pypdfium2) gives for single.pdf, for comparison: it expands the ligatures itself
("film"), and turns the hyphen at the line end into U+FFFE with the line break dropped
("propul\ufffesion"); pypdf gives "\ufb01lm" and "propul-\nsion" as drawn.
"""
import argparse
import io
import json
import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGATURES = {"\ufb01": "fi", "\ufb02": "fl"}

# ---------------------------------------------------------------------------------------------
# The prose. "-|" marks the one forced hyphenation (the line ends after the hyphen); ﬁ/ﬂ are the
# ligature characters, drawn with Vera (Helvetica's encoding has no ligatures).

SINGLE_TITLE = "Solar Sails in Practice"
SINGLE = [
    # (page, [blocks]) where a block is ("h1"/"h2"/"title"/"p", text)
    (1, [
        ("title", SINGLE_TITLE),
        ("h1", "1 Introduction"),
        ("p", "A solar sail is a spacecraft that carries no propellant at all. It leans instead on "
              "sunlight, harvesting the faint pressure of photons that strike a broad reflective "
              "membrane. The push is tiny, roughly nine micronewtons on every square metre near the "
              "orbit of the Earth, yet it never stops, and over months it adds up to a change in "
              "velocity that no chemical rocket of similar mass could match. Sunlight is free, plentiful "
              "and available everywhere in the inner solar system."),
        ("p", "The idea is older than spaceflight. Johannes Kepler noticed that comet tails always "
              "point away from the Sun and guessed that some breeze from the Sun was responsible. "
              "Friedrich Zander and Konstantin Tsiolkovsky later sketched sails in earnest, and by "
              "the nineteen seventies engineers at the Jet Propulsion Laboratory had proposed a "
              "heliogyro, a spinning rotor of long ribbons, for a rendezvous with the comet Halley."),
        ("p", "What makes sailing attractive is not speed but endurance. Because the thrust costs "
              "nothing, a sail can hover at an artificial Lagrange point, spiral inward toward Mercury, "
              "or crank its orbit over the poles of the Sun. Critics once called this mode of "
              "propul-|sion a curiosity, but the flights of IKAROS in 2010 and LightSail 2 in 2019 "
              "showed that a gossamer craft can be steered with real precision."),
    ]),
    (2, [
        ("h1", "2 Materials"),
        ("p", "A sail must be light, opaque, reflective and tough, and these demands pull in different "
              "directions. The figure of merit is areal density, the mass of one square metre of "
              "finished sail, and the most ambitious designs aim for less than ten grams on that "
              "square. Every gram of rigging, seam tape and ripstop reinforcement counts against the "
              "budget."),
        ("p", "The reflective face is almost always a vapour deposited layer of aluminium about one "
              "tenth of a micron thick. On the back, a thin coat of chromium raises the emissivity so "
              "that the sail can shed the heat it cannot reflect. Engineers describe the laminate with "
              "a dry vocabulary of alloys and angstroms, but the result looks like crinkled tinfoil "
              "that shimmers at the slightest draught."),
        ("h2", "2.1 Polyimide films"),
        ("p", "The substrate is usually a polyimide \ufb01lm such as Kapton or the colourless CP1, chosen "
              "because it survives both the cryogenic shadow and temperatures near four hundred "
              "degrees. A \ufb01lm only two microns thick is \ufb02exible enough to be folded like origami "
              "and stowed in a canister the size of a loaf of bread. The folds, however, leave "
              "permanent creases, and the creases scatter light in ways that the navigators must "
              "model. Some teams now anneal the \ufb02exible membrane after folding, a step borrowed "
              "from the makers of vellum and parchment. Kapton has a faint amber tint, which is why "
              "photographs of folded sails often glow like honey."),
    ]),
    (3, [
        ("h1", "3 Results"),
        ("p", "Ground tests in a vacuum chamber near Huntsville measured a reflectance of ninety one "
              "percent for the aluminised face and an emissivity of sixty four percent for the "
              "chromium back. The booms, four coilable masts of carbon composite, deployed in eleven "
              "minutes without a single snag. A thermal imager caught a faint chequerboard of warm "
              "and cool patches that matched the fold pattern almost exactly."),
        ("p", "In orbit the sail behaved much as the models predicted. Its characteristic acceleration "
              "came to about fifty eight micrometres per second squared, and the attitude controllers "
              "held the sun angle within half a degree for weeks at a time. The one surprise was a "
              "slow wobble, nicknamed the syzygy drift, that appeared whenever the Moon crossed the "
              "line between the craft and the Sun. The team traced it to a tiny asymmetry in how two "
              "of the quadrants had been tensioned."),
        ("p", "None of these results is spectacular on its own, yet together they suggest that sailing "
              "has left the laboratory. A mission that uses sunlight as its only engine can now be "
              "planned with the same confidence as one that carries a tank of hydrazine, and that "
              "quiet fact may matter more than any record."),
        ("p", "The next flight will carry a larger sail, some eighty square metres, and a camera on a "
              "short boom that will photograph the membrane every hour. If the creases relax in "
              "sunlight as the annealing tests suggest, the sail should grow slightly flatter and "
              "slightly faster with every week that it spends in space."),
    ]),
]
SINGLE_TERMS = ["heliogyro", "gossamer", "IKAROS", "ripstop", "angstroms", "vellum", "Kapton",
                "Huntsville", "chequerboard", "syzygy", "hydrazine"]

TWOCOL_TITLE = "Tidal Observatories of the North Sea"
TWOCOL = [
    # (page, heading (kind, text), left column paragraphs, right column paragraphs)
    (1, ("title", TWOCOL_TITLE),
     ["The first observatory stands on a steel tripod over the Dogger Bank, where the water is "
      "barely twenty metres deep. Its anemometer spins on a mast above the spray, and a pressure "
      "sensor on the seabed counts every wave that rolls across the shoal.",
      "Fishermen call the tripod the heron, because it seems to stand on one leg in the grey water. "
      "Twice a year a supply boat brings fresh batteries and collects the logbooks."],
     ["The second observatory is a humble hut on stilts in the Wadden Sea, reached on foot across "
      "the mudflats at low tide. Walkers must watch the clock, since the flood returns faster than "
      "a person can run.",
      "Inside, a student counts lugworm casts in marked squares of mud and records the salinity of "
      "the pools. The tally has continued without a break since the winter of 1987."]),
    (2, ("h1", "Field Notes from the Second Season"),
     ["Barnacles were the great enemy of the second season. Within six weeks they had crusted over "
      "the intake of every pump on the tripod, and the flow meters began to report nonsense.",
      "The engineers tried an antifouling paint laced with copper, then a sleeve of smooth silicone. "
      "Only the silicone kept the shells away until the autumn."],
     ["Getting the data ashore proved harder than collecting it. The hut sends its readings by "
      "radio to a lighthouse on the dunes, where an old semaphore tower now carries a modem.",
      "On foggy nights the link fails, so the keeper copies the numbers by hand into a ledger that "
      "smells faintly of paraffin."]),
]
TWOCOL_TERMS = ["anemometer", "heron", "lugworm", "salinity", "Barnacles", "antifouling",
                "semaphore", "paraffin"]

SCANNED_TITLE = "Scanned Ledger"
SCANNED_P1 = [
    ("title", SCANNED_TITLE),
    ("p", "This page carries a real text layer. The next page is a scanned photograph of a harbour "
          "ledger and holds no text at all. An extractor should report that page two is empty "
          "rather than inventing words for it. The codeword on this page is quillwort."),
]

ENCRYPTED_TITLE = "Encrypted Note"
ENCRYPTED = [("title", ENCRYPTED_TITLE),
             ("p", "The vault combination is written on the back of the quokka calendar. Only readers "
                   "who know the password can see this sentence.")]
ENCRYPTED_EMPTY_TITLE = "Owner Locked Note"
ENCRYPTED_EMPTY = [("title", ENCRYPTED_EMPTY_TITLE),
                   ("p", "Anyone may read this page without a password, but only the owner may change "
                         "it. The watchword is marmalade.")]


def plain(text):
    """The text as an extractor should give it: hyphenation joined, ligatures expanded."""
    text = text.replace("-|", "")
    for lig, letters in LIGATURES.items():
        text = text.replace(lig, letters)
    return text


# ---------------------------------------------------------------------------------------------
# PDF

def pdf_setup():
    import reportlab
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont
    vera = os.path.join(os.path.dirname(reportlab.__file__), "fonts", "Vera.ttf")
    # asciiReadable=False: embed only the glyphs used (else reportlab puts all of ASCII in the
    # subset, some 25 KB).
    pdfmetrics.registerFont(TTFont("Vera", vera, asciiReadable=False))
    face = pdfmetrics.getFont("Vera").face
    for ch in LIGATURES:
        assert ord(ch) in face.charToGlyph, f"Vera lacks U+{ord(ch):04X}"


class Flow:
    """Lays out lines of words in a column with canvas text objects: words with a ligature
    character in Vera, the rest in the body font. Records what went on each page."""

    SIZES = {"title": (20, "Helvetica-Bold", 26, 8), "h1": (16, "Helvetica-Bold", 20, 4),
             "h2": (14, "Helvetica-Bold", 18, 4), "p": (11, "Helvetica", 14, 8)}

    def __init__(self, c, x, top, width, bottom):
        self.c, self.x, self.width, self.bottom = c, x, width, bottom
        self.y = top
        self.blocks = []  # (kind, text) as drawn
        self.hyphen_fill = []

    def words(self, text, font):
        out = []
        for w in text.split(" "):
            if "-|" in w:
                head, tail = w.split("-|")
                out.append((head + "-", font, True))
                out.append((tail, font, False))
            else:
                f = "Vera" if any(ch in w for ch in LIGATURES) else font
                out.append((w, f, False))
        return out

    def block(self, kind, text, outline=None):
        from reportlab.pdfbase.pdfmetrics import stringWidth
        size, font, leading, after = self.SIZES[kind]
        space = stringWidth(" ", font, size)
        lines, line, w = [], [], 0.0
        for word, f, force in self.words(text, font):
            ww = stringWidth(word, f, size)
            if line and w + space + ww > self.width:
                lines.append(line)
                line, w = [], 0.0
            w = w + (space if line else 0) + ww
            line.append((word, f))
            if force:
                self.hyphen_fill.append(w / self.width)
                lines.append(line)
                line, w = [], 0.0
        if line:
            lines.append(line)
        if outline is not None:
            key, level = outline
            self.c.bookmarkPage(key, fit="XYZ", left=self.x, top=self.y + 2)
            self.c.addOutlineEntry(text, key, level=level, closed=False)
        for ln in lines:
            self.y -= leading
            assert self.y > self.bottom, f"text runs off the page at {text[:40]!r}"
            t = self.c.beginText(self.x, self.y)
            for i, (word, f) in enumerate(ln):
                t.setFont(f, size)
                t.textOut(word)
                if i + 1 < len(ln):
                    t.setFont(font, size)
                    t.textOut(" ")
            self.c.drawText(t)
        self.y -= after
        self.blocks.append((kind, plain(text)))


def new_canvas(path, title, encrypt=None):
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas
    c = canvas.Canvas(path, pagesize=A4, invariant=1, pageCompression=1, encrypt=encrypt)
    c.setTitle(title)
    c.setAuthor("ragline test fixtures")
    c.setSubject("Generated by scripts/gen-doc-fixtures.py")
    c.setCreator("scripts/gen-doc-fixtures.py")
    return c


def furniture(c, header, page, pages):
    from reportlab.lib.pagesizes import A4
    w, h = A4
    c.setFont("Helvetica", 8)
    c.drawString(72, h - 40, header)
    c.setLineWidth(0.5)
    c.line(72, h - 44, w - 72, h - 44)
    c.drawCentredString(w / 2, 36, f"Page {page} of {pages}")
    return [header, f"Page {page} of {pages}"]


def join_blocks(blocks):
    return "\n\n".join(text for _, text in blocks)


def kind_name(kind):
    return {"title": "title", "h1": "heading", "h2": "heading", "p": "paragraph"}[kind]


def make_single(out):
    from reportlab.lib.pagesizes import A4
    path = os.path.join(out, "single.pdf")
    c = new_canvas(path, SINGLE_TITLE)
    header = f"{SINGLE_TITLE} \u2014 Draft"
    pages, all_blocks, headings, furn, terms, fills = [], [], [], [], [], []
    n = len(SINGLE)
    for page, blocks in SINGLE:
        furn += furniture(c, header, page, n)
        f = Flow(c, 72, A4[1] - 72, A4[0] - 144, 60)
        for i, (kind, text) in enumerate(blocks):
            outline = None
            if kind in ("h1", "h2"):
                level = 1 if kind == "h1" else 2
                headings.append({"level": level, "text": text})
                outline = (f"h{len(headings)}", level - 1)
            f.block(kind, text, outline)
        fills += f.hyphen_fill
        pages.append(join_blocks(f.blocks))
        all_blocks += f.blocks
        body = " ".join(t for _, t in f.blocks)
        terms += [{"term": t, "page": page} for t in SINGLE_TERMS if t in body.split(" ") or t in body]
        c.showPage()
    c.showOutline()
    c.save()
    assert len(fills) == 1, "the hyphenated break must happen once"
    return path, {
        "title": SINGLE_TITLE,
        "text": "\n\n".join(pages),
        "headings": headings,
        "pages": pages,
        "blocks": [{"kind": kind_name(k), "text": t} for k, t in all_blocks],
        "furniture": furn,
        "terms": terms,
        "hyphenated": ["propulsion"],
        "ligatures": ["film", "flexible"],
        "no_text_pages": [],
        "_hyphen_line_fill": round(fills[0], 2),
    }


def make_twocol(out):
    from reportlab.lib.pagesizes import A4
    path = os.path.join(out, "twocol.pdf")
    c = new_canvas(path, TWOCOL_TITLE)
    w, h = A4
    gap = 24
    colw = (w - 144 - gap) / 2
    pages, all_blocks, headings, terms = [], [], [], []
    for page, (hkind, htext), left, right in TWOCOL:
        top = Flow(c, 72, h - 72, w - 144, 60)
        if hkind != "title":
            headings.append({"level": 1, "text": htext})
            top.block(hkind, htext, (f"h{len(headings)}", 0))
        else:
            top.block(hkind, htext)
        cols = []
        for x, paras in ((72, left), (72 + colw + gap, right)):
            f = Flow(c, x, top.y - 6, colw, 60)
            for p in paras:
                f.block("p", p)
            cols.append(f)
        blocks = top.blocks + cols[0].blocks + cols[1].blocks
        pages.append(join_blocks(blocks))
        all_blocks += blocks
        body = " ".join(t for _, t in blocks)
        terms += [{"term": t, "page": page} for t in TWOCOL_TERMS if t in body]
        c.showPage()
    c.save()
    return path, {
        "title": TWOCOL_TITLE,
        "text": "\n\n".join(pages),
        "headings": headings,
        "pages": pages,
        "blocks": [{"kind": kind_name(k), "text": t} for k, t in all_blocks],
        "columns": [[join_blocks([("p", p) for p in left]), join_blocks([("p", p) for p in right])]
                    for _, _, left, right in TWOCOL],
        "furniture": [],
        "terms": terms,
        "no_text_pages": [],
    }


def ledger_image():
    """A small grey 'scan' of a ruled ledger with dark ink strokes: pixels only, no text."""
    from PIL import Image, ImageDraw
    img = Image.new("L", (240, 320), 236)
    d = ImageDraw.Draw(img)
    seed = 12345
    for row in range(14):
        y = 24 + row * 20
        d.line([(12, y + 12), (228, y + 12)], fill=190, width=1)
        x = 16
        while x < 220:  # ink strokes of pseudo-random length, like handwriting
            seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
            n = 6 + seed % 30
            d.rectangle([x, y + 3, min(x + n, 224), y + 9], fill=60 + seed % 40)
            x += n + 5 + (seed >> 8) % 7
    d.line([(60, 8), (60, 312)], fill=150, width=2)
    return img


def make_scanned(out):
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    path = os.path.join(out, "scanned.pdf")
    c = new_canvas(path, SCANNED_TITLE)
    w, h = A4
    f = Flow(c, 72, h - 72, w - 144, 60)
    for kind, text in SCANNED_P1:
        f.block(kind, text)
    c.showPage()
    c.drawImage(ImageReader(ledger_image()), 72, 150, width=w - 144, height=(w - 144) * 4 / 3)
    c.showPage()
    c.save()
    pages = [join_blocks(f.blocks), ""]
    return path, {
        "title": SCANNED_TITLE, "text": pages[0], "headings": [], "pages": pages,
        "blocks": [{"kind": kind_name(k), "text": t} for k, t in f.blocks],
        "furniture": [], "terms": [{"term": "quillwort", "page": 1}], "no_text_pages": [2],
    }


def make_image_only(out):
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    path = os.path.join(out, "image-only.pdf")
    c = new_canvas(path, "Image Only")
    w, h = A4
    c.setFillColorRGB(0.85, 0.9, 1.0)
    c.rect(72, 300, w - 144, 400, stroke=1, fill=1)
    c.setFillColorRGB(1.0, 0.75, 0.2)
    c.circle(w / 2, 560, 60, stroke=0, fill=1)
    c.setStrokeColorRGB(0.2, 0.3, 0.5)
    c.setLineWidth(3)
    for i in range(5):
        c.line(100 + i * 80, 320, 140 + i * 80, 460)
    c.drawImage(ImageReader(ledger_image().resize((60, 80))), 80, 620, width=60, height=80)
    c.showPage()
    c.save()
    return path, {"title": "Image Only", "text": "", "headings": [], "pages": [""], "blocks": [],
                  "furniture": [], "terms": [], "no_text_pages": [1]}


def make_encrypted(out, name, title, blocks, user, owner):
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.pdfencrypt import StandardEncryption
    path = os.path.join(out, name)
    enc = StandardEncryption(user, ownerPassword=owner, canPrint=1, canModify=0, canCopy=1,
                             canAnnotate=0, strength=128)
    c = new_canvas(path, title, encrypt=enc)
    w, h = A4
    f = Flow(c, 72, h - 72, w - 144, 60)
    for kind, text in blocks:
        f.block(kind, text)
    c.showPage()
    c.save()
    page = join_blocks(f.blocks)
    exp = {"title": title, "text": page, "headings": [], "pages": [page],
           "blocks": [{"kind": kind_name(k), "text": t} for k, t in f.blocks],
           "furniture": [], "no_text_pages": [],
           "encryption": {"algorithm": "RC4-128 (R3)", "user_password": user, "owner_password": owner}}
    if user:
        exp["password"] = user
    return path, exp


# ---------------------------------------------------------------------------------------------
# DOCX

DOCX_TITLE = "Quarterly Field Report"


def make_docx(out):
    import datetime
    import docx
    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from docx.opc.packuri import PackURI
    from docx.opc.part import Part
    from docx.oxml import parse_xml
    from docx.oxml.ns import nsdecls

    d = docx.Document()
    blocks, headings = [], []

    def para(kind, text, style=None):
        p = d.add_paragraph(text, style=style)
        blocks.append({"kind": kind, "text": text})
        return p

    def heading(text, level):
        d.add_heading(text, level=level)
        headings.append({"level": level, "text": text})
        blocks.append({"kind": "heading", "text": text})

    d.add_heading(DOCX_TITLE, level=0)  # the Title style
    blocks.append({"kind": "title", "text": DOCX_TITLE})
    heading("Summary", 1)
    para("paragraph", "The third quarter brought steady progress at all four coastal stations. "
                      "Rainfall was above the seasonal mean, and the new anemometers at Skerryvore "
                      "ran without a single interruption.")
    heading("Stations", 2)

    # A paragraph with a tracked change: "driftwood" deleted, "aluminium" inserted.
    p = d.add_paragraph("The crew repaired the ")
    ins_del = (
        f'<w:del {nsdecls("w")} w:id="101" w:author="Field Office" w:date="2024-09-30T10:00:00Z">'
        '<w:r><w:delText xml:space="preserve">rotten driftwood</w:delText></w:r></w:del>')
    p._p.append(parse_xml(ins_del))
    p._p.append(parse_xml(
        f'<w:ins {nsdecls("w")} w:id="102" w:author="Field Office" w:date="2024-09-30T10:00:00Z">'
        '<w:r><w:t>aluminium</w:t></w:r></w:ins>'))
    p.add_run(" jetty at Kilbrannan before the autumn storms.")
    blocks.append({"kind": "paragraph",
                   "text": "The crew repaired the aluminium jetty at Kilbrannan before the autumn storms."})

    heading("Equipment", 3)
    for item in ("Tide gauge recalibrated at Skerryvore",
                 "Spare batteries shipped to Kilbrannan",
                 "Weather mast painted with antifouling primer"):
        para("list_item", item, "List Bullet")
    for item in ("Inspect the mooring chains",
                 "Replace the corroded shackles",
                 "Log every reading in the ledger"):
        para("list_item", item, "List Number")

    heading("Measurements", 2)
    p = d.add_paragraph("The table below lists the mean readings for the quarter.")
    # The footnote reference goes right after "quarter" (before the full stop would be nicer,
    # but keeping the text in one run keeps the expected text simple).
    ref = parse_xml(f'<w:r {nsdecls("w")}><w:rPr><w:vertAlign w:val="superscript"/></w:rPr>'
                    '<w:footnoteReference w:id="1"/></w:r>')
    p._p.append(ref)
    blocks.append({"kind": "paragraph", "text": "The table below lists the mean readings for the quarter."})

    rows = [["Station", "Rainfall mm", "Wind knots"],
            ["Skerryvore", "212", "38"],
            ["Kilbrannan", "187", "29"],
            ["Portnahaven", "240", "44"]]
    t = d.add_table(rows=len(rows), cols=len(rows[0]))
    t.style = "Table Grid"
    for r, row in enumerate(rows):
        for ci, cell in enumerate(row):
            t.cell(r, ci).text = cell
            if r == 0:
                t.cell(r, ci).paragraphs[0].runs[0].bold = True
    # Mark the first row as a header row (repeats on each page in Word).
    trPr = t.rows[0]._tr.get_or_add_trPr()
    trPr.append(parse_xml(f'<w:tblHeader {nsdecls("w")}/>'))
    blocks.append({"kind": "table", "text": "\n".join("\t".join(r) for r in rows)})

    heading("Outlook", 1)
    para("paragraph", "Next quarter the team will install a seismometer at Portnahaven and begin the "
                      "overdue survey of the kelp beds.")

    d.sections[0].header.paragraphs[0].text = "Field Report \u2014 Internal"
    d.sections[0].footer.paragraphs[0].text = "Prepared by the Field Office"

    # The footnote part: python-docx has no footnote API, so add word/footnotes.xml by hand,
    # with the separator footnotes (-1, 0) Word expects.
    footnote = "Readings from Kilbrannan exclude the week of the generator fault."
    fxml = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        f'<w:footnotes {nsdecls("w")}>'
        '<w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:footnote>'
        '<w:footnote w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/>'
        '</w:r></w:p></w:footnote>'
        '<w:footnote w:id="1"><w:p><w:r><w:rPr><w:vertAlign w:val="superscript"/></w:rPr>'
        '<w:footnoteRef/></w:r><w:r><w:t xml:space="preserve"> </w:t></w:r>'
        f'<w:r><w:t>{footnote}</w:t></w:r></w:p></w:footnote>'
        '</w:footnotes>')
    part = Part(PackURI("/word/footnotes.xml"),
                "application/vnd.openxmlformats-officedocument.wordprocessingml.footnotes+xml",
                fxml.encode("utf-8"), d.part.package)
    d.part.relate_to(part, RT.FOOTNOTES)

    cp = d.core_properties
    cp.title = DOCX_TITLE
    cp.author = "ragline test fixtures"
    cp.last_modified_by = "ragline test fixtures"
    cp.subject = "Generated by scripts/gen-doc-fixtures.py"
    cp.comments = ""
    cp.revision = 1
    cp.created = cp.modified = datetime.datetime(2024, 10, 1, 12, 0, 0)
    cp.last_printed = datetime.datetime(2024, 10, 1, 12, 0, 0)

    # Keep the file small: drop the template's optional parts, a second 440 KB copy of the
    # styles (stylesWithEffects, for Word 2010) and a thumbnail image.
    for rels in (d.part.rels, d.part.package.rels):
        for rId, rel in list(rels.items()):
            if rel.reltype.endswith(("/stylesWithEffects", "/thumbnail")):
                rels.pop(rId)

    buf = io.BytesIO()
    d.save(buf)
    # Re-zip with fixed timestamps so the bytes do not depend on the clock.
    path = os.path.join(out, "report.docx")
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            zi = zipfile.ZipInfo(info.filename, date_time=(2024, 10, 1, 12, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            dst.writestr(zi, data)
    return path, {
        "title": DOCX_TITLE,
        "text": "\n\n".join(b["text"] for b in blocks),
        "headings": headings,
        "blocks": blocks,
        "table": rows,
        "footnotes": [footnote],
        "furniture": ["Field Report \u2014 Internal", "Prepared by the Field Office"],
        "absent": ["rotten driftwood", "driftwood"],
        "inserted": ["aluminium"],
        "terms": [{"term": t} for t in ("Skerryvore", "Kilbrannan", "Portnahaven", "seismometer",
                                         "shackles", "antifouling")],
    }


# ---------------------------------------------------------------------------------------------
# Check: read every fixture back with pypdfium2 / pypdf / python-docx.

def norm_words(text):
    import re
    import unicodedata
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"-\s*[\r\n]+\s*", "", text)  # a hyphen at a line end joins the word
    text = text.replace("\ufffe", "")  # pdfium's mark for such a hyphen (the line break dropped)
    return re.findall(r"\w+", text.lower())


def f1(got, want):
    from collections import Counter
    g, w = Counter(got), Counter(want)
    common = sum((g & w).values())
    if not got and not want:
        return 1.0
    if not common:
        return 0.0
    p, r = common / sum(g.values()), common / sum(w.values())
    return 2 * p * r / (p + r)


def check(out, produced):
    import pypdf
    import pypdfium2 as pdfium
    failures = []

    def expect(cond, msg):
        print(("  ok   " if cond else "  FAIL ") + msg)
        if not cond:
            failures.append(msg)

    for name, exp in produced.items():
        path = os.path.join(out, name)
        print(f"{name} ({os.path.getsize(path)} bytes)")
        expect(os.path.getsize(path) < 30 * 1024, "under 30 KB")
        if name.endswith(".docx"):
            import docx
            d = docx.Document(path)
            body = "\n".join(p.text for p in d.paragraphs)
            expect(d.core_properties.title == exp["title"], "core title")
            with zipfile.ZipFile(path) as z:
                xml = z.read("word/document.xml").decode()
                foot = z.read("word/footnotes.xml").decode()
            expect("<w:delText" in xml and "driftwood" in xml, "the deleted run is in the XML (w:delText)")
            expect("driftwood" not in body, "python-docx's paragraph text leaves the deletion out")
            expect("aluminium" in xml and "<w:ins " in xml, "the inserted run is in the XML (w:ins)")
            expect(exp["footnotes"][0] in foot and 'w:footnoteReference w:id="1"' in xml, "footnote part and reference")
            styles = [p.style.name for p in d.paragraphs]
            expect(styles.count("List Bullet") == 3 and styles.count("List Number") == 3, "list styles")
            expect(styles[0] == "Title", "Title style first")
            got = [(int(s.split()[-1]), p.text) for s, p in zip(styles, d.paragraphs) if s.startswith("Heading ")]
            expect(got == [(h["level"], h["text"]) for h in exp["headings"]], "heading levels and texts")
            expect([[c.text for c in r.cells] for r in d.tables[0].rows] == exp["table"], "table cells")
            continue
        # PDFs
        password = exp.get("password")
        try:
            pdfium.PdfDocument(path)
            opened_without = True
        except pdfium.PdfiumError:
            opened_without = False
        expect(opened_without == (password is None),
               "pypdfium2 " + ("needs the password" if password else "opens without a password"))
        doc = pdfium.PdfDocument(path, password=password)
        pages = [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
        expect(len(pages) == len(exp["pages"]), f"{len(exp['pages'])} pages")
        for i, (got, want) in enumerate(zip(pages, exp["pages"])):
            for line in exp.get("furniture", []):
                got = got.replace(line, " ")
            score = f1(norm_words(got), norm_words(want))
            if not want:
                expect(not got.strip(), f"page {i + 1} has no text (pdfium)")
            else:
                expect(score > 0.99, f"page {i + 1} word F1 {score:.3f} (pdfium)")
        expect(doc.get_metadata_dict().get("Title") == exp["title"], "Info title (pdfium)")
        if name == "single.pdf":
            toc = [(item.level, item.get_title()) for item in doc.get_toc()]
            expect(toc == [(h["level"] - 1, h["text"]) for h in exp["headings"]], "outline matches the headings")
            # pdfium expands ligatures itself ("film") and turns a hyphen at a line end into
            # U+FFFE with the line break dropped ("propul\ufffesion"); pypdf keeps both as drawn.
            raw = "".join(pages)
            expect("film" in raw and "flexible" in raw, "pdfium gives the ligatures as letters")
            expect("propul\ufffesion" in raw, "pdfium marks the line-end hyphen as U+FFFE")
            pp = "".join(p.extract_text() for p in pypdf.PdfReader(path).pages)
            expect("\ufb01lm" in pp and "\ufb02exible" in pp, "the text layer holds U+FB01/U+FB02 (pypdf)")
            expect("propul-\nsion" in pp, "the text layer holds 'propul-' at a line end (pypdf)")
            for i, want in enumerate(exp["pages"]):
                expect(f"Page {i + 1} of 3" in pages[i] and "\u2014 Draft" in pages[i], f"page {i + 1} header and footer")
        if name == "twocol.pdf":
            for i, (left, right) in enumerate(exp["columns"]):
                g = " ".join(norm_words(pages[i]))
                lw, rw = " ".join(norm_words(left)), " ".join(norm_words(right))
                expect(lw in g and rw in g and g.index(lw) < g.index(rw),
                       f"page {i + 1}: pdfium reads the left column whole, then the right")
        r = pypdf.PdfReader(path)
        if r.is_encrypted:
            ok_empty = r.decrypt("") != pypdf.PasswordType.NOT_DECRYPTED
            expect(ok_empty == (password is None), "pypdf: empty password " + ("refused" if password else "accepted"))
            if password:
                r = pypdf.PdfReader(path)
                expect(r.decrypt(password) != pypdf.PasswordType.NOT_DECRYPTED, "pypdf: the password opens it")
        ptext = [p.extract_text() for p in r.pages]
        for i, (got, want) in enumerate(zip(ptext, exp["pages"])):
            for line in exp.get("furniture", []):
                got = got.replace(line, " ")
            score = f1(norm_words(got), norm_words(want))
            if want:
                expect(score > 0.95, f"page {i + 1} word F1 {score:.3f} (pypdf)")
            else:
                expect(not got.strip(), f"page {i + 1} has no text (pypdf)")
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"total {total} bytes in {out}")
    if total >= 200 * 1024:
        failures.append("total over 200 KB")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "docs"))
    ap.add_argument("--check", action="store_true", help="read the files back and compare")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pdf_setup()
    produced = {}
    makers = [make_single, make_twocol, make_scanned, make_image_only,
              lambda o: make_encrypted(o, "encrypted.pdf", ENCRYPTED_TITLE, ENCRYPTED, "secret", "ragline-owner"),
              lambda o: make_encrypted(o, "encrypted-empty.pdf", ENCRYPTED_EMPTY_TITLE, ENCRYPTED_EMPTY, "", "ragline-owner"),
              make_docx]
    for make in makers:
        path, exp = make(args.out)
        exp = {k: v for k, v in exp.items() if not k.startswith("_")}
        base = os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(args.out, base + ".expected.json"), "w", encoding="utf-8") as w:
            json.dump(exp, w, ensure_ascii=False, indent=2)
            w.write("\n")
        produced[os.path.basename(path)] = exp
        print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")
    if args.check:
        failures = check(args.out, produced)
        if failures:
            print(f"{len(failures)} check(s) failed", file=sys.stderr)
            sys.exit(1)
        print("all checks passed")


if __name__ == "__main__":
    main()
