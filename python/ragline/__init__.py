"""ragline in Python: embed texts, chunk documents, build and search RAG indexes.

The work runs in ragline's Rust library, in this process, with the GIL released: vectors,
chunks, runs and search hits are those of the ``ragline`` command.

    >>> import ragline
    >>> emb = ragline.Embedder()                     # sentence-transformers/all-MiniLM-L6-v2
    >>> emb.embed(["hello world"]).shape
    (1, 384)
    >>> report = ragline.ingest(["docs/"], index="sqlite://rag.db")
    >>> ragline.Index("sqlite://rag.db").search("how do hooks work?", k=5)

Adapters: :mod:`ragline.langchain` and :mod:`ragline.llama_index`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _ragline
from ._ragline import DEFAULT_MODEL, Embedder, RaglineError

__version__ = _ragline.version()

__all__ = [
    "DEFAULT_MODEL",
    "Chunk",
    "Embedder",
    "Hit",
    "Index",
    "RaglineError",
    "RunReport",
    "chunk",
    "ingest",
]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Chunk:
    """A chunk of a text, as ``ragline ingest`` cuts it.

    ``start`` and ``end`` are character offsets in the *extracted* text (markup and front
    matter stripped), so ``extracted[start:end] == text``; ``tokens`` counts the model's
    tokens (special tokens excluded); ``heading_path`` lists the headings above the chunk,
    outermost first.
    """

    text: str
    heading_path: List[str]
    tokens: int
    start: int
    end: int


def chunk(
    text: str,
    model: str = DEFAULT_MODEL,
    tokens: int = 256,
    overlap: int = 32,
    format: str = "markdown",
) -> List[Chunk]:
    """Cut ``text`` into chunks of about ``tokens`` model tokens, as ``ragline ingest`` does.

    ``format`` is how the text is read: ``"markdown"`` (headings give each chunk its heading
    path; code blocks and tables are kept whole), ``"html"``, ``"text"`` or ``"rst"``.
    Sections are never mixed in a chunk; consecutive chunks of a section share ``overlap``
    tokens. ``model`` names the tokenizer the sizes count in (only the tokenizer is loaded).
    """
    rows, _extracted = _ragline.chunk(text, model, tokens, overlap, format)
    return [Chunk(t, list(h), n, s, e) for (t, h, n, s, e) in rows]


class RunReport(dict):
    """What an ingest run did: the fields ``ragline ingest --report FILE`` writes.

    A dict (``json.dumps`` works) whose keys are also attributes: ``counts`` (``indexed``,
    ``failed``, ``dropped``, ...), ``chunks_embedded``, ``chunks_reused``,
    ``tokens_embedded``, ``elapsed_secs``, ``failures`` and ``dropped`` (each document with
    its stage and reason), ``missing_from_source``, ``pruned``, ``encoder``, ...
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def succeeded(self) -> bool:
        """Every document reached the index or was dropped with a reason (exit code 0)."""
        return not self.get("failures") and self.get("counts", {}).get("failed", 0) == 0

    def __repr__(self) -> str:
        c = self.get("counts", {})
        return (
            f"RunReport(index={self.get('index')!r}, indexed={c.get('indexed', 0)}, "
            f"failed={c.get('failed', 0)}, dropped={c.get('dropped', 0)}, "
            f"chunks_embedded={self.get('chunks_embedded', 0)}, "
            f"elapsed_secs={self.get('elapsed_secs', 0):.2f})"
        )


def _plain(value: Any) -> Any:
    """An option's value as the typed request takes it: paths as str, tuples as lists."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _tqdm_progress() -> Optional[Tuple[Callable[[Dict[str, Any]], None], Callable[[], None]]]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    bar = tqdm(total=None, unit="doc", desc="ingest")

    def update(p: Dict[str, Any]) -> None:
        if p["documents_total"] and bar.total != p["documents_total"]:
            bar.total = p["documents_total"]
        bar.n = p["documents_done"]
        bar.set_postfix(chunks=p["chunks_embedded"], failed=p["failed"], refresh=False)
        bar.refresh()

    return update, bar.close


def ingest(
    paths: Union[PathLike, Sequence[PathLike]],
    index: str = "sqlite://ragline.db",
    model: Optional[str] = None,
    *,
    progress: Union[None, bool, Callable[[Dict[str, Any]], None]] = None,
    config: Optional[PathLike] = None,
    **options: Any,
) -> RunReport:
    """Read, chunk, embed and index ``paths`` (files and folders), as ``ragline ingest``.

    ``options`` are ingest's flags with underscores: ``chunk_tokens=512``, ``prune=True``,
    ``defer="embed"``, ``exclude=["drafts/*"]`` (a list repeats the flag), ``workers=4``,
    ``ann="hnsw"``, ``device="cpu"``, ``report="run.json"``... They fill the same typed request
    the CLI's flags fill: an unknown option or a value of the wrong type raises
    :class:`TypeError` naming it, a value that cannot work (``defer="tokenize"``)
    :class:`ValueError`. ``model`` defaults to the config's, else
    sentence-transformers/all-MiniLM-L6-v2.

    ``progress``: a callable (called five times a second with a dict: ``documents_done``,
    ``documents_total``, ``indexed``, ``failed``, ``dropped``, ``in_flight``,
    ``chunks_embedded``, ``elapsed_secs``), ``False`` for none, or ``None`` (the default) for a
    tqdm bar when tqdm is installed. Documents that fail are in the report (``failures``), and
    the run goes on; a run that cannot start raises :class:`RaglineError`.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]  # type: ignore[list-item]
    paths = [os.fspath(p) for p in paths]  # type: ignore[union-attr]
    options = {name: _plain(v) for name, v in options.items() if v is not None}
    close: Optional[Callable[[], None]] = None
    callback: Optional[Callable[[Dict[str, Any]], None]]
    if callable(progress):
        callback = progress
    elif progress is None or progress is True:
        made = _tqdm_progress()
        if made is None and progress is True:
            raise RaglineError("progress=True needs tqdm: pip install tqdm")
        callback, close = made if made else (None, None)
    else:
        callback = None
    try:
        return RunReport(_ragline.ingest(
            paths, index, model, os.fspath(config) if config is not None else None, callback,
            options))
    finally:
        if close is not None:
            close()


