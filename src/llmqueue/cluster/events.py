"""The fleet's event kinds (:mod:`llmqueue.cluster.fleet`). Events are heap entries
``(time, kind, sequence number, a, b)``; at equal times the lower kind comes first (step ends
before the rest), all before the arrivals at that time, except ``WAKE``: an idle replica handed a
request begins its step after every arrival at that time has been routed, as a replica takes all
arrivals up to a step's start."""

REP, KV, READY, REPAIR, FAULT, TICK, SAMPLE, WINDOW, WAKE = range(9)
