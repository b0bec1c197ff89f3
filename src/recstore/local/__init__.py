"""The embedded default: the whole platform on one machine (`recstore up`)."""
