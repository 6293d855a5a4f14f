"""The registry of components and the plugins that fill it.

- :mod:`specformer.registry.components`: kind -> name -> component (factory, ``Params``, plugin, paper);
- :mod:`specformer.registry.params`: the base of a component's ``Params`` and ``SubComponent``;
- :mod:`specformer.registry.hookspecs`: every hook a plugin can implement;
- :mod:`specformer.registry.discovery`: plugins found through entry points, and the registry built from them;
- :mod:`specformer.registry.schema`: the JSON Schema of a whole spec.

Importing it does not import torch: a component's factory may be registered by path and
is imported when first built.
"""
