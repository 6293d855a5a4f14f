"""Linear projections a layer may name in place of ``nn.Linear`` (the ``linear`` kind): BitLinear."""
