"""chunk, ingest, Index: the chunks, runs and hits of the `ragline` command."""

import json
import sqlite3

import pytest

import ragline
from ragline import _ragline
from conftest import cli_json, ragline_commands, run_cli

MARKDOWN = """---
title: Using hooks
---

# Hooks

Hooks let you use state and other React features without writing a class.

## useState

`useState` declares a state variable. """ + " ".join(
    f"Sentence {i} explains how state is preserved between renders." for i in range(60)
) + """

```js
const [count, setCount] = useState(0);
```

## useEffect

Effects let you synchronize a component with an external system.
"""


def test_chunks_follow_the_sections_and_the_token_budget(model_ready):
    chunks = ragline.chunk(MARKDOWN, tokens=64, overlap=8)
    assert len(chunks) >= 4
    assert all(0 < c.tokens <= 64 + 32 for c in chunks)  # a code block may grow a chunk
    paths = [tuple(c.heading_path) for c in chunks]
    assert ("Using hooks", "useState") in paths or ("Hooks", "useState") in paths or any(
        p[-1] == "useState" for p in paths)
    assert paths[-1][-1] == "useEffect"
    # start/end are character offsets in the extracted text.
    rows, extracted = _ragline.chunk(MARKDOWN, ragline.DEFAULT_MODEL, 64, 8, "markdown")
    for (text, _, _, start, end) in rows:
        assert extracted[start:end] == text
    assert "---" not in extracted  # front matter is not text


def test_chunk_refuses_bad_settings(model_ready):
    with pytest.raises(ValueError, match="overlap"):
        ragline.chunk("some text", tokens=64, overlap=40)
    with pytest.raises(ValueError, match="format `pdf`"):
        ragline.chunk("some text", format="pdf")
    with pytest.raises(TypeError, match="text must be a str"):
        ragline.chunk(b"bytes")
    assert ragline.chunk("   ") == []


@pytest.fixture(scope="module")
def index(corpus, tmp_path_factory, model_ready):
    db = tmp_path_factory.mktemp("index") / "rag.db"
    seen = []
    report = ragline.ingest([corpus], index=f"sqlite://{db}", device="cpu",
                            progress=seen.append)
    return db, report, seen


def test_ingest_reports_the_run(index, corpus):
    db, report, seen = index
    n = len(list(corpus.glob("*.md")))
    assert report.counts["indexed"] == n
    assert report.succeeded
    assert report.chunks_embedded > n
    assert isinstance(json.dumps(report), str)  # a plain dict underneath
    assert seen and seen[-1]["documents_done"] <= n
    # What ingest wrote is what chunk() cuts, document by document.
    con = sqlite3.connect(db)
    for page in sorted(corpus.glob("*.md"))[:3]:
        stored = [t for (t,) in con.execute(
            "SELECT text FROM chunks WHERE document_id = ? ORDER BY ordinal",
            (page.name,))]
        assert stored == [c.text for c in ragline.chunk(page.read_text(encoding="utf-8"))]


def test_a_second_run_embeds_nothing(index, corpus):
    db, _, _ = index
    again = ragline.ingest(corpus, index=f"sqlite://{db}", device="cpu", progress=False)
    assert again.chunks_embedded == 0
    assert again.counts["indexed"] + again.counts.get("unchanged", 0) >= 0
    assert again.succeeded


def test_ingest_options_are_the_clis_flags(corpus, tmp_path, model_ready):
    with pytest.raises(TypeError, match="unknown option `no_such_flag`"):
        ragline.ingest(corpus, index=f"sqlite://{tmp_path}/x.db", no_such_flag=3, progress=False)
    with pytest.raises(TypeError, match="option `chunk_tokens`: .*integer"):
        ragline.ingest(corpus, index=f"sqlite://{tmp_path}/x.db", chunk_tokens="many",
                       progress=False)
    with pytest.raises(TypeError, match="--follow never returns"):
        ragline.ingest(corpus, index=f"sqlite://{tmp_path}/x.db", follow=True, progress=False)
    with pytest.raises(ValueError, match="--defer tokenize: only `embed`"):
        ragline.ingest(corpus, index=f"sqlite://{tmp_path}/x.db", defer="tokenize",
                       progress=False)
    assert not (tmp_path / "x.db").exists()
    r = ragline.ingest(corpus, index=f"jsonl:{tmp_path}/out.jsonl", no_chunk=True,
                       progress=False, report=tmp_path / "report.json")
    assert r.counts["indexed"] == len(list(corpus.glob("*.md")))
    assert json.loads((tmp_path / "report.json").read_text())["counts"] == r.counts
    # The options a list or one string, paths as path objects: as the flags take them.
    first = sorted(corpus.glob("*.md"))[0]
    r = ragline.ingest(corpus, index=f"jsonl:{tmp_path}/two.jsonl", no_chunk=True,
                       progress=False, exclude=first.name, ext=["md"])
    assert r.counts["indexed"] == len(list(corpus.glob("*.md"))) - 1


