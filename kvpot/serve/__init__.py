"""`kvpot serve`: OpenAI's chat completions API over documents read once into the pot (docs/serve.md).
Needs the `serve` extra (Starlette, uvicorn) for kvpot.serve.app; the rest has no extra dependency."""
