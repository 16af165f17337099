"""Measurement of real servers: the open-loop client, server metrics, calibration, validation.

The only package that does network I/O. Submodules: ``client`` (open-loop benchmark of an
OpenAI-compatible server), ``prom`` (Prometheus /metrics sampling, the per-step log's lines),
``steplog`` (those lines as a run's step records), ``engine`` (a local vLLM CPU server for tests
and fidelity benchmarks), ``calibrate`` (M, b and a step-time model from a run), ``validate``
(predicted against measured).
"""