def test_a_progress_callback_that_raises_is_raised_at_the_end(corpus, tmp_path, model_ready):
    def boom(_):
        raise RuntimeError("stop the bar")

    with pytest.raises(RuntimeError, match="stop the bar"):
        ragline.ingest(corpus, index=f"jsonl:{tmp_path}/o.jsonl", no_chunk=True, progress=boom)


@pytest.mark.parametrize("mode", ["vector", "keyword", "hybrid"])
@pytest.mark.parametrize("cmd", ragline_commands(), ids=lambda c: c[0].rsplit("/", 1)[-1])
def test_search_equals_the_clis_json(index, mode, cmd):
    db, _, _ = index
    ix = ragline.Index(f"sqlite://{db}", device="cpu")
    query = "how do I keep state between renders"
    ours = ix.search_json(query, k=5, mode=mode)
    cli = cli_json(cmd, "search", query, "--index", f"sqlite://{db}", "-k", "5", "--mode", mode,
                   "--json", "--device", "cpu")
    assert [h["id"] for h in ours] == [h["id"] for h in cli]
    assert [round(h["score"], 5) for h in ours] == [round(h["score"], 5) for h in cli]
    hits = ix.search(query, k=5, mode=mode)
    assert [h.chunk_id for h in hits] == [h["id"] for h in cli]
    assert all(h.text and h.document_id and h.rank == i + 1 for i, h in enumerate(hits))


def test_where_filters_and_bad_queries(index):
    db, _, _ = index
    ix = ragline.Index(f"sqlite://{db}", device="cpu")
    some = ix.search("state", k=1, mode="keyword")[0].document_id
    only = ix.search("state", k=10, mode="hybrid", where=f"source=*{some.rsplit('/', 1)[-1]}")
    assert only and {h.document_id for h in only} == {some}
    with pytest.raises(ValueError, match="mode"):
        ix.search("x", mode="fuzzy")
    with pytest.raises(TypeError, match="query must be a str"):
        ix.search(None)
    with pytest.raises(ragline.RaglineError):
        ragline.Index("sqlite:///no/such/dir/x.db").search("x")
    # A huge k is refused before it reaches the index (it once aborted the interpreter).
    for k in (2**62, 10_001, 0):
        with pytest.raises(ValueError, match="1 to 10000"):
            ix.search("state", k=k, mode="vector")
    with pytest.raises((ValueError, OverflowError)):
        ix.search("state", k=-1)
    assert len(ix.search("state", k=10_000, mode="keyword")) >= 1


def test_status_is_the_clis(index):
    db, _, _ = index
    ours = ragline.Index(f"sqlite://{db}").status()
    cli = cli_json(ragline_commands()[0], "status", "--index", f"sqlite://{db}", "--json")
    for key in ("documents", "chunks", "vector_sets"):
        assert ours[key] == cli[key]
    assert ours["documents"] > 0


def test_an_index_never_shows_its_password(model_ready):
    uri = "postgres://reader:hunter2-secret@127.0.0.1:1/docs?sslmode=disable"
    idx = ragline.Index(uri)
    for shown in (repr(idx), str(idx), idx.uri, repr(idx._index), idx._index.uri):
        assert "hunter2" not in shown, shown
        assert "reader" in shown and "127.0.0.1:1/docs" in shown, shown


def test_the_console_script_is_the_command(tmp_path):
    for cmd in ragline_commands():
        h = run_cli(cmd, "--help")
        assert "ingest" in h.stdout and h.returncode == 0
    script = ragline_commands()[0]
    bad = run_cli(script, "no-such-command", check=False)
    assert bad.returncode == 2 and "no-such-command" in bad.stderr
    missing = run_cli(script, "search", "x", "--index", f"sqlite://{tmp_path}/none.db",
                      check=False)
    for cmd in ragline_commands()[1:]:
        other = run_cli(cmd, "search", "x", "--index", f"sqlite://{tmp_path}/none.db",
                        check=False)
        assert other.returncode == missing.returncode
        assert other.stderr == missing.stderr
    assert missing.returncode != 0
