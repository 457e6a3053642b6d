"""LangChain adapters: ragline's embedder, index and chunker behind LangChain's interfaces.

``pip install "ragline[langchain]"`` (langchain-core and langchain-text-splitters).

    from langchain_core.vectorstores import InMemoryVectorStore
    from ragline.langchain import RaglineEmbeddings, RaglineRetriever, RaglineTextSplitter

    store = InMemoryVectorStore(RaglineEmbeddings())
    store.add_documents(RaglineTextSplitter().create_documents([open("guide.md").read()]))
    store.similarity_search("how do I install it?", k=3)

    RaglineRetriever(index="sqlite://rag.db", k=5).invoke("how do hooks work?")
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_text_splitters import TextSplitter
from pydantic import ConfigDict, PrivateAttr

import ragline

__all__ = ["RaglineEmbeddings", "RaglineRetriever", "RaglineTextSplitter"]


class RaglineEmbeddings(Embeddings):
    """LangChain ``Embeddings`` on a :class:`ragline.Embedder`: documents get the model's
    document prompt, queries its query prompt (sentence-transformers' ``encode_document`` and
    ``encode_query``). Pass ``embedder=`` to share a loaded model, or the Embedder's
    arguments (``model``, ``device``, ``dtype``, ``dimensions``, ...)."""

    def __init__(self, model: str = ragline.DEFAULT_MODEL, *,
                 embedder: Optional[ragline.Embedder] = None, **kwargs: Any) -> None:
        if "model_name" in kwargs:
            raise TypeError("RaglineEmbeddings got an unexpected keyword argument 'model_name' "
                            "(the model is model=, LangChain's spelling)")
        self.embedder = embedder if embedder is not None else ragline.Embedder(model, **kwargs)

    def embed_documents(self, texts: List[str]) -> List[List[float]]:
        return self.embedder.embed_documents(list(texts)).tolist()

    def embed_query(self, text: str) -> List[float]:
        return self.embedder.embed_query([text])[0].tolist()


def _metadata(hit: ragline.Hit) -> Dict[str, Any]:
    meta: Dict[str, Any] = dict(hit.metadata)
    meta.update(
        document_id=hit.document_id,
        chunk_id=hit.chunk_id,
        heading_path=hit.heading_path,
        score=hit.score,
        rank=hit.rank,
    )
    for name in ("source", "title", "pages"):
        value = getattr(hit, name)
        if value is not None:
            meta[name] = value
    return meta


class RaglineRetriever(BaseRetriever):
    """A LangChain retriever over a ragline index: ``ragline search`` (``mode`` vector,
    keyword or hybrid; ``where`` filters as ``--where``), each hit a ``Document`` whose
    metadata holds the document id, chunk id, heading path, score, rank, source, title,
    pages and the document's own metadata."""

    # A keyword that is no field (`top_k=`) is refused by name, not ignored.
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    index: str = "sqlite://ragline.db"
    k: int = 4
    mode: str = "hybrid"
    where: Optional[List[str]] = None
    device: str = "auto"
    exact: bool = False

    _index: Optional[ragline.Index] = PrivateAttr(default=None)

    def _open(self) -> ragline.Index:
        if self._index is None:
            self._index = ragline.Index(self.index, device=self.device, exact=self.exact)
        return self._index

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> List[Document]:
        hits = self._open().search(query, k=self.k, mode=self.mode, where=self.where)
        return [Document(page_content=h.text, metadata=_metadata(h), id=h.chunk_id) for h in hits]


class RaglineTextSplitter(TextSplitter):
    """A LangChain ``TextSplitter`` that cuts as ``ragline ingest`` does: by the model's
    tokens, within sections (markdown headings), code blocks and tables kept whole.
    ``create_documents`` puts each chunk's ``heading_path`` and ``tokens`` in its metadata."""

    def __init__(self, model: str = ragline.DEFAULT_MODEL, tokens: int = 256,
                 overlap: int = 32, format: str = "markdown", **kwargs: Any) -> None:
        super().__init__(chunk_size=tokens, chunk_overlap=overlap, **kwargs)
        self.model = model
        self.tokens = tokens
        self.overlap = overlap
        self.format = format

    def _chunks(self, text: str) -> List[ragline.Chunk]:
        return ragline.chunk(text, self.model, self.tokens, self.overlap, self.format)

    def split_text(self, text: str) -> List[str]:
        return [c.text for c in self._chunks(text)]

    def create_documents(self, texts: List[str],
                         metadatas: Optional[List[dict]] = None) -> List[Document]:
        metadatas = metadatas or [{} for _ in texts]
        docs = []
        for text, meta in zip(texts, metadatas):
            for c in self._chunks(text):
                m = dict(meta)
                m.update(heading_path=" > ".join(c.heading_path), tokens=c.tokens)
                if self._add_start_index:
                    m["start_index"] = c.start
                docs.append(Document(page_content=c.text, metadata=m))
        return docs

    def split_documents(self, documents: Iterable[Document]) -> List[Document]:
        documents = list(documents)
        return self.create_documents([d.page_content for d in documents],
                                     [dict(d.metadata) for d in documents])
