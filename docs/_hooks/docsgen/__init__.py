"""Generators for the parts of the docs that are read from the code, never written twice.

The mkdocs hook (``docs/_hooks/specformer_docs.py``) calls :func:`pages.generated_pages`
at build time; the tests in ``tests/docs`` import the same functions to check what the
site says against the live registry, hookspecs and CLI.
"""
