#!/usr/bin/env python3
"""Reference vectors from sentence-transformers, for ragline's parity test.

    python3 scripts/reference-embeddings.py [--model models/all-MiniLM-L6-v2] [--texts-only]

Writes tests/fixtures/parity/texts.jsonl (a fixed, varied set of texts: short and long past
256 tokens, code, non-English, emoji, edge cases; built once from ../shared/data and kept) and
tests/fixtures/parity/reference.npy (float32, one row per text) with reference.json (versions).
Needs sentence-transformers (pip install sentence-transformers).
"""
import argparse
import json
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "parity")
DATA = os.path.join(ROOT, "..", "shared", "data")

NON_ENGLISH = [
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El niño juega al fútbol en el parque con sus amigos.",
    "La programmazione funzionale evita lo stato mutabile.",
    "Ein Übersetzungsfehler führte zu großen Missverständnissen.",
    "O café da manhã é a refeição mais importante do dia.",
    "Het weer is vandaag erg mooi in Amsterdam.",
    "Москва — столица России и крупнейший город страны.",
    "Машинное обучение меняет способ обработки текстов.",
    "東京は日本の首都であり、世界最大の都市圏の一つです。",
    "機械学習は自然言語処理に革命をもたらしました。",
    "北京是中国的首都，有着悠久的历史。",
    "人工智能正在改变我们的生活方式。",
    "서울은 대한민국의 수도입니다.",
    "الذكاء الاصطناعي يغير العالم بسرعة كبيرة.",
    "हिन्दी भारत की सबसे अधिक बोली जाने वाली भाषा है।",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "Türkçe öğrenmek sabır ve pratik gerektirir.",
    "Tiếng Việt có sáu thanh điệu khác nhau.",
    "ภาษาไทยมีพยัญชนะสี่สิบสี่ตัว",
    "עברית נכתבת מימין לשמאל.",
    "Žluťoučký kůň úpěl ďábelské ódy.",
    "Zażółć gęślą jaźń — polskie znaki diakrytyczne.",
    "Käännös suomeksi on joskus hankalaa.",
    "Crème brûlée, naïve café, résumé, coöperate, façade.",
    "Straße, Maß, Fußgänger und Größe enthalten Sonderzeichen.",
    "Ünïcödé wïth lóts öf äccénts ëvërywhërë.",
    "日本語とEnglishが混ざった文章もあります。",
    "Mixed: Привет, world! 你好, 世界! مرحبا",
    "Ｆｕｌｌｗｉｄｔｈ　ｃｈａｒａｃｔｅｒｓ　１２３",
]

EMOJI = [
    "I love pizza 🍕🍕🍕!",
    "Deploy succeeded ✅ tests passing 🎉",
    "🚀 Launching the new version today",
    "Weather: ☀️ then 🌧️ then ⛈️",
    "Family: 👨‍👩‍👧‍👦 and flags 🇫🇷 🇯🇵 🇧🇷",
    "Skin tones 👍🏻 👍🏽 👍🏿",
    "😀😃😄😁😆😅😂🤣",
    "Bug 🐛 found in production 🔥🔥",
    "Coffee ☕ + code 💻 = ❤️",
    "Math symbols ∑ ∫ √ ∞ ≈ ≠ ≤ ≥",
    "Arrows → ← ↑ ↓ ⇒ and boxes ■ □ ▲",
    "Currency € £ ¥ ₹ ₽ $ 100",
    "Music 🎵🎶 all night long 🌙",
    "Keycaps 1️⃣ 2️⃣ 3️⃣ #️⃣",
    "Zero width joiner test: 👩‍💻 👨‍🔬",
    "Emoji only: 🙂",
    "Thumbs up 👍 from the team",
    "🎂 Happy birthday! 🎁🎈",
    "Error ❌ warning ⚠️ info ℹ️",
    "Nature 🌲🌳🌴🌵🌷🌸",
]

