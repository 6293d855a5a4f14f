"""Per-layer inputs: computed once per forward from the tokens, a slice for every block (Gemma 3n, Gemma 4)."""
