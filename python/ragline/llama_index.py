"""LlamaIndex adapters: ragline's embedder, index and chunker behind LlamaIndex's interfaces.

``pip install "ragline[llama-index]"`` (llama-index-core).

    from llama_index.core import Document, VectorStoreIndex
    from ragline.llama_index import RaglineEmbedding, RaglineNodeParser, RaglineRetriever

    index = VectorStoreIndex.from_documents(
        [Document(text=open("guide.md").read())],
        embed_model=RaglineEmbedding(), transformations=[RaglineNodeParser()])
    index.as_retriever(similarity_top_k=3).retrieve("how do I install it?")

    RaglineRetriever(index="sqlite://rag.db", k=5).retrieve("how do hooks work?")
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.node_parser.node_utils import build_nodes_from_splits
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle, TextNode
from pydantic import ConfigDict, Field, PrivateAttr

import ragline

__all__ = ["RaglineEmbedding", "RaglineNodeParser", "RaglineRetriever"]


#: The :class:`ragline.Embedder` arguments :class:`RaglineEmbedding` passes on.
_EMBEDDER_OPTIONS = ("device", "dtype", "query_prompt", "document_prompt", "dimensions",
                     "batch_tokens")


class RaglineEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model on a :class:`ragline.Embedder`: texts get the model's
    document prompt, queries its query prompt. Keyword arguments other than LlamaIndex's own
    go to the Embedder (``device``, ``dtype``, ``dimensions``, ...)."""

    _embedder: Any = PrivateAttr()

    def __init__(self, model_name: str = ragline.DEFAULT_MODEL, *,
                 embedder: Optional[ragline.Embedder] = None, embed_batch_size: int = 256,
                 **kwargs: Any) -> None:
        # LlamaIndex's BaseEmbedding keeps keywords it does not know: refuse them here, or
        # `model=PATH` (LangChain's spelling) would load the default model instead.
        unknown = [k for k in kwargs
                   if k not in _EMBEDDER_OPTIONS and k not in BaseEmbedding.model_fields]
        if unknown:
            hint = " (the model is model_name=, LlamaIndex's spelling)" if "model" in unknown else ""
            raise TypeError(f"RaglineEmbedding got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))}{hint}")
        mine = {k: kwargs.pop(k) for k in list(kwargs) if k in _EMBEDDER_OPTIONS}
        super().__init__(model_name=model_name, embed_batch_size=embed_batch_size, **kwargs)
        self._embedder = embedder if embedder is not None else ragline.Embedder(model_name, **mine)

    @classmethod
    def class_name(cls) -> str:
        return "RaglineEmbedding"

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._embedder.embed_query([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._embedder.embed_documents([text])[0].tolist()

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._embedder.embed_documents(list(texts)).tolist()

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> List[float]:
        return self._get_text_embedding(text)


class RaglineNodeParser(NodeParser):
    """A LlamaIndex node parser that cuts as ``ragline ingest`` does: by the model's tokens,
    within sections (markdown headings), code blocks and tables kept whole. Each node's
    metadata gets its ``heading_path``."""

    # A keyword that is no field is refused by name (LlamaIndex's default keeps it silently).
    model_config = ConfigDict(extra="forbid")

    model: str = Field(default=ragline.DEFAULT_MODEL, description="whose tokenizer counts")
    tokens: int = Field(default=256, description="tokens a chunk aims for")
    overlap: int = Field(default=32, description="tokens consecutive chunks share")
    format: str = Field(default="markdown", description="markdown, html, text or rst")

    @classmethod
    def class_name(cls) -> str:
        return "RaglineNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        out: List[BaseNode] = []
        for node in nodes:
            chunks = ragline.chunk(node.get_content(), self.model, self.tokens, self.overlap,
                                   self.format)
            made = build_nodes_from_splits([c.text for c in chunks], node, id_func=self.id_func)
            for n, c in zip(made, chunks):
                n.metadata["heading_path"] = " > ".join(c.heading_path)
            out.extend(made)
        return out


class RaglineRetriever(BaseRetriever):
    """A LlamaIndex retriever over a ragline index (``ragline search``): each hit a
    ``TextNode`` (id: the chunk id) with its score and metadata (document id, heading path,
    source, title, pages and the document's own metadata)."""

    def __init__(self, index: str = "sqlite://ragline.db", k: int = 4, mode: str = "hybrid",
                 where: Optional[List[str]] = None, device: str = "auto", exact: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._index = ragline.Index(index, device=device, exact=exact)
        self._k = k
        self._mode = mode
        self._where = where

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        hits = self._index.search(query_bundle.query_str, k=self._k, mode=self._mode,
                                  where=self._where)
        out = []
        for h in hits:
            meta = dict(h.metadata)
            meta.update(document_id=h.document_id, heading_path=h.heading_path, rank=h.rank)
            for name in ("source", "title", "pages"):
                if getattr(h, name) is not None:
                    meta[name] = getattr(h, name)
            out.append(NodeWithScore(node=TextNode(id_=h.chunk_id, text=h.text, metadata=meta),
                                     score=h.score))
        return out
