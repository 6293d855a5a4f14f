"""MoE routers: the ``router`` kind, which decides the experts each token goes to and their weights."""
