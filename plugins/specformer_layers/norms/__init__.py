"""Normalisation layers."""
