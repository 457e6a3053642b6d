"""The LangChain and LlamaIndex adapters, against the real langchain-core and
llama-index-core from PyPI."""

import pytest

import ragline
from conftest import cli_json, ragline_commands

DOCS = {
    "install.md": "# Installing\n\nRun pip install ragline to install the package. "
                  "It needs Python 3.9 or newer.",
    "cats.md": "# Cats\n\nCats sleep for most of the day and hunt at dawn and dusk.",
    "rust.md": "# Rust\n\nThe borrow checker makes sure references never outlive their data.",
}


@pytest.fixture(scope="module")
def shared_embedder(model_ready):
    return ragline.Embedder(device="cpu")


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, model_ready):
    root = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (root / name).write_text(text)
    db = root / "rag.db"
    ragline.ingest(root, index=f"sqlite://{db}", device="cpu", progress=False)
    return f"sqlite://{db}"


def test_langchain_in_memory_store_answers(shared_embedder):
    from langchain_core.vectorstores import InMemoryVectorStore

    from ragline.langchain import RaglineEmbeddings, RaglineTextSplitter

    splitter = RaglineTextSplitter(tokens=64, overlap=8)
    docs = splitter.create_documents(list(DOCS.values()),
                                     metadatas=[{"name": n} for n in DOCS])
    assert {d.metadata["name"] for d in docs} == set(DOCS)
    assert all("heading_path" in d.metadata for d in docs)
    store = InMemoryVectorStore(RaglineEmbeddings(embedder=shared_embedder))
    store.add_documents(docs)
    best = store.similarity_search("how do I install it?", k=1)[0]
    assert best.metadata["name"] == "install.md"
    emb = RaglineEmbeddings(embedder=shared_embedder)
    assert len(emb.embed_query("hi")) == 384
    assert len(emb.embed_documents(["a", "b"])) == 2
    assert "Cats sleep" in splitter.split_text(DOCS["cats.md"])[0]


def test_langchain_retriever_returns_the_clis_hits(small_index):
    from langchain_core.documents import Document

    from ragline.langchain import RaglineRetriever

    r = RaglineRetriever(index=small_index, k=3, device="cpu")
    got = r.invoke("what does the borrow checker do")
    assert all(isinstance(d, Document) for d in got)
    cli = cli_json(ragline_commands()[0], "search", "what does the borrow checker do",
                   "--index", small_index, "-k", "3", "--json", "--device", "cpu")
    assert [d.metadata["chunk_id"] for d in got] == [h["id"] for h in cli]
    assert [d.page_content for d in got] == [h["text"] for h in cli]
    assert got[0].metadata["document_id"].endswith("rust.md")


def test_llama_index_vector_store_index_answers(shared_embedder):
    from llama_index.core import Document, VectorStoreIndex

    from ragline.llama_index import RaglineEmbedding, RaglineNodeParser

    docs = [Document(text=t, metadata={"name": n}) for n, t in DOCS.items()]
    parser = RaglineNodeParser(tokens=64, overlap=8)
    index = VectorStoreIndex.from_documents(
        docs, embed_model=RaglineEmbedding(embedder=shared_embedder), transformations=[parser])
    best = index.as_retriever(similarity_top_k=1).retrieve("when do cats hunt?")[0]
    assert best.node.metadata["name"] == "cats.md"
    assert best.node.metadata["heading_path"] == "Cats"
    nodes = parser.get_nodes_from_documents(docs)
    assert len(nodes) == 3 and nodes[0].ref_doc_id == docs[0].doc_id


def test_llama_index_retriever_returns_the_clis_hits(small_index):
    from ragline.llama_index import RaglineRetriever

    got = RaglineRetriever(index=small_index, k=3, device="cpu").retrieve("Python version")
    cli = cli_json(ragline_commands()[0], "search", "Python version", "--index", small_index,
                   "-k", "3", "--json", "--device", "cpu")
    assert [n.node.node_id for n in got] == [h["id"] for h in cli]
    assert [round(n.score, 6) for n in got] == [round(h["score"], 6) for h in cli]


def test_the_readme_examples_run_as_written(tmp_path, model_ready):
    """The Python section's code blocks, in order, from a folder laid out as the repository
    (tests/fixtures/react), as a user pastes them."""
    import re
    import shutil

    from conftest import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 4
    shutil.copytree(ROOT / "tests" / "fixtures" / "react", tmp_path / "tests" / "fixtures" / "react")
    import os
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(here)
    assert (tmp_path / "react.db").exists()


def test_adapters_refuse_a_keyword_they_do_not_know_by_name():
    # Each would otherwise be swallowed: RaglineEmbedding(model=PATH) silently loaded the
    # default model (and offline failed with a hub error that did not name the mistake).
    from ragline import langchain as lc
    from ragline import llama_index as li

    with pytest.raises(TypeError, match="'model'.*model_name="):
        li.RaglineEmbedding(model="models/all-MiniLM-L6-v2")
    with pytest.raises(TypeError, match="'model_name'.*model="):
        lc.RaglineEmbeddings(model_name="models/all-MiniLM-L6-v2")
    with pytest.raises(Exception, match="top_k"):
        lc.RaglineRetriever(index="sqlite://unused.db", top_k=3)
    with pytest.raises(Exception, match="chunk_size"):
        li.RaglineNodeParser(chunk_size=3)
    with pytest.raises(TypeError, match="top_k"):
        li.RaglineRetriever(index="sqlite://unused.db", top_k=3)
    # What they do know still works.
    assert li.RaglineNodeParser(tokens=64).tokens == 64
    assert lc.RaglineRetriever(index="sqlite://unused.db", k=3).k == 3