EDGE = [
    "",
    " ",
    "a",
    "A",
    "?",
    "...",
    "!!!???",
    "1234567890",
    "3.14159 2.71828 1.41421",
    "x" * 150,
    "supercalifragilisticexpialidocious " * 3,
    "Tab\tseparated\tvalues\there",
    "Line one\nLine two\n\nLine four",
    "Control\x00chars\x01and\x7fdelete",
    "Zero\u200bwidth\u200bspaces and soft\u00adhyphens",
    "Combining e\u0301 and a\u0308 marks",
    "https://example.com/path?query=1&b=two#frag",
    "user@example.com wrote: <b>bold</b> &amp; more",
    "C++ vs C# vs F# vs Objective-C",
    "don't can't won't shouldn't y'all",
    "ALL CAPS SENTENCE FOR EMPHASIS",
    "camelCaseIdentifier snake_case_identifier kebab-case-identifier",
    "| col a | col b |\n|---|---|\n| 1 | 2 |",
    "<div class=\"x\"><p>Hello</p></div>",
    "    indented text with trailing spaces    ",
]


def sentences_from_sts(n):
    path = os.path.join(DATA, "stsb", "sts-test.tsv")
    out = []
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            _, a, b = line.rstrip("\n").split("\t")[:3]
            out.extend([a, b])
    random.Random(1).shuffle(out)
    return out[:n]


def markdown_files(sub, pattern=".md"):
    files = []
    for d, _, names in os.walk(os.path.join(DATA, sub)):
        for name in names:
            if name.endswith(pattern):
                files.append(os.path.join(d, name))
    return sorted(files)


def long_texts(n, rng):
    out = []
    files = markdown_files("react-docs")
    rng.shuffle(files)
    for path in files:
        text = open(path, encoding="utf-8").read()
        prose = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 200 and not p.startswith(("```", "<", "#", "---"))]
        if len(prose) >= 3:
            # A few paragraphs together: well past 256 tokens.
            out.append("\n\n".join(prose[:6]))
        if len(out) == n:
            break
    return out


def code_texts(n, rng):
    out = []
    files = markdown_files("react-docs")
    rng.shuffle(files)
    for path in files:
        text = open(path, encoding="utf-8").read()
        for m in re.finditer(r"```[a-z]*[^\n]*\n(.*?)```", text, re.S):
            code = m.group(1).strip()
            if 40 < len(code) < 3000:
                out.append(code)
                break
        if len(out) == n:
            break
    return out


def mdn_texts(n, rng):
    files = markdown_files("mdn")
    rng.shuffle(files)
    out = []
    for path in files[: n * 3]:
        text = open(path, encoding="utf-8").read()
        body = text.split("---", 2)[-1].strip()
        if len(body) > 100:
            out.append(body[: rng.choice([300, 800, 2000, 5000])])
        if len(out) == n:
            break
    return out


def build_texts():
    rng = random.Random(42)
    texts = []
    texts += [("sts", t) for t in sentences_from_sts(60)]
    texts += [("long", t) for t in long_texts(40, rng)]
    texts += [("code", t) for t in code_texts(30, rng)]
    texts += [("mdn", t) for t in mdn_texts(25, rng)]
    texts += [("non-english", t) for t in NON_ENGLISH]
    texts += [("emoji", t) for t in EMOJI]
    texts += [("edge", t) for t in EDGE]
    return [{"id": f"{kind}-{i}", "kind": kind, "text": t} for i, (kind, t) in enumerate(texts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--texts-only", action="store_true")
    ap.add_argument("--rebuild-texts", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    texts_path = os.path.join(OUT, "texts.jsonl")
    if args.rebuild_texts or not os.path.exists(texts_path):
        rows = build_texts()
        with open(texts_path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} texts to {texts_path}")
    rows = [json.loads(l) for l in open(texts_path, encoding="utf-8")]
    if args.texts_only:
        return
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.model, device="cpu")
    vectors = model.encode([r["text"] for r in rows], batch_size=32, convert_to_numpy=True)
    np.save(os.path.join(OUT, "reference.npy"), vectors.astype(np.float32))
    tok = model.tokenizer
    lengths = [len(tok(r["text"], truncation=False)["input_ids"]) for r in rows]
    meta = {
        "model": os.path.basename(os.path.normpath(args.model)),
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "max_seq_length": model.max_seq_length,
        "texts": len(rows),
        "over_256_tokens": sum(1 for n in lengths if n > 256),
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    sys.exit(main())
