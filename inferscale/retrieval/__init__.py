"""The retrieval layer: sentence embedders and the scoped FAISS vector index."""

from inferscale.retrieval.embedder import Embedder, SentenceTransformerEmbedder
from inferscale.retrieval.index import VectorIndex

__all__ = ["Embedder", "SentenceTransformerEmbedder", "VectorIndex"]
