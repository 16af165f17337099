"""The server side of the live layer: the HTTP core, OpenAI's API as vLLM speaks it, vLLM's
Prometheus metrics and log lines, and the engine emulator built on them (``llmqueue emulate``).
The gateway reuses the same pieces."""
