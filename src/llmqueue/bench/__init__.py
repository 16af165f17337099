"""Measurement of real servers: the open-loop client, server metrics, calibration, validation.

The only package that does network I/O. Submodules: ``client`` (:func:`~llmqueue.bench.client.run_bench`,
the open-loop benchmark of an OpenAI-compatible server), and its rooms: ``options`` (every option
of a run, declared once: ``BenchOptions``), ``prompts`` (request bodies), ``http`` (the transport,
free of benchmark specifics), ``attempt`` (one attempt, its streamed answer and status),
``sender`` (the open-loop schedule, concurrency cap, retries), ``recorder`` (the records, written
as the run goes), ``sampler`` (the server's /metrics during a run), ``checks`` (the client's
checks of itself); ``prom`` (Prometheus /metrics sampling, the per-step log's lines), ``steplog``
(those lines as a run's step records), ``importers`` (other clients' measurements as run
directories), ``engine`` (a local vLLM CPU server for tests and fidelity benchmarks),
``calibrate`` (M, b and a step-time model from a run), ``validate`` (predicted against measured).
"""
