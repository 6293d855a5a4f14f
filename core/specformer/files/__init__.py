"""Reading and writing files people hand us, safely.

- :mod:`specformer.files.datafile`: YAML, JSON and TOML read within fixed bounds;
- :mod:`specformer.files.atomic`: a file is replaced whole or not at all;
- :mod:`specformer.files.outputs`: what a command may write (never an existing file unasked, never an input).
"""
