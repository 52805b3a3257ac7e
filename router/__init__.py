"""pdserve router: OpenAI-compatible HTTP front end, global prefix index, worker selection.

The router never imports torch (nor transformers): tokenization uses `tokenizers` + jinja2, and from
`common` it uses only torch-free modules (tests/unit/test_import_contracts.py checks both).
Entry points: `python -m router --model PATH ...` (see router/__main__.py) and, in-process,
`router.server.build_router(RouterConfig(...)) -> (app, router)`.

It talks to the workers with the messages of `common/wire/messages.py`; the protocol (sockets,
registration, requests, cache events) is written out in docs/protocol.md.
"""
