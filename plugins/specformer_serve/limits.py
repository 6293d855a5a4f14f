"""What the server allows a client, in one place: the defaults of ``specformer serve``'s limit flags.

Kept free of the HTTP stack's imports, so the command line can show them without loading it.
"""

#: The most connections open at once; requests past it are answered 503 (uvicorn's ``limit_concurrency``).
MAX_CONNECTIONS = 256
#: Seconds a client may take to send a request's line and headers (:mod:`.connections`).
HEADER_TIMEOUT = 10.0
#: Seconds a client may take to send a whole request body, once its head has arrived.
BODY_TIMEOUT = 30.0
#: Seconds an idle kept-alive connection stays open (uvicorn's ``timeout_keep_alive``).
KEEP_ALIVE = 5
#: The largest request body read (a prompt is bounded by the context anyway).
MAX_BODY_BYTES = 4 * 2**20
#: The most messages one chat request may hold.
MAX_MESSAGES = 1024
