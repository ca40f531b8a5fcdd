"""prism_jax.serve: the HTTP server (System One API, OpenAI completions, health, metrics).

    python -m prism_jax.serve --model default --port 8000

`create_app(engine, config)` builds the FastAPI app around any object with the Engine's
`decide_many`/`stats` interface; `cli.main` loads a model and runs it under uvicorn.
"""
