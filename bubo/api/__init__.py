"""The HTTP layer: app.create_app(engine or registry, config.ServerConfig) is the Flask app;
serve.serve(options.ServeOptions) runs it under gevent's WSGI server with the models' engines.
The routes live in core.py, about.py, embeddings.py and one package per dialect (openai,
anthropic, llamacpp, ollama); errors.py, request.py, fields.py, pipeline.py and sse.py are what
they share. This package's own namespace is empty: import what you use from its modules."""
