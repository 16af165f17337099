"""The ``llmqueue`` command line: thin wrappers that parse flags, call the library and print."""
