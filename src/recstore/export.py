"""``recstore.export``: save a model with RecStore embeddings for serving, and load it back."""

from recstore.client.export import ServedModel, load, save

__all__ = ["ServedModel", "load", "save"]