@dataclass(frozen=True)
class Hit:
    """A search result: a chunk, its score and rank, and where it comes from."""

    rank: int
    score: float
    text: str
    document_id: str
    chunk_id: str
    heading_path: str
    source: Optional[str] = None
    title: Optional[str] = None
    pages: Optional[Tuple[int, int]] = None
    metadata: Dict[str, Any] = field(default_factory=dict)
    outputs: Dict[str, str] = field(default_factory=dict)
    superseded: bool = False
    #: The document's entities (the entities stage): ``{"type", "text", "norm", "mentions",
    #: "score"}``, most mentioned first.
    entities: List[Dict[str, Any]] = field(default_factory=list)
    #: The document's labels (the labels stage): ``{"label", "score"}``, best first.
    labels: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def _of(cls, h: Dict[str, Any]) -> "Hit":
        pages = h.get("pages")
        return cls(
            rank=h["rank"],
            score=h["score"],
            text=h["text"],
            document_id=h["document_id"],
            chunk_id=h["id"],
            heading_path=h["heading_path"],
            source=h.get("source"),
            title=h.get("title"),
            pages=tuple(pages) if pages else None,  # type: ignore[arg-type]
            metadata=h.get("metadata") or {},
            outputs=h.get("outputs") or {},
            superseded=h.get("superseded", False),
            entities=h.get("entities") or [],
            labels=h.get("labels") or [],
        )


class Index:
    """A ragline index (``sqlite://PATH`` or ``postgres://...``), opened for searching.

    Vector and hybrid search embed the query with the index's own model (loaded once, on
    ``device``); keyword search needs no model. ``exact=True`` scans every vector instead of
    the approximate nearest-neighbour index.
    """

    def __init__(self, uri: str = "sqlite://ragline.db", *, device: str = "auto",
                 dtype: str = "auto", exact: bool = False,
                 config: Optional[PathLike] = None) -> None:
        self._index = _ragline.Index(uri, device, dtype, exact,
                                     os.fspath(config) if config is not None else None)
        #: The URI without its secrets (a password becomes ``***``): safe to print and log.
        self.uri: str = self._index.uri

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               where: Union[None, str, Sequence[str]] = None) -> List[Hit]:
        """The ``k`` best chunks for ``query``: ``mode`` is ``"vector"``, ``"keyword"`` or
        ``"hybrid"`` (both, by reciprocal rank fusion), as ``ragline search``. ``where``
        filters as ``--where``: ``"source=docs/api/*"`` (a glob on the document id),
        ``"KEY=VALUE"`` on document metadata, ``"entity.ORG=Acme Corp"``, ``"label=sports"``;
        a list ANDs them."""
        if isinstance(where, str):
            where = [where]
        raw = self._index.search(query, k, mode, list(where) if where else None)
        return [Hit._of(h) for h in raw]

    def search_json(self, query: str, k: int = 10, mode: str = "hybrid",
                    where: Union[None, str, Sequence[str]] = None) -> List[Dict[str, Any]]:
        """The hits as ``ragline search --json`` prints them (plain dicts)."""
        if isinstance(where, str):
            where = [where]
        return self._index.search(query, k, mode, list(where) if where else None)

    def status(self) -> Dict[str, Any]:
        """The index's lifecycle, as ``ragline status --json``: documents, chunks, per-stage
        counts, vector sets, backfill progress."""
        return self._index.status()

    def __repr__(self) -> str:
        return f"Index({self.uri!r})"
