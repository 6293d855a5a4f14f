"""The parts library the built-in Hugging Face families are written in (the families themselves: ``families/``).

One module per concept, each read top to bottom: :mod:`.base` (what a part is), :mod:`.decoder`
(the family builder and ``LLAMA_PARTS``), :mod:`.embedding`, :mod:`.norms`, :mod:`.attention`,
:mod:`.positions`, :mod:`.windows`, :mod:`.feedforward`, :mod:`.multipliers` (Granite's), :mod:`.mamba2` and
:mod:`.deltanet`.
A family imports the names it uses from the module that defines them.
"""
