"""Type stubs of ragline's extension module (the Rust library, in process)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

DEFAULT_MODEL: str

class RaglineError(Exception):
    """What ragline could not do: a model it cannot find or load, an index it cannot open, a
    run that could not start. The message names the problem and the fix."""

class Embedder:
    """A sentence-transformers embedding model, loaded once.

    ``model``: a hub id (looked for in ./models, $RAGLINE_MODELS and the Hugging Face cache,
    downloaded when missing) or a folder in the Hugging Face layout. ``device``: ``auto``
    (CUDA, then Metal, then the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``metal``. ``dtype``:
    ``auto`` (f32 on the CPU, f16 on a GPU), ``f32``, ``f16``, ``bf16`` or ``int8``.
    ``query_prompt``/``document_prompt`` override the model's own prompts for
    :meth:`embed_query`/:meth:`embed_documents`; ``dimensions`` cuts every vector (Matryoshka);
    ``batch_tokens``: padded tokens per forward pass (2048 on the CPU, 32768 on a GPU).
    """

    def __init__(
        self,
        model: str = ...,
        device: str = "auto",
        dtype: str = "auto",
        query_prompt: Optional[str] = None,
        document_prompt: Optional[str] = None,
        dimensions: Optional[int] = None,
        batch_tokens: Optional[int] = None,
    ) -> None: ...
    def embed(
        self,
        texts: List[str],
        prompt_name: Optional[str] = None,
        dimensions: Optional[int] = None,
        batch_tokens: Optional[int] = None,
    ) -> npt.NDArray[np.float32]:
        """One row per text (float32, shape ``(len(texts), dimension)``), as
        sentence-transformers' ``encode``: ``prompt_name`` picks one of the model's prompts
        (default: the model's ``default_prompt_name``, else none); ``dimensions`` cuts the
        vectors (re-normalised when the model normalises). Runs with the GIL released.
        Raises TypeError when a text is not a str (naming its index)."""
    def embed_query(
        self, texts: List[str], dimensions: Optional[int] = None, batch_tokens: Optional[int] = None
    ) -> npt.NDArray[np.float32]:
        """As :meth:`embed`, with the model's query prompt (``encode_query``)."""
    def embed_documents(
        self, texts: List[str], dimensions: Optional[int] = None, batch_tokens: Optional[int] = None
    ) -> npt.NDArray[np.float32]:
        """As :meth:`embed`, with the model's document prompt (``encode_document``)."""
    @property
    def dimension(self) -> int:
        """The vectors' dimension."""
    @property
    def max_tokens(self) -> int:
        """Tokens the model reads of a text (special tokens included); the rest is cut."""
    @property
    def model_id(self) -> str:
        """The model's name (its hub id, or the folder)."""
    @property
    def device(self) -> str:
        """Where the model runs (``cpu``, ``cuda:0``...)."""
    @property
    def encoder(self) -> str:
        """Which encoder and kernels run the model."""
    @property
    def prompts(self) -> Dict[str, str]:
        """The model's named prompts (config_sentence_transformers.json)."""

class Index:
    def __init__(
        self,
        uri: str = "sqlite://ragline.db",
        device: str = "auto",
        dtype: str = "auto",
        exact: bool = False,
        config: Optional[str] = None,
    ) -> None: ...
    def search(
        self, query: str, k: int = 10, mode: str = "hybrid", where: Optional[List[str]] = None
    ) -> List[Dict[str, Any]]:
        """The hits as dicts, as ``ragline search --json`` prints them."""
    def status(self) -> Dict[str, Any]:
        """``ragline status --json``, as a dict."""
    @property
    def uri(self) -> str: ...

def chunk(
    text: str, model: str = ..., tokens: int = 256, overlap: int = 32, format: str = "markdown"
) -> Tuple[List[Tuple[str, List[str], int, int, int]], str]:
    """(text, heading_path, tokens, start, end) per chunk, and the extracted text."""

def ingest(
    paths: List[str],
    index: str,
    model: Optional[str] = None,
    config: Optional[str] = None,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    options: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """``ragline ingest``: ``options`` are its flags by name (underscores for dashes), filling
    the library's typed request (an unknown one raises ``TypeError``); the run's report (what
    ``--report`` writes) as a dict."""

def cli_main(argv: List[str]) -> int:
    """The ``ragline`` command in this process; its exit code."""

def version() -> str: ...
